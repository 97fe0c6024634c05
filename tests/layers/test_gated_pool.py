"""GatedPool1d/2d/3d and create_pool: every gate against torch or an explicit computation written here."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers import (
    GATES,
    AttentionGatePool1d,
    AttentionGatePool2d,
    GatedPool1d,
    GatedPool2d,
    GatedPool3d,
    SoftPool1d,
    SoftPool2d,
    c_kernels,
    create_pool,
    fused_pool,
    soft_pool2d,
)
from gatepool.layers.gated_pool import GatedPoolNd
from gatepool.layers.windows import pool_geometry

MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
POOL = {1: GatedPool1d, 2: GatedPool2d, 3: GatedPool3d}
TORCH_MAX = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
TORCH_AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
CASES = [  # (kernel, stride, padding, ceil_mode)
    (2, None, 0, False),
    (3, 2, 1, False),
    (3, 2, 1, True),
    (2, 3, 1, True),
]

pytestmark = pytest.mark.usefixtures("pool_path")  # every test on the fused and the pure-PyTorch paths


def _grads(fn, x, grad_out):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    (g,) = torch.autograd.grad((y * grad_out).sum(), x)
    return y, g


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
def test_create_pool_max_and_avg_are_torch_modules(d, case):
    """timm's order (gate, kernel_size, stride, padding); "max" and "avg" are torch's own modules."""
    k, s, p, ceil = case
    x = torch.randn(2, 3, *([7] * d))
    pool = create_pool("max", k, s, p, dim=d, channels=3, ceil_mode=ceil)
    assert type(pool) is TORCH_MAX[d]
    torch.testing.assert_close(pool(x), MAX_POOL[d](x, k, s, p, ceil_mode=ceil))
    pool = create_pool("avg", k, s, p, dim=d, ceil_mode=ceil, count_include_pad=False)
    assert type(pool) is TORCH_AVG[d]
    torch.testing.assert_close(pool(x), AVG_POOL[d](x, k, s, p, ceil_mode=ceil, count_include_pad=False))
    # what torch's modules lack falls back to the gate, which equals them where both apply
    gated = create_pool("avg", k, s, p, dim=d, ceil_mode=ceil, return_weights=True)
    assert isinstance(gated, POOL[d]) and gated.gate == "avg"
    torch.testing.assert_close(gated(x)[0], AVG_POOL[d](x, k, s, p, ceil_mode=ceil))
    dilated = create_pool("avg", 2, 1, dim=d, dilation=2)
    assert isinstance(dilated, POOL[d]) and dilated.dilation == (2,) * d


@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention", "conv"])
def test_create_pool_other_gates(gate):
    pool = create_pool(gate, 3, 2, 1, dim=1, channels=4, ceil_mode=True)
    assert pool.gate == gate and pool.kernel_size == (3,) and pool.stride == (2,) and pool.padding == (1,)
    assert isinstance(pool, GatedPool1d) and pool.ceil_mode
    named = {"soft": SoftPool1d, "soft-learned": SoftPool1d, "attention": AttentionGatePool1d}
    if gate in named:
        assert type(pool) is named[gate]


@pytest.mark.parametrize("case", CASES)
def test_max_gates_are_torch_argmax_one_hot(windows, case):
    k, s, p, ceil = case
    x = torch.randn(2, 3, 7, 6)
    pool = GatedPool2d(k, s, p, ceil_mode=ceil, gate="max", return_weights=True)
    out, gates = pool(x)
    _, idx = F.max_pool2d(x, k, s, p, ceil_mode=ceil, return_indices=True)  # flat index into H·W
    assert gates.shape == (*out.shape, k * k)
    assert torch.all((gates == 0) | (gates == 1)) and torch.all(gates.sum(-1) == 1)
    # the winning window position, mapped back to a flat input index, is torch's index
    ss = s or k
    oh = torch.arange(out.shape[2]).view(-1, 1) * ss - p
    ow = torch.arange(out.shape[3]).view(1, -1) * ss - p
    j = gates.argmax(-1)
    flat = (oh + j // k) * x.shape[3] + (ow + j % k)
    assert torch.equal(flat, idx)
    values, _ = windows(x, x, (k, k), (ss, ss), (p, p), ceil)
    torch.testing.assert_close((gates * values).sum(-1), out)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_gates_are_uniform_over_counted_positions(windows, case, count_include_pad):
    k, s, p, ceil = case
    x = torch.randn(1, 2, 6, 7)
    pool = GatedPool2d(k, s, p, ceil_mode=ceil, gate="avg", count_include_pad=count_include_pad)
    pool.return_weights = True
    out, gates = pool(x)
    ones = torch.ones(1, 1, 6 + 2 * p, 7 + 2 * p) if count_include_pad else torch.ones(1, 1, 6, 7)
    pad = 0 if count_include_pad else p  # the padded input itself, or the input padded with zeros
    values, _ = windows(ones, ones, (k, k), (s or k,) * 2, (pad, pad), ceil)
    covered = values[0, 0]  # 1 where torch's divisor counts a position, else 0  (*out, K)
    torch.testing.assert_close(gates[0, 0], covered / covered.sum(-1, keepdim=True))
    values, _ = windows(x, x, (k, k), (s or k,) * 2, (p, p), ceil)
    torch.testing.assert_close((gates * values).sum(-1), out)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("case", [(2, None, 0, False), (3, 2, 1, True)])
def test_gradcheck_every_gate(gate, case):
    k, s, p, ceil = case
    torch.manual_seed(0)
    pool = GatedPool2d(k, s, p, ceil_mode=ceil, gate=gate, channels=2, temperature=1.0).double()
    x = torch.randn(2, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(pool, (x,), fast_mode=True)  # random projections: quick, still exact
    names = [name for name, _ in pool.named_parameters()]
    if names:  # the gate's own weights too (log τ, score and value, mixing)

        def f(*params):
            return torch.func.functional_call(pool, dict(zip(names, params)), (x,))

        params = tuple(q.detach().clone().requires_grad_() for q in pool.parameters())
        assert torch.autograd.gradcheck(f, params, fast_mode=True)


@pytest.mark.parametrize("gate", GATES)
def test_gates_are_distributions_and_shape(gate):
    torch.manual_seed(0)
    pad_rule = {"count_include_pad": False} if gate == "avg" else {}  # padded taps get 0, as the soft gates
    pool = create_pool(gate, 3, 2, 1, dim=1, channels=3, ceil_mode=True, return_weights=True, **pad_rule)
    x = torch.randn(2, 3, 9)
    out, gates = pool(x)
    assert gates.shape == (*out.shape, 3)
    if gate != "conv":  # conv's gates are its weights: not normalised, may be negative once trained
        assert torch.all(gates >= 0)
        torch.testing.assert_close(gates.sum(-1), torch.ones(out.shape))
    assert torch.all(gates[:, :, 0, 0] == 0)  # the first window's first position is padding
    out_u, gates_u = pool(x[0])  # unbatched
    torch.testing.assert_close(out_u, out[0])
    torch.testing.assert_close(gates_u, gates[0])


def test_soft_gate_is_soft_pool():
    x = torch.randn(2, 3, 6, 6)
    pool = GatedPool2d(3, 2, 1, gate="soft", temperature=0.5)
    assert type(SoftPool2d(3, 2, 1, temperature=0.5)) is SoftPool2d
    torch.testing.assert_close(SoftPool2d(3, 2, 1, temperature=0.5)(x), pool(x))
    torch.testing.assert_close(pool(x), soft_pool2d(x, 3, 2, 1, temperature=0.5))
    assert pool.temperature == 0.5


@pytest.mark.parametrize("k", [2, 3])
def test_learned_temperature_gets_a_gradient_and_moves(ref, k):
    torch.manual_seed(0)
    pool = SoftPool2d(k, temperature=2.0, learn_temperature=True, channels=3)
    assert pool.gate == "soft-learned"
    assert pool.temperature.shape == (3,)
    torch.testing.assert_close(pool.temperature, torch.full((3,), 2.0))
    x = torch.randn(4, 3, 6, 6)
    target = F.max_pool2d(x, k)  # a loss that wants a smaller τ
    loss = (pool(x) - target).pow(2).mean()
    loss.backward()
    g = pool.log_temperature.grad
    assert g is not None and torch.all(g > 0)  # larger τ → further from max → larger loss
    # the gradient equals the reference's, through τ = exp(log τ)
    log_tau = torch.full((3,), math.log(2.0), dtype=torch.float64, requires_grad=True)
    want = ref(x.double(), (k, k), (k, k), (0, 0), False, log_tau.exp())[0]
    (want - target.double()).pow(2).mean().backward()
    torch.testing.assert_close(g.double(), log_tau.grad, rtol=1e-4, atol=1e-7)
    before = pool.temperature.detach().clone()
    torch.optim.SGD(pool.parameters(), lr=1.0).step()
    assert torch.all(pool.temperature < before)


@pytest.mark.parametrize("case", [(2, None, 0, False), (3, 2, 1, True)])
def test_attention_gate_matches_explicit_computation(windows, case):
    k, s, p, ceil = case
    torch.manual_seed(0)
    pool = AttentionGatePool2d(k, s, p, ceil_mode=ceil, channels=4, return_weights=True, temperature=0.7)
    with torch.no_grad():
        pool.value.weight.normal_()  # not the identity, so values are really projected
    x = torch.randn(2, 4, 6, 5, dtype=torch.float64)
    w = pool.score.weight.double().reshape(4)  # (C,)
    V = pool.value.weight.double().reshape(4, 4)  # (C_out, C_in)
    scores = torch.einsum("nchw,c->nhw", x, w)[:, None] / 0.7  # s_j = x_j · w / τ
    values = torch.einsum("nchw,dc->ndhw", x, V)  # v_j = V x_j
    vw, _ = windows(values, values, (k, k), (s or k,) * 2, (p, p), ceil)
    _, sw = windows(scores, scores, (k, k), (s or k,) * 2, (p, p), ceil)
    g = torch.softmax(sw, -1)  # (N, 1, *out, K)
    out, gates = pool.double()(x)
    torch.testing.assert_close(out, (g * vw).sum(-1))
    torch.testing.assert_close(gates, g.expand_as(gates))


def test_attention_starts_as_soft_pool_of_a_random_score():
    torch.manual_seed(0)
    pool = AttentionGatePool2d(2, channels=4)
    torch.testing.assert_close(pool.value.weight.reshape(4, 4), torch.eye(4))
    assert pool.score.weight.shape == (1, 4, 1, 1)


@pytest.mark.parametrize("case", [(2, None, 0, False), (3, 2, 1, True)])
def test_conv_gate_is_a_depthwise_conv(case):
    k, s, p, ceil = case
    torch.manual_seed(0)
    pool = GatedPool2d(k, s, p, ceil_mode=ceil, gate="conv", channels=3, return_weights=True)
    x = torch.randn(2, 3, 7, 7)
    if p == 0:  # starts as average pooling
        torch.testing.assert_close(pool(x)[0], F.avg_pool2d(x, k))
    with torch.no_grad():
        pool.mixing.normal_()
    out, gates = pool(x)
    want_size = F.max_pool2d(x, k, s, p, ceil_mode=ceil).shape[2:]
    xp = F.pad(x, (p, p + k, p, p + k))  # enough zeros on the right for any ceil_mode window
    want = F.conv2d(xp, pool.mixing, stride=s or k, groups=3)[:, :, : want_size[0], : want_size[1]]
    torch.testing.assert_close(out, want)
    assert torch.equal(gates[1, :, 1, 1], pool.mixing.reshape(3, k * k).detach())  # an interior window
    assert gates.shape == (*out.shape, k * k)


def _perturbed_pool(gate, case):
    """A pool whose weights (if any) are moved off their init: V ≠ I, mixing ≠ 1/K, τ_c differ."""
    k, s, p, ceil = case
    pool = GatedPool2d(k, s, p, ceil_mode=ceil, gate=gate, channels=4)
    with torch.no_grad():
        for q in pool.parameters():
            q.add_(0.3 * torch.randn_like(q))
    return pool


def _value_and_grads(pool, x, grad_out=None):
    """out, ∂L/∂x and ∂L/∂params for L = Σ out · grad_out (grad_out = 1 if None)."""
    x = x.detach().clone().requires_grad_()
    out = pool(x)
    loss = out.sum() if grad_out is None else (out * grad_out).sum()
    grads = torch.autograd.grad(loss, [x, *pool.parameters()])
    return out, grads[0], grads[1:]


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("case", [(2, None, 0, False), (3, 2, 1, True)])  # tiling, and padded windows
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_every_gate_matches_float64(gate, case, dtype):
    """fp16 / bf16 in: finite, and the fp64 layer (same weights, same rounded input) to the dtype's eps.

    The layer computes in float32 and rounds once to the dtype, output and input gradient alike, so each
    differs from float64 by ≤ eps/2 relative; we allow rtol = eps, plus atol = eps · max|want| / 100 for
    the float32 rounding (~1e-7) of values that cancel to ~0. Parameters stay float32: their gradients
    are float32 sums, held to the same bound.
    """
    torch.manual_seed(0)
    pool = _perturbed_pool(gate, case)
    ref = copy.deepcopy(pool).double()
    xh = torch.randn(2, 4, 6, 6).to(dtype)
    out, g_x, g_params = _value_and_grads(pool, xh)
    want, g_x_want, g_params_want = _value_and_grads(ref, xh.double())
    assert out.dtype == dtype and g_x.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(g_x).all()
    eps = torch.finfo(dtype).eps
    for got, exp in [(out, want), (g_x, g_x_want), *zip(g_params, g_params_want)]:
        torch.testing.assert_close(got.double(), exp, rtol=eps, atol=eps * exp.abs().max().item() / 100)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("case", [(2, None, 0, False), (3, 2, 1, True)])
def test_channels_last_every_gate(gate, case):
    """channels_last in, channels_last out; values, input and parameter gradients equal NCHW's."""
    torch.manual_seed(0)
    pool = _perturbed_pool(gate, case)
    x = torch.randn(2, 4, 6, 6)
    grad_out = torch.randn_like(pool(x))
    out, g_x, g_params = _value_and_grads(pool, x, grad_out)
    xc = x.contiguous(memory_format=torch.channels_last)
    out_c, g_x_c, g_params_c = _value_and_grads(pool, xc, grad_out)
    assert out_c.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out_c, out)
    torch.testing.assert_close(g_x_c, g_x)
    assert len(g_params) == len(g_params_c) == len(list(pool.parameters()))
    for got, exp in zip(g_params_c, g_params):
        torch.testing.assert_close(got, exp)


@pytest.mark.parametrize("d", [1, 3])
def test_other_dims(d, ref):
    x = torch.randn(2, 3, *([6] * d), dtype=torch.float64)
    pool = create_pool("soft", 3, 2, 1, dim=d, temperature=0.5).double()
    torch.testing.assert_close(pool(x), ref(x, 3, 2, 1, False, 0.5)[0])
    pool = create_pool("attention", 2, dim=d, channels=3).double()
    assert pool(x).shape == (2, 3, *([3] * d))


def test_state_dict_names():
    assert set(create_pool("soft-learned", 2, channels=4).state_dict()) == {"log_temperature"}
    assert set(create_pool("attention", 2, channels=4).state_dict()) == {"score.weight", "value.weight"}
    assert set(create_pool("conv", 2, channels=4).state_dict()) == {"mixing"}
    assert create_pool("max", 2, channels=4).state_dict() == {}


@pytest.mark.parametrize("gate", GATES)
def test_residual_cnn_accepts_every_gate(gate):
    from gatepool.models import ResidualCNN

    torch.manual_seed(0)
    model = ResidualCNN(pool=gate, width=8, groups=2)
    out = model(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    torch_pool = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}
    if gate in torch_pool:  # torch's own kernels
        assert type(model.pool1) is torch_pool[gate] and model.pool1.kernel_size == 2
    else:
        assert model.pool1.gate == gate and model.pool1.kernel_size == (2, 2)


def _full_path(pool, x):
    """``pool(x)`` by the full path (geometry, path chooser, the gate's function), not its eager route."""
    window = (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
    return pool._pool(x, pool_geometry(x, pool.dim, *window))


@pytest.mark.skipif(not fused_pool.available() or not c_kernels.eager_op(), reason="no eager C++ operator")
@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention"])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_the_eager_route_is_the_full_path_bit_for_bit(gate, d, monkeypatch, pool_path):
    """From the second call of a shape and dtype a softmax gate calls the eager operator straight away
    (``GatedPoolNd._route``): the full path's output, memory format and gradients (of x and of the
    parameters), bit for bit, in float32 (NCHW and channels_last) and float64 with float32 parameters.
    Without the fused kernels (the pure-PyTorch paths) there is no route: the full path every call."""
    torch.manual_seed(0)
    pool = POOL[d](3, 2, 1, gate=gate, channels=4)
    with torch.no_grad():
        for p in pool.parameters():  # away from the start values (log τ = 0: τ = 1/τ = exp(log τ) = 1)
            p.uniform_(-0.5, 0.5)
    full = []
    full_pool = GatedPoolNd._pool
    monkeypatch.setattr(GatedPoolNd, "_pool", lambda self, x, geo: full.append(1) or full_pool(self, x, geo))
    size = {1: (9,), 2: (7, 8), 3: (5, 6, 5)}[d]
    for dtype, channels_last in ((torch.float32, False), (torch.float32, True), (torch.float64, False)):
        x = torch.randn(2, 4, *size, dtype=dtype)
        x = x.contiguous(memory_format=torch.channels_last) if channels_last and d == 2 else x
        pool(x)  # (the route of this shape and dtype made, where there was none)
        results = []
        for way in ("route", "full"):
            xi = x.clone().requires_grad_()
            calls = len(full)
            out = pool(xi) if way == "route" else _full_path(pool, xi)
            assert len(full) == calls + (way == "full" or pool_path.name != "fused")  # route: no full path
            grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
            results.append((out, out.stride(), torch.autograd.grad(out, [xi, *pool.parameters()], grad)))
        (a, strides_a, grads_a), (b, strides_b, grads_b) = results
        assert torch.equal(a, b) and strides_a == strides_b
        assert all(torch.equal(u, v) for u, v in zip(grads_a, grads_b, strict=True))


@pytest.mark.parametrize("gate", ["soft", "attention"])
def test_the_eager_route_sees_a_changed_setting(gate):
    """Setting an attribute of the pool drops its route: the next call is the pool with the new setting."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 7, 8)
    pool = GatedPool2d(3, 2, 1, gate=gate, channels=4)
    pool(x), pool(x)
    pool.fixed_temperature, pool.stride = 0.5, (1, 1)
    want = GatedPool2d(3, 1, 1, gate=gate, channels=4, temperature=0.5)
    want.load_state_dict(pool.state_dict())
    assert torch.equal(pool(x), want(x)) and pool(x).shape == (2, 4, 7, 8)


def test_the_eager_route_checks_the_channels():
    pool = GatedPool2d(2, gate="soft-learned", channels=4)
    pool(torch.randn(2, 4, 6, 6))
    with pytest.raises(ValueError, match="this pool was built for channels=4"):
        pool(torch.randn(2, 5, 6, 6))


def test_no_eager_route_where_the_full_path_does_more():
    """Half precision, the weights asked for, an unbatched input: the full path every call."""
    for pool, x in ((GatedPool2d(2, gate="soft"), torch.randn(2, 3, 4, 4, dtype=torch.bfloat16)),
                    (GatedPool2d(2, gate="soft", return_weights=True), torch.randn(2, 3, 4, 4)),
                    (GatedPool2d(2, gate="soft"), torch.randn(3, 4, 4)),
                    (GatedPool2d(2, gate="max"), torch.randn(2, 3, 4, 4))):  # fmt: skip
        pool(x)
        route = pool.__dict__["_eager_route"]
        assert route.key == (x.shape, x.dtype) and route.geometry is None
