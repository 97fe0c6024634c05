"""The C kernel in float16 / bfloat16 (``kernels/softmax_pool.c``): read and written in the half type as it
is, float32 inside, gradients summed in float32 and rounded once.

The reference is float64 from the same rounded inputs: conftest's ``windows_ref`` (the ``windows``
fixture: explicit padding, ``Tensor.unfold``), a softmax and a weighted sum, differentiated by autograd.
The tolerances are the half-precision tests' elsewhere (``test_triton_pool``): out to 2 eps, ∂x to 4 eps,
∂w and ∂τ to 4 eps of their largest entry (eps: fp16 1e-3, bf16 8e-3).
"""

from __future__ import annotations

import pytest
import torch

from gatepool.layers import AdaptiveGatedPool2d, GatedPool2d, GlobalGatedPool2d, c_kernels, fused_pool
from gatepool.layers.softmax_paths import input_dtype, softmax_path
from gatepool.layers.windows import pool_geometry

pytestmark = pytest.mark.skipif(not fused_pool.available(), reason="no fused kernels here (no C compiler)")

HALF = [torch.float16, torch.bfloat16]
CASES = {"tiled": (2, 2, 0, False), "overlapping": (3, 2, 1, True)}  # kernel, stride, padding, ceil_mode
KINDS = ["soft", "soft-learned", "attention"]


def make(kind, dtype, channels, layout, seed=0):
    """x (N, C, H, W) in dtype, score weights w (C,) or None, τ (C,) or (1,): float32 leaves."""
    g = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(2, channels, 9, 9, generator=g)).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(channels, generator=g) if kind == "attention" else None
    tau = torch.rand(channels if kind == "soft-learned" else 1, generator=g) + 0.5
    return x, w, tau


def reference(windows, x, w, tau, case, grad):
    """float64: out and (∂x, ∂w or None, ∂τ) by autograd through ``windows`` (conftest's windows_ref)."""
    k, s, p, ceil = case
    x = x.detach().double().requires_grad_()
    tau = tau.detach().double().requires_grad_()
    w = None if w is None else w.detach().double().requires_grad_()
    scores = x if w is None else torch.einsum("nchw,c->nhw", x, w).unsqueeze(1)  # (N, C or 1, H, W)
    v, sc = windows(x, scores / tau.view(1, -1, 1, 1), (k, k), (s, s), (p, p), ceil)
    out = (torch.softmax(sc, -1) * v).sum(-1)
    inputs = [x, tau] if w is None else [x, w, tau]
    grads = torch.autograd.grad(out, inputs, grad.double())
    return out.detach(), grads[0], (None if w is None else grads[1]), grads[-1]


def run(x, w, tau, case, grad):
    """The C kernel through the op's autograd: out and (∂x, ∂w or None, ∂τ)."""
    k, s, p, ceil = case
    x = x.detach().requires_grad_()
    tau = tau.detach().requires_grad_()
    w = None if w is None else w.detach().requires_grad_()
    out = fused_pool.softmax_pool(x, w, tau, pool_geometry(x, 2, k, s, p, 1, ceil))
    inputs = [x, tau] if w is None else [x, w, tau]
    grads = torch.autograd.grad(out, inputs, grad)
    return out, grads[0], (None if w is None else grads[1]), grads[-1]


def assert_within_half_rounding(got, want, dtype):
    eps = torch.finfo(dtype).eps
    (out, gx, gw, gt), (r_out, r_gx, r_gw, r_gt) = got, want
    torch.testing.assert_close(out.double(), r_out, rtol=2 * eps, atol=2 * eps)
    torch.testing.assert_close(gx.double(), r_gx, rtol=4 * eps, atol=4 * eps)
    for g, r in [(gw, r_gw), (gt, r_gt)]:
        if r is not None:
            torch.testing.assert_close(g.double(), r, rtol=4 * eps, atol=4 * eps * r.abs().max().item())


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("channels", [3, 20, 70])  # part of a channel block; one and a part; past 4 blocks
def test_values_and_gradients_against_float64(windows, dtype, kind, case, layout, channels):
    x, w, tau = make(kind, dtype, channels, layout)
    grad_size = pool_geometry(x, 2, *case[:3], 1, case[3]).out_size
    grad = torch.randn(2, channels, *grad_size, generator=torch.Generator().manual_seed(1))
    got = run(x, w, tau, case, grad.to(fused_pool._out_dtype(x, w)))
    assert got[0].dtype == (torch.float32 if kind == "attention" else dtype)  # attention projects out next
    assert got[1].dtype == dtype
    assert_within_half_rounding(got, reference(windows, x, w, tau, case, grad), dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", [*KINDS, "score-map"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("channels", [3, 70])
def test_the_half_kernel_is_the_float32_kernel_rounded_once(dtype, kind, case, channels):
    """To the bit: out, ∂x, ∂scores (score weights or a map) and ∂τ of the half kernel are the float32
    kernel's on the same rounded inputs (its float32 results rounded once to the half type; ∂w, ∂τ and
    attention's out stay float32). So the
    backward recomputes out as the forward summed it, and no product is fused into an add in one element
    type's copy of the kernels and not in another's (c_kernels.FLAGS). Seeds 0–3, both layouts."""
    for seed, layout in [(seed, layout) for seed in range(4) for layout in ("nchw", "channels_last")]:
        x, w, tau = make("attention" if kind == "attention" else "soft", dtype, channels, layout, seed)
        g = torch.Generator().manual_seed(seed + 10)
        scores = w if kind != "score-map" else (2 * torch.randn(2, 1, 9, 9, generator=g)).to(dtype)
        if kind == "soft-learned":
            tau = torch.rand(channels, generator=g) + 0.5
        grad = torch.randn(2, channels, *pool_geometry(x, 2, *case[:3], 1, case[3]).out_size, generator=g)
        grad = grad if kind == "attention" else grad.to(dtype).float()  # ∂L/∂out as the half run gets it
        half = run(x, scores, tau, case, grad.to(fused_pool._out_dtype(x, scores)))
        full = run(x.float(), None if scores is None else scores.float(), tau, case, grad)
        for name, h, f in zip(("out", "∂x", "∂scores", "∂τ"), half, full, strict=True):
            if h is None:  # soft pooling: no scores
                continue
            f = f.to(h.dtype)
            assert torch.equal(h, f), (name, seed, layout, int((h != f).sum()))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("seed", range(4))
def test_a_learned_tau_in_bf16_and_fp16_with_peaked_windows(windows, dtype, seed):
    """∂τ = −Σ g_j (v_j − out) s_j G / τ² sums terms that cancel over every window: the backward recomputes
    out in float32 (a rounded out, read back, puts the half type's rounding into every term of the sum)."""
    x, _, tau = make("soft-learned", dtype, 16, "channels_last", seed)
    x = (3 * x).to(dtype)  # peaked gates: v_j − out far from 0
    grad = torch.randn(2, 16, 5, 5, generator=torch.Generator().manual_seed(seed + 10)).to(dtype)
    case = CASES["overlapping"]
    want = reference(windows, x, None, tau, case, grad)
    assert_within_half_rounding(run(x, None, tau, case, grad), want, dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("scored", [False, True])
def test_non_finite_windows_take_the_float32_kernels_limits(dtype, scored):
    """+inf, −inf and NaN (max pooling's limits, kernels/softmax_pool.c's top): the half kernel gives the
    float32 kernel's outputs and gradients on the same rounded inputs (a score map for the shared score;
    the float32 kernel's limits are held to the plain path's by the soft family's tests)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 6, 6, generator=g).to(dtype)
    scores = torch.randn(1, 1, 6, 6, generator=g).to(dtype) if scored else None
    target = x if scores is None else scores
    target[0, 0, 0, 0] = float("inf")  # window (0, 0): a top of +inf
    target[0, 0, 0, 5] = float("-inf")  # −inf beside finite taps: gate 0
    target[0, 0, 4:6, 0:2] = float("-inf")  # a window of −inf only
    target[0, 0, 5, 5] = float("nan")  # NaN spoils its own window
    tau = torch.tensor([0.7])
    geo = fused_pool.encode(pool_geometry(x, 2, 2))
    grad = torch.randn(1, 2, 3, 3, generator=g).to(dtype)
    results = []
    for t in (x, x.float()):
        s = None if scores is None else scores.to(t.dtype)
        out, stats = torch.ops.gatepool.softmax_pool(t, s, tau, geo)
        grads = torch.ops.gatepool.softmax_pool_backward(grad.to(t.dtype), t, s, tau, out, stats, geo, True)
        results.append((out, *grads))
    assert results[0][0].dtype == dtype and not results[0][0].isfinite().all()
    eps = torch.finfo(dtype).eps
    for half, full in zip(*results):
        if full.numel():
            torch.testing.assert_close(half.float(), full, rtol=4 * eps, atol=4 * eps, equal_nan=True)


def _pairs(dtype):
    """Every finite number of dtype beside its successor (their means: the ties) and beside a random one."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    v = bits.view(dtype)
    v = v[v.isfinite()]
    other = v[torch.randperm(v.numel(), generator=torch.Generator().manual_seed(0))]
    first, second = torch.cat([v[:-1], v]), torch.cat([v[1:], other])
    n = first.numel() // 16 * 16
    return first[:n], second[:n]


def assert_stores_round_to_nearest_even(dtype):
    """τ = inf (a = 0): every gate of a two-tap window is 1/2, out = (v1 + v2) · 0.5 in float32, rounded
    once to dtype: bit for bit torch's rounding of the same float32 number (ties to even, past the range
    to ±inf, fp16's subnormals), over every finite number of dtype. (A sum past float32's range makes a
    non-finite window, which the kernel redoes in double: the mean in double, then rounded.)"""
    first, second = _pairs(dtype)
    x = torch.stack([first, second], -1).view(1, 16, -1)  # (1, 16, 2M): window o of channel c: a pair
    out = fused_pool.softmax_pool(x, None, torch.tensor([float("inf")]), pool_geometry(x, 1, 2))
    mean = (first.float() + second.float()) * 0.5
    redone = ((first.double() + second.double()) * 0.5).float()
    want = torch.where(mean.isfinite(), mean, redone).to(dtype).view(1, 16, -1)
    assert out.dtype == dtype and torch.equal(out.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("dtype", HALF)
def test_stores_round_to_nearest_even(dtype):
    assert_stores_round_to_nearest_even(dtype)


@pytest.mark.slow
def test_a_build_without_avx512_or_f16c(windows, tmp_path, monkeypatch):
    """-march=x86-64 (SSE2: no AVX-512, no F16C): fp16 through the kernel's own bit conversions, bf16 through
    the vector extensions without AVX-512; the same rounding, and values and gradients within the bounds."""
    flags = [f for f in c_kernels.FLAGS if f not in ("-march=native", "-mprefer-vector-width=512")]
    monkeypatch.setattr(c_kernels, "FLAGS", ["-march=x86-64", *flags])
    lib = c_kernels.load(c_kernels.build(folder=tmp_path))
    monkeypatch.setattr(c_kernels, "_library", lambda: lib)
    for dtype in HALF:
        assert_stores_round_to_nearest_even(dtype)
        for kind in KINDS:
            x, w, tau = make(kind, dtype, 20, "channels_last")
            grad = torch.randn(2, 20, 5, 5, generator=torch.Generator().manual_seed(1))
            case = CASES["overlapping"]
            got = run(x, w, tau, case, grad.to(fused_pool._out_dtype(x, w)))
            assert_within_half_rounding(got, reference(windows, x, w, tau, case, grad), dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("gate", KINDS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_gates_in_half_precision_against_their_float64_copy(dtype, gate, layout):
    """The whole gate (attention's projection included), overlapping padded windows, both memory formats:
    the tolerances of test_gated_pool's half-precision test (rtol eps, atol eps · max / 100)."""
    torch.manual_seed(0)
    pool = GatedPool2d(3, 2, 1, gate=gate, channels=20)
    with torch.no_grad():
        for q in pool.parameters():
            q.add_(0.3 * torch.randn_like(q))
    ref = GatedPool2d(3, 2, 1, gate=gate, channels=20).double()
    ref.load_state_dict(pool.state_dict())
    x = torch.randn(2, 20, 9, 9).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x
    results = []
    for p, t in [(pool, x), (ref, x.double())]:
        t = t.detach().requires_grad_()
        out = p(t)
        results.append((out, *torch.autograd.grad(out.sum(), [t, *p.parameters()])))
    assert results[0][0].dtype == results[0][1].dtype == dtype
    eps = torch.finfo(dtype).eps
    for got, want in zip(*results):
        torch.testing.assert_close(got.double(), want, rtol=eps, atol=eps * want.abs().max().item() / 100)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("gate", KINDS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("autocast", [False, True])
def test_half_precision_goes_into_the_c_kernel_as_it_is(dtype, gate, layout, autocast):
    """No float32 tensor of the input's size is saved for the backward (the input went in as it is), and
    the output has the input's dtype, as ``F.max_pool2d``'s under CPU autocast too."""
    x = torch.randn(4, 16, 12, 12).to(dtype)
    x = (x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x).requires_grad_()
    pool = GatedPool2d(3, 2, 1, gate=gate, channels=16)
    assert softmax_path(x.detach()).name == "c" and input_dtype(x) == dtype
    saved = []

    def keep(t):
        saved.append((t.dtype, t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = pool(x)
            want = torch.nn.functional.max_pool2d(x, 3, 2, 1)
    out.float().sum().backward()
    assert out.dtype == want.dtype == dtype and x.grad.dtype == dtype
    assert saved and not [s for s in saved if s[0] == torch.float32 and s[1] >= x.numel()], saved


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("gate", KINDS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("kind", ["global", "adaptive 3x3"])
def test_global_and_adaptive_pools_take_half_precision_as_it_is(dtype, gate, layout, kind):
    """A global pool's one window, and an adaptive pool's windows where they tile the input (9 → 3), too:
    the input goes into the C kernel as it is (no float32 tensor of its size saved for the backward), out
    in its dtype, the values and gradients within the tolerances of
    test_gates_in_half_precision_against_their_float64_copy."""

    def make():
        if kind == "global":
            return GlobalGatedPool2d(gate, channels=20)
        return AdaptiveGatedPool2d(3, gate=gate, channels=20)

    torch.manual_seed(0)
    pool = make()
    with torch.no_grad():
        for q in pool.parameters():
            q.add_(0.3 * torch.randn_like(q))
    ref = make().double()
    ref.load_state_dict(pool.state_dict())
    x = torch.randn(2, 20, 9, 9).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x
    saved, results = [], []

    def keep(t):
        saved.append((t.dtype, t.numel()))
        return t

    for p, t in [(pool, x), (ref, x.double())]:
        t = t.detach().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(keep if p is pool else (lambda u: u), lambda u: u):
            out = p(t)
        results.append((out, *torch.autograd.grad(out.sum(), [t, *p.parameters()])))
    assert results[0][0].dtype == results[0][1].dtype == dtype
    assert saved and not [s for s in saved if s[0] == torch.float32 and s[1] >= x.numel()], saved
    eps = torch.finfo(dtype).eps
    for got, want in zip(*results):
        torch.testing.assert_close(got.double(), want, rtol=eps, atol=eps * want.abs().max().item() / 100)
