"""convert() on real models: torchvision's and timm's, random weights (no download), small inputs.

For every model: the pools found are the ones the model has (by name), the output shape is unchanged,
a training step runs with finite gradients that reach the gates, a state_dict loads into a freshly
converted copy (another seed) and gives the same outputs, and ``torch.compile`` runs the converted model.
Needs torchvision / timm (``make test-vision``); without them every test here is skipped.
The cheap tests of convert (torch's modules only): tests/layers/test_convert.py.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool import convert
from gatepool.layers import GatedPoolNd, GlobalGatedPool2d
from gatepool.layers.global_pool import GlobalGatedPoolNd


def _tv(name: str, **kwargs):
    models = pytest.importorskip("torchvision.models")
    return lambda: getattr(models, name)(weights=None, **kwargs)


def _timm(name: str):
    timm = pytest.importorskip("timm")
    return lambda: timm.create_model(name, pretrained=False)


@dataclass
class Case:
    make: str  # "tv:resnet18" or "timm:resnet18d"
    gate: str
    global_pool: str | None
    size: int  # input (2, 3, size, size)
    names: list[str]  # some of the names convert must replace
    count: int  # how many it replaces
    kwargs: dict = field(default_factory=dict)
    squeeze_pool: str | None = None

    def build(self, seed: int = 0) -> nn.Module:
        lib, name = self.make.split(":")
        factory = _tv(name, **self.kwargs) if lib == "tv" else _timm(name)
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # init warnings of the libraries, not ours
            return factory()

    def input(self) -> torch.Tensor:
        return torch.randn(2, 3, self.size, self.size, generator=torch.Generator().manual_seed(7))

    def converted(self, seed: int = 0):
        model = self.build(seed)
        return convert(model, self.gate, global_pool=self.global_pool, squeeze_pool=self.squeeze_pool,
                       example_input=self.input())


CASES = {
    "tv-resnet18": Case("tv:resnet18", "attention", "soft-learned", 64, ["maxpool", "avgpool"], 2),
    # its avgpool is AdaptiveAvgPool2d((7, 7)): an adaptive pool, AdaptiveGatedPool2d
    "tv-vgg11_bn": Case("tv:vgg11_bn", "soft-learned", "soft", 32, ["features.3", "features.28", "avgpool"],
                        6),
    # its global pool is F.adaptive_avg_pool2d in forward: rewritten by fx into the child adaptive_avg_pool2d
    "tv-densenet121": Case("tv:densenet121", "attention", "soft", 48,
                           ["features.pool0", "features.transition1.pool", "features.transition3.pool",
                            "adaptive_avg_pool2d"], 5),
    "tv-googlenet": Case("tv:googlenet", "soft", "attention", 48,
                         ["maxpool1", "inception3a.branch4.0", "maxpool4", "avgpool"], 14,
                         dict(aux_logits=False, init_weights=True)),
    # no windowed pool; 9 squeeze-and-excitation squeezes (squeeze_pool=) and the head's global pool
    "tv-mobilenet_v3_small": Case("tv:mobilenet_v3_small", "soft", "soft-learned", 48,
                                  ["features.1.block.1.avgpool", "avgpool"], 10,
                                  squeeze_pool="soft-learned"),
    "timm-resnet18": Case("timm:resnet18", "attention", "attention", 64, ["maxpool", "global_pool.pool"], 2),
    # AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False) in layer2-4's downsample
    "timm-resnet18d": Case("timm:resnet18d", "soft-learned", "soft", 64,
                           ["maxpool", "layer2.0.downsample.0", "layer4.0.downsample.0", "global_pool.pool"],
                           5),
}
SLOW = {"tv-vgg11_bn", "tv-densenet121", "tv-googlenet"}  # seconds each, not a fraction of one
PARAMS = [pytest.param(c, id=k, marks=[pytest.mark.slow] if k in SLOW else []) for k, c in CASES.items()]


def _gate_params(model: nn.Module) -> list[nn.Parameter]:
    gates = [m for m in model.modules() if isinstance(m, (GatedPoolNd, GlobalGatedPoolNd))]
    return [p for m in gates for p in m.parameters()]


@pytest.mark.parametrize("case", PARAMS)
def test_convert_keeps_the_output_and_trains(case):
    model = case.build()
    x = case.input()
    with torch.no_grad():
        shape = model.eval()(x).shape
    model.train()
    model, replaced = convert(model, case.gate, global_pool=case.global_pool, squeeze_pool=case.squeeze_pool,
                              example_input=x)
    names = [r.name for r in replaced]
    assert len(names) == case.count and set(case.names) <= set(names), names
    for r in replaced:
        assert model.get_submodule(r.name) is r.new and r.new.training
        assert not isinstance(r.new, (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d))
    gates = _gate_params(model)
    assert gates  # every case has a gate with weights somewhere

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = [p.detach().clone() for p in gates]
    out = model(x)
    assert out.shape == shape and out.isfinite().all()
    F.cross_entropy(out, torch.tensor([3, 5])).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.isfinite().all() for g in grads)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in gates)  # the gates learn
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(gates, before))
    with torch.no_grad():
        assert model(x).isfinite().all()


@pytest.mark.parametrize("case", PARAMS)
def test_state_dict_round_trip(case):
    a, _ = case.converted(seed=0)
    b, _ = case.converted(seed=1)  # another init everywhere, the gates included
    x = case.input()
    a.eval(), b.eval()
    with torch.no_grad():
        assert not torch.allclose(a(x), b(x), rtol=1e-3, atol=0)  # (mobilenet's logits are ~1e-10)
        b.load_state_dict(a.state_dict())  # strict: the same keys, the same shapes
        torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)


@pytest.mark.parametrize("case", PARAMS)
def test_torch_compile_runs(case):
    model, _ = case.converted()
    model.eval()
    x = case.input()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_torch_compile_trains_through_the_gates():
    """aot_eager traces the backward too (the fused kernel's op included): the gradients of eager mode."""
    case = CASES["timm-resnet18"]
    model, _ = case.converted()
    x = case.input()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    gates = _gate_params(model)
    g_compiled = torch.autograd.grad(compiled(x).square().mean(), gates)
    g_eager = torch.autograd.grad(model(x).square().mean(), gates)
    torch.testing.assert_close(g_compiled, g_eager)


def test_resnet18d_avg_downsample_geometry():
    """timm's resnet18d downsamples by AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)."""
    case = CASES["timm-resnet18d"]
    model = case.build()
    old = model.layer2[0].downsample[0]
    assert type(old) is nn.AvgPool2d and old.ceil_mode and not old.count_include_pad
    convert(model, "soft")
    new = model.layer2[0].downsample[0]
    assert (new.kernel_size, new.stride, new.padding, new.ceil_mode) == ((2, 2), (2, 2), (0, 0), True)
    stem = model.maxpool
    assert (stem.kernel_size, stem.stride, stem.padding) == ((3, 3), (2, 2), (1, 1))
    with torch.no_grad():  # an odd map: ceil_mode keeps the last half window
        assert new(torch.randn(1, 2, 7, 7)).shape == old(torch.randn(1, 2, 7, 7)).shape == (1, 2, 4, 4)


def test_googlenet_ceil_mode_copied():
    models = pytest.importorskip("torchvision.models")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = models.googlenet(weights=None, aux_logits=False, init_weights=False)
    old = {n: m for n, m in model.named_modules() if isinstance(m, nn.MaxPool2d)}
    _, replaced = convert(model, "soft")
    assert len(replaced) == len(old) == 13
    for r in replaced:
        o = old[r.name]
        assert r.new.ceil_mode == o.ceil_mode is True
        assert r.new.stride == (o.stride,) * 2 and r.new.padding == (o.padding,) * 2


def test_timm_select_adaptive_pool():
    """timm's SelectAdaptivePool2d: 'avg' holds nn.AdaptiveAvgPool2d(1); 'fast' averages (and flattens)
    in its own pool, replaced by GlobalGatedPool2d(flatten=...); an NHWC pool is left alone."""
    timm = pytest.importorskip("timm")
    from timm.layers import SelectAdaptivePool2d

    x = torch.randn(2, 6, 5, 4)
    for pool_type, flatten in [("avg", True), ("fast", True), ("fast", False), ("fastavg", True)]:
        head = SelectAdaptivePool2d(pool_type=pool_type, flatten=flatten)
        want = head(x)
        model, replaced = convert(nn.Sequential(head), "max", include=(), global_pool="avg")
        assert [r.name for r in replaced] == ["0.pool"] and isinstance(head.pool, GlobalGatedPool2d)
        assert torch.equal(model(x), want)  # the avg gate is the pool it replaces
    head = SelectAdaptivePool2d(pool_type="fast", flatten=True)
    model, replaced = convert(nn.Sequential(nn.Conv2d(6, 6, 1), head), "soft", global_pool="soft-learned",
                              example_input=x)
    assert [r.name for r in replaced] == ["1.pool"] and head.pool.channels == 6 and model(x).shape == (2, 6)
    nhwc = SelectAdaptivePool2d(pool_type="fast", flatten=True, input_fmt="NHWC")
    with pytest.warns(UserWarning, match="nothing to replace"):
        convert(nn.Sequential(nhwc), "soft", global_pool="soft")
    for pool_type in ("max", "fastmax", "avgmax"):
        with pytest.warns(UserWarning, match="nothing to replace"):
            convert(nn.Sequential(SelectAdaptivePool2d(pool_type=pool_type)), "soft", global_pool="soft")
    assert timm.__version__
