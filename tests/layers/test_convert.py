"""convert(model, gate) and GlobalGatedPool: small models of torch's modules only (no torchvision, no timm).

The geometry must be the old pool's exactly (checked on the new layer's attributes and against torch's
own functional pools and an explicit softmax written here), ``gate="max"/"avg"`` must give back torch's
own modules with the outputs of the model before, the channels come from the dry forward, and nothing is
changed when an argument is wrong. The models of torchvision and timm: tests/vision.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gatepool
from gatepool.layers import (
    AttentionGatePool2d,
    GlobalGatedPool1d,
    GlobalGatedPool2d,
    GlobalGatedPool3d,
    SoftPool1d,
    SoftPool2d,
    SoftPool3d,
)
from gatepool.layers.adaptive_pool import AdaptiveGatedPool2d
from gatepool.layers.convert import POOLS, Replaced, convert


def _net(pool=None, head=None) -> nn.Sequential:
    """conv 3→8, a pool, conv 8→16, an avg pool (ceil_mode, padding not counted), a global pool, linear."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        pool if pool is not None else nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
        head if head is not None else nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 5),
    )


X = torch.randn(2, 3, 15, 15)

GEOMETRIES = [  # (type, kwargs of torch's module)
    (nn.MaxPool2d, dict(kernel_size=3, stride=2, padding=1)),
    (nn.MaxPool2d, dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), dilation=(2, 1), ceil_mode=True)),
    (nn.MaxPool1d, dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
    (nn.MaxPool3d, dict(kernel_size=2, stride=1, padding=1, dilation=2)),
    (nn.AvgPool2d, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    (nn.AvgPool2d, dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 1))),
    (nn.AvgPool1d, dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    (nn.AvgPool3d, dict(kernel_size=(1, 2, 2), stride=(1, 2, 1), ceil_mode=True)),
]
SOFT = {1: SoftPool1d, 2: SoftPool2d, 3: SoftPool3d}
INPUT = {1: (2, 3, 11), 2: (2, 3, 9, 10), 3: (2, 3, 5, 6, 7)}
DIM = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3, nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3}
MAX_FN = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_FN = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _tuple(v, d):
    return (v,) * d if isinstance(v, int) else tuple(v)


def _soft_ref(x, kernel_size, stride, padding, dilation, ceil_mode, tau=1.0):
    """Σ softmax(v/τ) v per window, written out: −inf padding, F.unfold-free (explicit loops over taps)."""
    d = x.dim() - 2
    k, s, p, dl = (_tuple(v, d) for v in (kernel_size, stride, padding, dilation))
    out_size = MAX_FN[d](x, k, s, p, dl, ceil_mode=ceil_mode).shape[2:]  # torch decides the windows
    big = [max((o - 1) * si + dli * (ki - 1) + 1, n + pi) + pi
           for o, si, dli, ki, n, pi in zip(out_size, s, dl, k, x.shape[2:], p)]
    xp = torch.full((*x.shape[:2], *big), float("-inf"), dtype=x.dtype)
    xp[(slice(None), slice(None), *(slice(pi, pi + n) for pi, n in zip(p, x.shape[2:])))] = x
    taps = []
    for offset in torch.cartesian_prod(*[torch.arange(ki) for ki in k]).reshape(-1, d).tolist():
        sl = tuple(slice(oi * dli, oi * dli + (o - 1) * si + 1, si)
                   for oi, dli, o, si in zip(offset, dl, out_size, s))
        taps.append(xp[(slice(None), slice(None), *sl)])
    v = torch.stack(taps, -1)  # (N, C, *out, K)
    g = torch.softmax(v / tau, -1)
    return (g * v.masked_fill(v.isinf(), 0.0)).sum(-1)


# --------------------------------------------------------------------------------------------------
# Geometry


@pytest.mark.parametrize("pool_type,kwargs", GEOMETRIES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_geometry_copied_exactly(pool_type, kwargs):
    d = DIM[pool_type]
    old = pool_type(**kwargs)
    net = nn.Sequential(nn.Identity(), old)
    _, replaced = convert(net, "soft")
    new = net[1]
    assert type(new) is SOFT[d] and [r.name for r in replaced] == ["1"] and replaced[0].new is new
    assert replaced[0].old_type is pool_type and replaced[0].old == repr(old)
    assert new.kernel_size == _tuple(old.kernel_size, d)
    assert new.stride == _tuple(old.stride, d)
    assert new.padding == _tuple(old.padding, d)
    assert new.dilation == _tuple(getattr(old, "dilation", 1), d)
    assert new.ceil_mode == old.ceil_mode
    x = torch.randn(INPUT[d], dtype=torch.float64)
    want = _soft_ref(x, old.kernel_size, old.stride, old.padding, getattr(old, "dilation", 1), old.ceil_mode)
    assert old(x).shape == want.shape  # the windows are torch's
    torch.testing.assert_close(new(x), want)


@pytest.mark.parametrize("pool_type,kwargs", GEOMETRIES, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("gate", ["max", "avg"])
def test_max_and_avg_pool_as_torch(pool_type, kwargs, gate):
    """A pool converted to its own gate is torch's module again; to the other, torch's functional pool."""
    d = DIM[pool_type]
    old = pool_type(**kwargs)
    x = torch.randn(INPUT[d])
    model, _ = convert(copy.deepcopy(old), gate)
    k, s, p = old.kernel_size, old.stride, old.padding
    dl = getattr(old, "dilation", 1)
    if gate == "max":
        want = MAX_FN[d](x, k, s, p, dl, ceil_mode=old.ceil_mode)
    else:
        cip = getattr(old, "count_include_pad", True)  # from a max pool: torch's default
        if _tuple(dl, d) == (1,) * d:
            want = AVG_FN[d](x, k, s, p, ceil_mode=old.ceil_mode, count_include_pad=cip)
        else:  # torch has no dilated average pool: GatedPool's, tested against a reference elsewhere
            assert type(model).__name__ == f"GatedPool{d}d" and model.gate == "avg"
            assert model.dilation == _tuple(dl, d)
            return
    torch_type = {"max": (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d), "avg": (nn.AvgPool1d, nn.AvgPool2d,
                                                                           nn.AvgPool3d)}[gate][d - 1]
    assert type(model) is torch_type and model is not old  # torch's own module, a new one
    if type(old) is torch_type:
        assert torch.equal(model(x), old(x))
    assert torch.equal(model(x), want)


def test_max_and_avg_give_the_same_model_back():
    net = _net()
    ref = copy.deepcopy(net).eval()
    x = torch.randn(3, 3, 15, 15)
    for gate in ("max", "avg"):
        model, replaced = convert(net, gate, include=(nn.MaxPool2d,) if gate == "max" else (nn.AvgPool2d,))
        assert model is net and len(replaced) == 1
    assert [type(m) for m in net] == [type(m) for m in ref]
    assert net[5].ceil_mode and not net[5].count_include_pad and net[5].padding == 1
    assert torch.equal(net.eval()(x), ref(x))


def test_divisor_override_and_return_indices():
    avg = nn.AvgPool2d(3, 2, 1, divisor_override=5)
    new, _ = convert(copy.deepcopy(avg), "avg")
    x = torch.randn(1, 2, 7, 7)
    assert new.divisor_override == 5 and torch.equal(new(x), avg(x))
    with pytest.raises(ValueError, match="divisor_override=5, which only gate='avg'"):
        convert(avg, "soft")
    mp = nn.MaxPool2d(2, return_indices=True)
    new, _ = convert(mp, "max")
    assert new.return_indices and torch.equal(new(x)[1], mp(x)[1])
    with pytest.raises(ValueError, match="returns indices .* gate='soft' cannot replace it"):
        convert(nn.Sequential(mp), "soft")


def test_temperature_reaches_every_new_layer():
    net = _net()
    convert(net, "soft", temperature=0.25, global_pool="soft")
    assert net[3].fixed_temperature == 0.25 and net[5].fixed_temperature == 0.25
    assert net[6].fixed_temperature == 0.25
    net = _net()  # a gate without a temperature keeps torch's own pool; the global soft pool takes it
    convert(net, "max", temperature=0.5, global_pool="soft")
    assert type(net[3]) is nn.MaxPool2d and net[6].fixed_temperature == 0.5


def test_count_include_pad_for_avg():
    pool = nn.MaxPool2d(3, 2, 1)
    new, _ = convert(copy.deepcopy(pool), "avg", count_include_pad=False)
    x = torch.randn(1, 2, 6, 6)
    assert torch.equal(new(x), F.avg_pool2d(x, 3, 2, 1, count_include_pad=False))


# --------------------------------------------------------------------------------------------------
# Channels: the dry forward


@pytest.mark.parametrize("gate", ["soft-learned", "attention", "conv"])
def test_channels_from_the_dry_forward(gate):
    net = _net()
    model, replaced = convert(net, gate, global_pool="attention", example_input=X)
    assert [(r.name, r.new.channels) for r in replaced] == [("3", 8), ("5", 16), ("6", 16)]
    assert isinstance(net[6], GlobalGatedPool2d) and net[6].gate == "attention"
    assert net(X).shape == (2, 5)


def test_dry_forward_leaves_the_model_as_it_was():
    net = _net()
    net[1].momentum = 0.5
    net.train()
    net[0].eval()  # a mixed set of modes comes back as it was
    before = copy.deepcopy(net[1].state_dict())
    convert(net, "attention", example_input=X)
    assert all(torch.equal(v, before[k]) for k, v in net[1].state_dict().items())  # running stats kept
    assert [m.training for m in net] == [False] + [True] * (len(net) - 1)
    assert net[3].training and all(p.grad is None for p in net.parameters())


def test_example_input_as_args_and_kwargs():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = nn.MaxPool2d(2)

        def forward(self, a, b=None):
            return self.pool(torch.cat([a, b], 1))

    for example in ((X, X), {"a": X, "b": X}):
        m = Two()
        convert(m, "attention", example_input=example)
        assert m.pool.channels == 6


def test_example_input_missing_is_an_error_that_changes_nothing():
    net = _net()
    modules = list(net)
    with pytest.raises(ValueError, match="pass example_input=.*pools '3', '5'"):
        convert(net, "attention")
    assert list(net) == modules  # the same objects: nothing replaced
    with pytest.raises(ValueError, match="example_input"):
        convert(net, "soft", global_pool="soft-learned")
    assert list(net) == modules
    convert(net, "soft", global_pool="soft")  # no weights, no example needed


def test_bad_layer_found_before_the_dry_forward_and_nothing_replaced():
    net = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(3, 3, 1), nn.MaxPool2d(2, return_indices=True))
    calls = []
    net.register_forward_pre_hook(lambda m, args: calls.append(1))
    with pytest.raises(ValueError, match="temperature"):
        convert(net, "attention", temperature=-1.0, example_input=X)
    with pytest.raises(ValueError, match="'2' .* returns indices"):
        convert(net, "soft-learned", example_input=X)
    assert calls == [] and type(net[0]) is nn.MaxPool2d  # no forward, and the first pool is still there


def test_pool_not_reached_or_at_two_widths():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.MaxPool2d(2), nn.MaxPool2d(2)

        def forward(self, x):
            return self.used(x)

    m = Branchy()
    with pytest.raises(ValueError, match="'unused' .* was not called in the forward of example_input"):
        convert(m, "soft-learned", example_input=X)
    assert type(m.used) is nn.MaxPool2d
    pool = nn.MaxPool2d(2)
    shared = nn.Sequential(pool, nn.Conv2d(3, 4, 1), pool)
    with pytest.raises(ValueError, match=r"called on inputs of \[3, 4\] channels"):
        convert(shared, "attention", example_input=X)
    convert(shared, "soft")  # no weights: one shared pool is fine
    assert shared[0] is shared[2] and type(shared[0]) is SoftPool2d


def test_a_shared_pool_stays_shared():
    pool = nn.MaxPool2d(2)
    net = nn.Sequential(pool, nn.Conv2d(3, 3, 1), pool)
    net.alias = pool
    _, replaced = convert(net, "attention", example_input=X)
    assert [r.name for r in replaced] == ["0", "2", "alias"]
    assert net[0] is net[2] is net.alias and isinstance(net[0], AttentionGatePool2d)
    assert len(list(net.parameters())) == 2 + 2  # conv weight and bias, the gate's score and value


def test_dtype_and_mode_of_the_new_layers():
    net = _net().double().eval()
    convert(net, "attention", global_pool="soft-learned", example_input=X.double())
    assert net[3].score.weight.dtype == torch.float64 and net[6].log_temperature.dtype == torch.float64
    assert not net[3].training and not net[6].training
    assert net(X.double()).dtype == torch.float64


def test_the_model_itself_a_pool():
    old = nn.MaxPool2d(3, 2, 1)
    new, replaced = convert(old, "soft")
    assert type(new) is SoftPool2d and new is not old and replaced[0].name == ""
    new, _ = convert(nn.AdaptiveAvgPool2d((1, 1)), "max", include=(), global_pool="soft")
    assert isinstance(new, GlobalGatedPool2d)


# --------------------------------------------------------------------------------------------------
# What is matched, what is not


def test_only_global_average_pools_are_global():
    net = nn.Sequential(nn.AdaptiveAvgPool2d((2, 2)), nn.AdaptiveAvgPool2d((1, None)),
                        nn.AdaptiveMaxPool2d(1), nn.AdaptiveAvgPool2d(1), nn.AdaptiveAvgPool1d(1),
                        nn.AdaptiveAvgPool3d((1, 1, 1)))
    _, replaced = convert(net, "soft", include=POOLS, global_pool="avg")
    assert [r.name for r in replaced] == ["3", "4", "5"]
    assert [type(net[i]) for i in (3, 4, 5)] == [GlobalGatedPool2d, GlobalGatedPool1d, GlobalGatedPool3d]
    assert type(net[0]) is nn.AdaptiveAvgPool2d and type(net[2]) is nn.AdaptiveMaxPool2d
    _, replaced = convert(net, "soft")  # the default include: the adaptive pools to a size other than 1
    assert [(r.name, r.role) for r in replaced] == [("0", "adaptive"), ("1", "adaptive")]
    assert type(net[0]) is AdaptiveGatedPool2d and net[1].output_size == (1, None)


def test_global_pool_none_leaves_the_head():
    net = _net()
    _, replaced = convert(net, "soft")
    assert [r.name for r in replaced] == ["3", "5"] and type(net[6]) is nn.AdaptiveAvgPool2d


def test_include_restricts():
    net = _net()
    _, replaced = convert(net, "soft", include=(nn.AvgPool2d,))
    assert [r.name for r in replaced] == ["5"] and type(net[3]) is nn.MaxPool2d
    _, replaced = convert(_net(), "soft", include=nn.MaxPool2d)  # one class alone
    assert [r.name for r in replaced] == ["3"]


def test_nothing_matched_warns():
    net = nn.Sequential(nn.Conv2d(3, 3, 1))
    with pytest.warns(UserWarning, match="convert found nothing to replace in Sequential"):
        model, replaced = convert(net, "soft")
    assert model is net and replaced == []
    with pytest.warns(UserWarning, match="nothing to replace"):
        convert(_net(), "soft", include=())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(_net(), "soft")  # something matched: no warning


def test_a_subclass_has_its_forward_rewritten():
    """A subclass may pool otherwise than its attributes say (timm's MaxPool2dSame pads first): it is not
    matched as its base class; its forward is rewritten, so its own padding stays and its pool is a gate."""

    class SamePad(nn.MaxPool2d):
        def forward(self, x):
            return super().forward(F.pad(x, (1, 1, 1, 1), value=-1.0))

    net = nn.Sequential(SamePad(3, 1), nn.MaxPool2d(2))
    x = torch.randn(1, 2, 6, 6)
    _, replaced = convert(net, "soft")
    assert [(r.name, r.source) for r in replaced] == [("0.max_pool2d", "function"), ("1", "module")]
    assert isinstance(net[0], SamePad) and type(net[0].max_pool2d) is SoftPool2d
    torch.testing.assert_close(net[0](x), SoftPool2d(3, 1)(F.pad(x, (1, 1, 1, 1), value=-1.0)))


def test_replaced_record():
    _, replaced = convert(_net(), "soft")
    r = replaced[0]
    assert isinstance(r, Replaced) and r.old.startswith("MaxPool2d(kernel_size=3")
    assert "'3'" in repr(r) and "SoftPool2d" in repr(r)
    with pytest.raises(AttributeError):
        r.name = "x"  # frozen


def test_top_level_name_and_pools():
    assert gatepool.convert is convert
    assert set(POOLS) == {nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d}


# --------------------------------------------------------------------------------------------------
# Errors: named arguments, allowed values, nothing changed


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(gate="softmax"), ValueError, r"gate='softmax' is unknown; choose one of \['max', 'avg'"),
        (dict(gate=None), TypeError, "gate must be a str"),
        (dict(gate="soft", include=(nn.AdaptiveMaxPool2d,)), ValueError,
         r"include may hold .*nn.MaxPool2d.* only \(global average pools: pass global_pool= / squeeze_pool"),
        (dict(gate="soft", squeeze_pool="conv"), ValueError, "squeeze_pool='conv' is not a global"),
        (dict(gate="soft", include=(nn.Conv2d,)), ValueError, "include may hold .* got Conv2d"),
        (dict(gate="soft", include="max"), TypeError, "include must be a tuple of pool classes"),
        (dict(gate="soft", include=(2,)), TypeError, "include must hold classes"),
        (dict(gate="soft", global_pool="conv"), ValueError, "global_pool='conv' is not a global .*weighs"),
        (dict(gate="soft", global_pool="mean"), ValueError, r"choose None or one of \['max', 'avg', 'soft'"),
        (dict(gate="soft", global_pool=True), TypeError, "global_pool must be None or a str"),
        (dict(gate="soft", return_weights=True), TypeError, r"unexpected keyword .*\['return_weights'\]"),
        (dict(gate="soft", channels=8), TypeError, "channels are found by convert"),
        (dict(gate="soft", count_include_pad=False), ValueError, "count_include_pad applies to gate='avg'"),
        (dict(gate="max", temperature=0.5), ValueError, "temperature applies to the gates"),
        (dict(gate="soft", temperature=-1.0), ValueError, "temperature"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    net = _net()
    modules = list(net)
    with pytest.raises(error, match=match):
        convert(net, **kwargs)
    assert list(net) == modules


def test_model_not_a_module():
    with pytest.raises(TypeError, match="model must be an nn.Module, got function"):
        convert(lambda x: x, "soft")


# --------------------------------------------------------------------------------------------------
# Training, state_dict


def test_training_step():
    net = _net()
    convert(net, "attention", global_pool="soft-learned", example_input=X)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    loss = F.cross_entropy(net(X), torch.tensor([1, 3]))
    loss.backward()
    gate_params = [*net[3].parameters(), *net[5].parameters(), *net[6].parameters()]
    assert len(gate_params) == 5 and all(p.grad is not None and p.grad.isfinite().all() for p in gate_params)
    assert all(p.grad.abs().sum() > 0 for p in gate_params)
    opt.step()
    after = net.state_dict()
    for key in ("3.score.weight", "5.value.weight", "6.log_temperature"):
        assert not torch.equal(after[key], before[key])


def test_state_dict_round_trip():
    def fresh():
        net = _net()
        convert(net, "attention", global_pool="attention", example_input=X)
        return net

    a = fresh()
    with torch.no_grad():
        for p in a.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # differ from a fresh init everywhere
    b = fresh()
    assert {k for k in a.state_dict()} >= {"3.score.weight", "6.value.weight"}
    assert not torch.equal(a.eval()(X), b.eval()(X))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(X), b(X))


# --------------------------------------------------------------------------------------------------
# GlobalGatedPool


def _global_ref(x, gate, tau=1.0, score=None, value=None):
    """``(N, C, *spatial) -> (N, C)``: the gate over the flattened map, written out."""
    v = x.flatten(2)  # (N, C, L)
    if gate == "max":
        return v.amax(-1)
    if gate == "avg":
        return v.mean(-1)
    if gate == "attention":
        s = torch.einsum("c,ncl->nl", score.flatten(), v)[:, None]  # (N, 1, L)
        v = torch.einsum("dc,ncl->ndl", value.flatten(1), v)
        return (torch.softmax(s / tau, -1) * v).sum(-1)
    tau = tau.view(1, -1, 1) if isinstance(tau, torch.Tensor) else tau
    return (torch.softmax(v / tau, -1) * v).sum(-1)


@pytest.mark.usefixtures("pool_path")
@pytest.mark.parametrize("gate", ["max", "avg", "soft", "soft-learned", "attention"])
@pytest.mark.parametrize("cls,shape", [(GlobalGatedPool1d, (3, 4, 9)), (GlobalGatedPool2d, (3, 4, 5, 6)),
                                       (GlobalGatedPool3d, (2, 4, 3, 2, 3))])
def test_global_pool_values(gate, cls, shape):
    torch.manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    tau = 0.7 if gate in ("soft", "attention") else 1.0
    pool = cls(gate, channels=4 if gate in ("soft-learned", "attention") else None, temperature=tau).double()
    if gate == "soft-learned":
        with torch.no_grad():
            pool.log_temperature.copy_(torch.tensor([0.1, -0.3, 0.5, 0.0]))
        tau = pool.temperature
    kw = dict(score=pool.score.weight, value=pool.value.weight) if gate == "attention" else {}
    out = pool(x)
    assert out.shape == (*shape[:2], *([1] * cls.dim))
    want = _global_ref(x, gate, tau, **kw)
    torch.testing.assert_close(out.flatten(1), want)
    g = torch.randn_like(want)
    params = [x, *pool.parameters()]
    torch.testing.assert_close(torch.autograd.grad(out.flatten(1), params, g),
                               torch.autograd.grad(want, params, g))
    unbatched = cls(gate, channels=pool.channels, temperature=pool.fixed_temperature, flatten=True).double()
    unbatched.load_state_dict(pool.state_dict())
    torch.testing.assert_close(unbatched(x[0]), want[0])  # (C, *spatial) -> (C,) with flatten


def test_global_pool_equals_torch_for_avg_and_max():
    x = torch.randn(2, 3, 5, 7)
    assert torch.equal(GlobalGatedPool2d("avg")(x), F.adaptive_avg_pool2d(x, 1))
    assert torch.equal(GlobalGatedPool2d("max")(x), F.adaptive_max_pool2d(x, 1))
    assert GlobalGatedPool2d("soft", flatten=True)(x).shape == (2, 3)
    assert GlobalGatedPool2d("soft")(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_global_pool_errors():
    with pytest.raises(ValueError, match="gate='conv' has no global form .*choose one of"):
        GlobalGatedPool2d("conv")
    with pytest.raises(ValueError, match="gate='attention' has weights: pass channels=C"):
        GlobalGatedPool2d("attention")
    with pytest.raises(ValueError, match="gate='max' has no temperature"):
        GlobalGatedPool2d("max", temperature=2.0)
    with pytest.raises(ValueError, match="channels must be an integer >= 1 or None"):
        GlobalGatedPool2d("soft", channels=0)
    with pytest.raises(ValueError, match="input has 3 channels; this pool was built for channels=4"):
        GlobalGatedPool2d("soft-learned", channels=4)(torch.randn(1, 3, 2, 2))
    with pytest.raises(ValueError, match=r"input must be 4-D \(N, C, \*spatial\) or 3-D"):
        GlobalGatedPool2d("soft")(torch.randn(3, 3))
    assert "gate='soft-learned', channels=4" in repr(GlobalGatedPool2d("soft-learned", channels=4))


def test_convert_again_is_idempotent_and_starts_from_the_first_pools():
    net = _net()
    convert(net, "soft", global_pool="soft-learned", example_input=X)
    state = copy.deepcopy(net.state_dict())
    modules = list(net)
    _, replaced = convert(net, "soft", global_pool="soft-learned", example_input=X)
    assert replaced == [] and list(net) == modules  # the same objects, the same weights
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())
    _, replaced = convert(net, "attention", global_pool="soft-learned", example_input=X)  # the windows only
    assert [(r.name, r.old_type) for r in replaced] == [("3", nn.MaxPool2d), ("5", nn.AvgPool2d)]
    assert net[6] is modules[6] and isinstance(net[3], AttentionGatePool2d)
    assert net[5].ceil_mode and net[5].padding == (1, 1)  # the first pool's geometry


def test_max_and_avg_on_a_converted_model_bring_back_torchs_pools():
    ref = _net().eval()
    net = _net()
    convert(net, "soft", global_pool="attention", example_input=X)
    convert(net, "max", include=(nn.MaxPool2d,), global_pool="avg")
    convert(net, "avg", include=(nn.AvgPool2d,))
    assert [type(m) for m in net] == [type(m) for m in ref] and repr(net) == repr(ref)
    assert torch.equal(net.eval()(X), ref(X))
    assert not any(isinstance(m, (GlobalGatedPool2d, SoftPool2d)) for m in net.modules())


@pytest.mark.parametrize("learned", [False, True])
def test_the_one_window_formula_off_the_cpu_is_the_fused_pool(learned):
    """Off the CPU a global pool takes one softmax over its taps (the windowed GPU kernel would unroll
    thousands of them); on the CPU it runs the fused kernel: both the same, values and gradients."""
    from gatepool.layers.global_pool import one_window

    torch.manual_seed(0)
    pool = GlobalGatedPool2d("soft-learned" if learned else "soft", channels=6)
    x = torch.randn(3, 6, 9, 9, dtype=torch.float64, requires_grad=True)
    tau = pool.temperature if learned else 1.0
    tau = tau.double() if isinstance(tau, torch.Tensor) else tau
    ours = one_window(x.flatten(2), None, tau).view(3, 6, 1, 1)
    fused = pool.double()(x)
    torch.testing.assert_close(ours, fused)
    g1, g2 = torch.autograd.grad(ours.sum(), x)[0], torch.autograd.grad(fused.sum(), x)[0]
    torch.testing.assert_close(g1, g2)
    scores = torch.randn(3, 1, 81, dtype=torch.float64)
    v = x.detach().flatten(2)
    expected = (torch.softmax(scores, -1) * v).sum(-1, keepdim=True)
    torch.testing.assert_close(one_window(v, scores, 1.0), expected)
