"""soft_pool1d/2d/3d against the explicit unfold + softmax reference (conftest.py): values and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatepool.layers import soft_pool, soft_pool1d, soft_pool2d, soft_pool3d

MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
SOFT_POOL = {1: soft_pool1d, 2: soft_pool2d, 3: soft_pool3d}
CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}

pytestmark = pytest.mark.usefixtures("pool_path")  # every test on the fused and the pure-PyTorch paths


@st.composite
def pool_cases(draw):
    d = draw(st.integers(1, 3))
    k = tuple(draw(st.integers(1, 3)) for _ in range(d))
    s = tuple(draw(st.integers(1, 3)) for _ in range(d))
    p = tuple(draw(st.integers(0, ki // 2)) for ki in k)
    dl = tuple(draw(st.integers(1, 2)) for _ in range(d))
    hi = {1: 9, 2: 7, 3: 5}[d]
    size = tuple(draw(st.integers(max(1, di * (ki - 1) + 1 - 2 * pi), hi)) for ki, pi, di in zip(k, p, dl))
    return dict(
        d=d,
        k=k,
        s=draw(st.sampled_from([s, None])),
        p=p,
        dl=draw(st.sampled_from([dl, 1])),
        size=size,
        ceil_mode=draw(st.booleans()),
        tau=draw(st.sampled_from([0.05, 0.3, 1.0, 2.5, 20.0])),
        n=draw(st.integers(1, 2)),
        c=draw(st.integers(1, 3)),
        batched=draw(st.booleans()),
        channels_last=draw(st.booleans()) and d > 1,
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pool_cases())
def test_matches_reference_values_and_grads(ref, case):
    d, k, s, p, dl = case["d"], case["k"], case["s"], case["p"], case["dl"]
    gen = torch.Generator().manual_seed(case["seed"])
    n = case["n"] if case["batched"] else 1
    x64 = torch.randn(n, case["c"], *case["size"], generator=gen, dtype=torch.float64)
    want, want_weights = ref(x64.clone().requires_grad_(), k, s, p, case["ceil_mode"], case["tau"], dl)

    x = x64.clone()
    if case["channels_last"]:
        x = x.contiguous(memory_format=CHANNELS_LAST[d])
    if not case["batched"]:
        x = x[0]
    x.requires_grad_()
    args = (k, s, p, dl, case["ceil_mode"])
    out, weights = SOFT_POOL[d](x, *args, temperature=case["tau"], return_weights=True)
    out_fast = SOFT_POOL[d](x, *args, temperature=case["tau"])  # the fast path where it applies
    if not case["batched"]:
        out, weights, out_fast = out[None], weights[None], out_fast[None]
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out_fast, want)
    torch.testing.assert_close(weights, want_weights)

    # gradients: a random upstream gradient through both paths and the reference
    x_ref = x64.clone().requires_grad_()
    want = ref(x_ref, k, s, p, case["ceil_mode"], case["tau"], dl)[0]
    grad_out = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    grad_out = grad_out.masked_fill(want.isinf(), 0)  # −inf: a window with no input (nothing to pass back)
    (want * grad_out).sum().backward()
    for y in (out, out_fast):
        (g,) = torch.autograd.grad((y * grad_out).sum(), x)
        torch.testing.assert_close(g if case["batched"] else g[None], x_ref.grad)


@pytest.mark.parametrize("size", [(8, 8), (9, 7)])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_tiling_windows_incl_crop(ref, size, ceil_mode, tau):
    """k = s = 2 without padding: the tile fast path (odd sizes: crop, or ceil_mode: the unfold path)."""
    x = torch.randn(2, 3, *size, dtype=torch.float64, requires_grad=True)
    out = soft_pool2d(x, 2, ceil_mode=ceil_mode, temperature=tau)
    x_ref = x.detach().clone().requires_grad_()
    want = ref(x_ref, 2, 2, 0, ceil_mode, tau)[0]
    torch.testing.assert_close(out, want)
    grad_out = torch.randn_like(want)
    (out * grad_out).sum().backward()
    (want * grad_out).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("kp", [(2, 0), (3, 1)])  # tile fast path, and overlapping + padded unfold path
@pytest.mark.parametrize("tau_shape", [(), (1,), (3,)])  # one shared τ, or one per channel
def test_tensor_temperature_values_and_grads(ref, kp, tau_shape, pool_path):
    k, p = kp
    s = k if p == 0 else 2
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor([0.2, 1.0, 4.0], dtype=torch.float64)[: math.prod(tau_shape)].reshape(tau_shape)
    tau.requires_grad_()
    out = soft_pool2d(x, k, s, p, temperature=tau)
    assert pool_path.node(out) == pool_path.backward(tiles=p == 0)  # the path named above
    x_ref, tau_ref = x.detach().clone().requires_grad_(), tau.detach().clone().requires_grad_()
    want = ref(x_ref, k, s, p, False, tau_ref)[0]
    torch.testing.assert_close(out, want)
    grad_out = torch.randn_like(want)
    (out * grad_out).sum().backward()
    (want * grad_out).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(tau.grad, tau_ref.grad)
    assert tau.grad.abs().min() > 0


@pytest.mark.parametrize("kp", [(2, 0), (3, 1)])
def test_gradcheck_float64(kp):
    k, p = kp
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor([0.7, 1.9], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, t: soft_pool2d(a, k, padding=p, temperature=t), (x, tau))
    assert torch.autograd.gradcheck(lambda a: soft_pool2d(a, k, padding=p, temperature=0.4), (x,))
    x1 = torch.randn(2, 7, dtype=torch.float64, requires_grad=True)  # unbatched 1-D
    assert torch.autograd.gradcheck(lambda a: soft_pool1d(a, 3, 2, 1, ceil_mode=True), (x1,))
    x3 = torch.randn(1, 1, 4, 4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: soft_pool3d(a, 2, temperature=2.0), (x3,))


@pytest.mark.parametrize("tau", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("k", [2, 3])
def test_gradient_identity(tau, k):
    """∂out/∂v_j = g_j (1 + (v_j − out)/τ) for one window, with g and out from the layer itself."""
    v = torch.randn(1, 1, k, k, dtype=torch.float64, requires_grad=True)
    out, gates = soft_pool2d(v, k, temperature=tau, return_weights=True)
    (grad,) = torch.autograd.grad(soft_pool2d(v, k, temperature=tau).sum(), v)
    g, vj, o = gates.reshape(-1), v.detach().reshape(-1), out.detach().reshape(())
    torch.testing.assert_close(grad.reshape(-1), g * (1 + (vj - o) / tau))
    torch.testing.assert_close(g, torch.softmax(vj / tau, 0))


@pytest.mark.parametrize("d", [1, 2, 3])
def test_gates_are_a_distribution_and_padding_gets_zero(d):
    x = torch.randn(2, 3, *([5] * d)) * 10
    _, gates = soft_pool(x, d, 3, 2, 1, ceil_mode=True, return_weights=True, temperature=0.5)
    assert gates.shape[-1] == 3**d
    assert torch.all(gates >= 0)
    torch.testing.assert_close(gates.sum(-1), torch.ones(gates.shape[:-1]))
    # the first window starts in the left padding: its first position (all-padding corner) is gated 0
    first = gates[(slice(None), slice(None), *([0] * d))]
    assert torch.all(first[..., 0] == 0)


@pytest.mark.parametrize("kpc", [(2, 0, False), (3, 1, True)])
@pytest.mark.parametrize("tau", [1e-4, 1.0, 1e4])
def test_large_inputs_are_stable(ref, kpc, tau):
    k, p, ceil = kpc
    x = (torch.rand(2, 3, 7, 7, dtype=torch.float64) * 2 - 1) * 1e4  # ±1e4
    x32 = x.float().requires_grad_()
    out = soft_pool2d(x32, k, 2, p, 1, ceil, temperature=tau)
    (grad,) = torch.autograd.grad(out.sum(), x32)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    want = ref(x32.detach().double(), k, 2, p, ceil, tau)[0]
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-2)  # 1e-2 of 1e4: float32 epsilon


def _separated(shape, gen):
    """Distinct, equally spaced values in random order: no near-ties, so τ = 1e-4 is a clean max."""
    n = math.prod(shape)
    return (torch.randperm(n, generator=gen).double() * 0.01 - n * 0.005).reshape(shape)


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("kspc", [(2, 2, 0, False), (3, 2, 1, True)])
def test_temperature_limits_are_max_and_avg(d, kspc):
    k, s, p, ceil = kspc
    gen = torch.Generator().manual_seed(d)
    x = _separated((2, 2, *([6] * d)), gen)
    x = (x / x.abs().max()).requires_grad_()  # in [-1, 1], neighbours ≥ 0.002 apart: e^(-20) at τ = 1e-4
    for tau, torch_pool in ((1e-4, MAX_POOL[d]), (1e4, AVG_POOL[d])):
        kwargs = {"ceil_mode": ceil} if tau < 1 else {"ceil_mode": ceil, "count_include_pad": False}
        want = torch_pool(x, k, s, p, **kwargs)
        out = soft_pool(x, d, k, s, p, 1, ceil, temperature=tau)
        grad_out = torch.randn(want.shape, generator=gen, dtype=torch.float64)
        (g_want,) = torch.autograd.grad((want * grad_out).sum(), x)
        (g_out,) = torch.autograd.grad((out * grad_out).sum(), x)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-3)
        torch.testing.assert_close(g_out, g_want, rtol=0, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kpc", [(2, 0, False), (3, 1, True)])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_half_precision(ref, dtype, kpc, scale):
    k, p, ceil = kpc
    x = (torch.randn(2, 3, 8, 8) * scale).to(dtype).requires_grad_()
    out = soft_pool2d(x, k, 2, p, 1, ceil, temperature=0.5)
    (grad,) = torch.autograd.grad(out.float().sum(), x)
    assert out.dtype == dtype and grad.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    x64 = x.detach().double().requires_grad_()
    want = ref(x64, k, 2, p, ceil, 0.5)[0]
    (g_want,) = torch.autograd.grad(want.sum(), x64)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.double(), want, rtol=2 * eps, atol=2 * eps * scale)
    torch.testing.assert_close(grad.double(), g_want, rtol=4 * eps, atol=4 * eps * g_want.abs().max().item())


@pytest.mark.parametrize("kp", [(2, 0), (3, 1)])
def test_channels_last_in_channels_last_out(kp):
    k, p = kp
    x = torch.randn(2, 4, 8, 8)
    xc = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    out_c = soft_pool2d(xc, k, 2, p)
    assert out_c.is_contiguous(memory_format=torch.channels_last)
    x = x.requires_grad_()
    out = soft_pool2d(x, k, 2, p)
    torch.testing.assert_close(out_c, out)
    grad_out = torch.randn_like(out)
    (g_c,) = torch.autograd.grad((out_c * grad_out).sum(), xc)
    (g,) = torch.autograd.grad((out * grad_out).sum(), x)
    torch.testing.assert_close(g_c, g)
    x3 = torch.randn(1, 3, 4, 4, 4).contiguous(memory_format=torch.channels_last_3d)
    assert soft_pool3d(x3, 2).is_contiguous(memory_format=torch.channels_last_3d)


def test_unbatched_equals_batched():
    x = torch.randn(3, 6, 6)
    torch.testing.assert_close(soft_pool2d(x, 3, 2, 1), soft_pool2d(x[None], 3, 2, 1)[0])
    out, gates = soft_pool1d(x[:, 0], 2, return_weights=True)
    assert out.shape == (3, 3) and gates.shape == (3, 3, 2)
