"""The Triton kernels (``gatepool.layers.triton_pool``) against the plain path, values and gradients.

Without a GPU they run under Triton's interpreter on CPU tensors: ``TRITON_INTERPRET=1`` must be set
before ``triton.language`` is first imported, so this module sets it at its top when no CUDA device is
there and triton is not imported yet (collection imports it first, before any test runs). Where triton
was already imported without it, the module's tests run again in a fresh interpreter, in a subprocess.
With a GPU the same tests run on CUDA tensors, and the ``gpu`` tests check the registered ops there
(dispatch from the layers, opcheck, gradcheck, torch.compile).

The reference is the plain unfold path of ``layers.windows`` (``softmax_pool_unfold`` over
``scale_scores``) in float64, differentiated by autograd; the limits of non-finite windows are checked
against the C kernel's op, which the soft family's tests hold to the plain path.
"""

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_FRESH = "triton" not in sys.modules
if not torch.cuda.is_available() and _FRESH:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton.language is imported and the kernels wrapped

pytest.importorskip("triton")

from gatepool.layers import GatedPool2d, fused_pool, triton_pool  # noqa: E402
from gatepool.layers.windows import (  # noqa: E402
    channel_view,
    pool_geometry,
    scale_scores,
    soft_pool_unfold,
    softmax_pool_unfold,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
RUNNABLE = CUDA or os.environ.get("TRITON_INTERPRET") == "1"  # (set before triton's import: see above)
# the interpreter computes in numpy, which warns where the kernels meet inf − inf in lanes they mask off
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow):RuntimeWarning")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

# kernel, stride, padding, dilation, ceil_mode: tiled, overlapping with ceil_mode, dilated
GEOMETRIES = [(2, 2, 0, 1, False), (3, 2, 1, 1, True), (3, 1, 1, 2, False)]
SHAPES = {1: (2, 3, 9), 2: (2, 3, 7, 8), 3: (2, 3, 5, 6, 5)}
KINDS = ["soft", "soft-per-channel", "attention"]


@pytest.fixture(autouse=True)
def _runnable(request):
    if not RUNNABLE and request.node.name not in (
        "test_in_a_fresh_interpreter",
        "test_the_kernels_compile_for_a_gpu_without_one",
    ):
        pytest.skip("triton was imported without TRITON_INTERPRET: test_in_a_fresh_interpreter runs these")


def channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with channels-last memory (any number of spatial dims)."""
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def make(d, kind, dtype=torch.float64, layout="nchw", shape=None, scale=1.0, seed=0):
    """values, scores (None for soft pooling), tau: float64 masters on the CPU."""
    g = torch.Generator().manual_seed(seed)
    shape = shape or SHAPES[d]
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    scores = None
    if kind == "attention":
        scores = (torch.randn(shape[0], 1, *shape[2:], generator=g, dtype=torch.float64) * scale).to(dtype)
    n_tau = shape[1] if kind == "soft-per-channel" else 1
    tau = (torch.rand(n_tau, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    if layout == "channels_last":
        x = channels_last(x)
        scores = None if scores is None else channels_last(scores)
    return x, scores, tau


def reference(x, scores, tau, geo, grad):
    """The plain path in float64: out and (∂/∂values, ∂/∂scores or None, ∂/∂τ) by autograd."""
    x = x.detach().double().requires_grad_()
    tau = tau.detach().double().requires_grad_()
    s = None if scores is None else scores.detach().double().requires_grad_()
    tau_view = channel_view(tau, geo.dim) if tau.numel() > 1 else tau.reshape(())
    out = softmax_pool_unfold(x, scale_scores(x if s is None else s, tau_view), geo)[0]
    inputs = [x, tau] if s is None else [x, s, tau]
    grads = torch.autograd.grad(out, inputs, grad.double())
    gx, gs, gt = (grads[0], None, grads[1]) if s is None else grads
    return out.detach(), gx, gs, gt


def triton_run(x, scores, tau, geo, grad, tau_grad=True):
    """forward and backward launchers on DEVICE; results back on the CPU."""
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731  (.to keeps the memory format)
    out, stats = triton_pool.forward(to(x), to(scores), to(tau), geo)
    gv, gs, gt = triton_pool.backward(to(grad), to(x), to(scores), to(tau), out, stats, geo, tau_grad)
    cpu = lambda t: t.cpu()  # noqa: E731
    return cpu(out), cpu(stats), cpu(gv), (None if scores is None else cpu(gs)), cpu(gt)


FUSED_BACKWARD = "GeneratedBackwardFor_gatepool_softmax_pool_defaultBackward"  # the op's autograd node


def graph_nodes(out: torch.Tensor, depth: int = 6) -> set[str]:
    """The names of the autograd nodes within ``depth`` steps of ``out``."""
    names, frontier = set(), [out.grad_fn]
    for _ in range(depth):
        frontier = [f for f in frontier if f is not None]
        names |= {type(f).__name__ for f in frontier}
        frontier = [g for f in frontier for g, _ in f.next_functions]
    return names


def assert_layout(t: torch.Tensor, like: torch.Tensor) -> None:
    """channels-last in, channels-last out; NCHW in, NCHW out."""
    if like.movedim(1, -1).is_contiguous():
        assert t.movedim(1, -1).is_contiguous()
    else:
        assert t.is_contiguous()


# ------------------------------------------------------------------------------ float64: tight agreement


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("geom", GEOMETRIES, ids=["tiled", "overlap-ceil", "dilated"])
@pytest.mark.parametrize("kind", KINDS)
def test_values_and_gradients_match_the_plain_path(d, geom, kind):
    k, s, p, dl, ceil = geom
    layout = "channels_last" if (d + GEOMETRIES.index(geom)) % 2 else "nchw"  # both, across the grid
    x, scores, tau = make(d, kind, layout=layout)
    geo = pool_geometry(x, d, k, s, p, dl, ceil)
    grad = torch.randn((x.shape[0], x.shape[1], *geo.out_size), dtype=torch.float64)
    out, stats, gv, gs, gt = triton_run(x, scores, tau, geo, grad)
    r_out, r_gv, r_gs, r_gt = reference(x, scores, tau, geo, grad)
    tol = {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(out, r_out, **tol)
    torch.testing.assert_close(gv, r_gv, **tol)
    torch.testing.assert_close(gt, r_gt, **tol)
    if scores is not None:
        torch.testing.assert_close(gs, r_gs, **tol)
        assert_layout(gs, scores)
    assert_layout(out, x)
    assert_layout(gv, x)
    assert stats.shape == (2, x.shape[0], *geo.out_size, 1 if scores is not None else x.shape[1])


def test_stats_are_the_c_ops_stats():
    """Same layout and meaning as ``gatepool::softmax_pool``'s: each backward runs on the other's stats."""
    if not fused_pool.available():
        pytest.skip("no C kernels here")
    for kind in ("soft-per-channel", "attention"):
        x, scores, tau = make(2, kind, layout="channels_last")
        geo = pool_geometry(x, 2, 3, 2, 1, 1, True)
        g = fused_pool.encode(geo)
        c_out, c_stats = torch.ops.gatepool.softmax_pool(x, scores, tau, g)
        out, stats, *_ = triton_run(x, scores, tau, geo, torch.zeros_like(c_out))
        torch.testing.assert_close(stats, c_stats, rtol=1e-12, atol=0)
        grad = torch.randn_like(c_out)
        c_grads = torch.ops.gatepool.softmax_pool_backward(grad, x, scores, tau, c_out, c_stats, g, True)
        to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
        t_grads = triton_pool.backward(*map(to, (grad, x, scores, tau, c_out, c_stats)), geo, True)
        for c_g, t_g in zip(c_grads, t_grads):
            torch.testing.assert_close(t_g.cpu(), c_g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["soft", "soft-per-channel", "attention"])
def test_the_ops_cuda_kernels_take_log_tau(kind):
    """The op's CUDA forward and backward with ``log_tau`` (soft-learned's parameter, the eager C++
    operator's path on the CPU): τ = exp(log τ) goes into Triton and ∂L/∂log τ = ∂L/∂τ · τ comes out,
    against the float64 plain path; and the same as the C kernel's ``log_tau``."""
    x, scores, tau = make(2, kind, layout="channels_last")
    geo = pool_geometry(x, 2, 3, 2, 1, 1, True)
    g = fused_pool.encode(geo)
    grad = torch.randn((x.shape[0], x.shape[1], *geo.out_size), dtype=torch.float64)
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    log_tau = to(tau.log())
    out, stats = fused_pool._op_forward_cuda(to(x), to(scores), log_tau, g, log_tau=True)
    gv, gs, gt = fused_pool._op_backward_cuda(to(grad), to(x), to(scores), log_tau, out, stats, g, True, True)
    r_out, r_gv, r_gs, r_gt = reference(x, scores, tau, geo, grad)
    tol = {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(out.cpu(), r_out, **tol)
    torch.testing.assert_close(gv.cpu(), r_gv, **tol)
    torch.testing.assert_close(gt.cpu(), r_gt * tau, **tol)  # ∂L/∂log τ
    if scores is not None:
        torch.testing.assert_close(gs.cpu(), r_gs, **tol)
    if fused_pool.available():
        c_out, c_stats = torch.ops.gatepool.softmax_pool(x, scores, tau.log(), g, True)
        backward = torch.ops.gatepool.softmax_pool_backward
        c_grads = backward(grad, x, scores, tau.log(), c_out, c_stats, g, True, True)
        for c_g, t_g in zip((c_out, *c_grads), (out, gv, gs, gt)):
            if t_g is not None:
                torch.testing.assert_close(t_g.cpu(), c_g, **tol)


def test_overlapping_backward_is_deterministic_and_covers_every_input():
    """k=3, s=2, p=1: inputs read by up to 4 windows (2-D); the gather writes each gradient once."""
    x, _, tau = make(2, "soft-per-channel", dtype=torch.float32, shape=(2, 5, 9, 9))
    geo = pool_geometry(x, 2, 3, 2, 1)
    grad = torch.randn((2, 5, *geo.out_size))
    first = triton_run(x, None, tau, geo, grad)
    second = triton_run(x, None, tau, geo, grad)
    assert all(torch.equal(a, b) for a, b in zip(first, second) if a is not None)
    r_out, r_gv, _, r_gt = reference(x, None, tau, geo, grad)
    torch.testing.assert_close(first[2].double(), r_gv, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(first[4].double(), r_gt, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("channels", [1, 3])
def test_a_score_per_channel_and_a_single_channel(channels, dtype):
    """Scores ``(N, C, *S)`` (C = 1: the shared score is the channel's own), one τ: the op allows both;
    fp16 within its rounding (∂τ, whose terms cancel, too)."""
    x, _, tau = make(2, "soft", shape=(2, channels, 6, 7), dtype=dtype)
    scores = make(2, "soft", shape=(2, channels, 6, 7), seed=1, dtype=dtype)[0]
    geo = pool_geometry(x, 2, 3, 2, 1, 1, True)
    grad = torch.randn((2, channels, *geo.out_size), dtype=torch.float64).to(dtype)
    out, stats, gv, gs, gt = triton_run(x, scores, tau, geo, grad)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 4e-3, "atol": 4e-3}
    for got, want in zip((out, gv, gs, gt), reference(x, scores, tau, geo, grad)):
        torch.testing.assert_close(got.double(), want, **tol)


def test_empty_batch():
    x, _, tau = make(2, "soft-per-channel", shape=(0, 3, 6, 6))
    geo = pool_geometry(x, 2, 3, 2, 1)
    out, stats, gv, gs, gt = triton_run(x, None, tau, geo, torch.zeros((0, 3, *geo.out_size), dtype=x.dtype))
    assert out.shape == (0, 3, 3, 3) and gv.shape == x.shape
    assert torch.equal(gt, torch.zeros(3, dtype=x.dtype))


def test_any_strides_of_grad_out():
    """autograd may hand the backward an expanded ∂L/∂out (stride 0, from ``out.sum()``): read as it is."""
    x, scores, tau = make(2, "attention", shape=(2, 3, 6, 6))
    geo = pool_geometry(x, 2, 3, 2, 1)
    grad = torch.ones((), dtype=x.dtype).expand(2, 3, *geo.out_size)
    got = triton_run(x, scores, tau, geo, grad)
    want = reference(x, scores, tau, geo, grad.contiguous())
    for g, w in zip((got[0], got[2], got[3], got[4]), want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_no_tau_grad_and_inputs_no_window_reads():
    """tau_grad=False gives an empty ∂τ; trailing inputs no window reads (floor mode) get gradient 0."""
    x, _, tau = make(2, "soft", shape=(1, 2, 7, 7))
    geo = pool_geometry(x, 2, 2)  # 3 × 3 windows over 7 × 7: row and column 6 unread
    grad = torch.randn((1, 2, 3, 3), dtype=torch.float64)
    out, stats, gv, gs, gt = triton_run(x, None, tau, geo, grad, tau_grad=False)
    assert gt.numel() == 0 and gs is None
    assert (gv[..., 6, :] == 0).all() and (gv[..., :, 6] == 0).all()
    torch.testing.assert_close(gv, reference(x, None, tau, geo, grad)[1], rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------- numerics and limits


@pytest.mark.parametrize("kind", KINDS)
def test_large_inputs_stay_finite(kind):
    """±1e4 (and τ = 0.5 … 1.5): the max is subtracted before exp, so nothing overflows."""
    x, scores, tau = make(2, kind, dtype=torch.float32, scale=1e4, shape=(2, 4, 6, 6))
    geo = pool_geometry(x, 2, 3, 2, 1)
    grad = torch.randn((2, 4, *geo.out_size))
    out, stats, gv, gs, gt = triton_run(x, scores, tau, geo, grad)
    for t in (out, gv, gt) + (() if gs is None else (gs,)):
        assert t.isfinite().all()
    r_out, r_gv, r_gs, r_gt = reference(x, scores, tau, geo, grad)
    torch.testing.assert_close(out.double(), r_out, rtol=1e-5, atol=1e-2)  # |v| ~ 1e4: float32's ulp ~ 1e-3
    torch.testing.assert_close(gv.double(), r_gv, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(gt.double(), r_gt, rtol=1e-3, atol=1e-6)  # ~0: the gates are near hardmax
    if gs is not None:
        torch.testing.assert_close(gs.double(), r_gs, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["soft-per-channel", "attention"])
@pytest.mark.parametrize("grad_seed", [0, 2])
def test_half_precision_is_computed_in_float32(dtype, kind, grad_seed):
    """fp16/bf16 in and out, float32 inside (stats float32): within the dtype's rounding of fp64's result.

    ∂τ too: it sums terms that cancel, and while the backward read the forward's out rounded to the half
    dtype it missed this bound by up to 29× (bf16, attention, seed 0; soft-per-channel fp16 at seed 2);
    with the residual the forward keeps (stats' second row) zeroed, three of these eight cases fail.
    The upstream gradient has its own seed (the global generator made it depend on the tests run before)."""
    gt, r_gt, eps = _check_half_precision(dtype, kind, grad_seed)
    torch.testing.assert_close(gt.double(), r_gt, rtol=4 * eps, atol=4 * eps * r_gt.abs().max().item())


def _check_half_precision(dtype, kind, grad_seed):
    """The output and the value and score gradients within the dtype's rounding; returns ∂τ, its
    reference and eps."""
    x, scores, tau = make(2, kind, dtype=dtype, layout="channels_last", shape=(2, 4, 7, 7))
    geo = pool_geometry(x, 2, 3, 2, 1)
    g = torch.Generator().manual_seed(grad_seed)
    grad = torch.randn((2, 4, *geo.out_size), generator=g).to(dtype)
    out, stats, gv, gs, gt = triton_run(x, scores, tau, geo, grad)
    assert out.dtype == gv.dtype == gt.dtype == dtype and stats.dtype == torch.float32
    assert_layout(out, x)
    r_out, r_gv, r_gs, r_gt = reference(x, scores, tau, geo, grad)  # from the same rounded inputs
    eps = torch.finfo(dtype).eps  # fp16: 1e-3, bf16: 8e-3
    torch.testing.assert_close(out.double(), r_out, rtol=2 * eps, atol=2 * eps)
    torch.testing.assert_close(gv.double(), r_gv, rtol=4 * eps, atol=4 * eps)
    if gs is not None:
        torch.testing.assert_close(gs.double(), r_gs, rtol=4 * eps, atol=4 * eps * r_gs.abs().max().item())
    return gt, r_gt, eps


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["soft-per-channel", "attention", "score-map"])
def test_half_precision_tau_gradient_where_the_terms_cancel(dtype, kind):
    """Values (and scores) around 4 that differ by ~0.1: out rounded to the half dtype is off by up to half
    its ulp (fp16 2e-3, bf16 2e-2), as much as the v_j − out that ∂τ sums. The backward adds the
    residual the forward kept (out − rounded out) and gets ∂τ within the dtype's rounding; without it
    (the residual zeroed) ∂τ is off by 19-3300× this bound."""
    x, scores, tau = make(2, kind, shape=(2, 4, 7, 7), scale=0.1)
    if kind == "score-map":  # a score per channel: (N, C, *S)
        scores = make(2, kind, shape=(2, 4, 7, 7), scale=0.1, seed=1)[0]
    x, scores = (x + 4).to(dtype), None if scores is None else (scores + 4).to(dtype)
    geo = pool_geometry(x, 2, 3, 2, 1)
    grad = torch.randn((2, 4, *geo.out_size), generator=torch.Generator().manual_seed(1)).to(dtype)
    gt = triton_run(x, scores, tau, geo, grad)[4]
    r_gt = reference(x, scores, tau, geo, grad)[3]  # from the same rounded inputs
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(gt.double(), r_gt, rtol=4 * eps, atol=4 * eps * r_gt.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["soft-per-channel", "attention"])
def test_half_precision_backward_launches_no_forward(dtype, kind, monkeypatch):
    """The fp16/bf16 backward reads the forward's stats (the log-sum-exp and out's residual): it launches
    its one backward kernel and no forward kernel (it once ran the forward again for out in float32)."""
    kernels = triton_pool._kernels()
    launches = []

    class Counted:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launches.append(self.name)
            return self.kernel[grid]

    for name in ("forward", "backward", "backward_shared"):
        monkeypatch.setattr(kernels, name, Counted(name, getattr(kernels, name)))
    x, scores, tau = make(2, kind, dtype=dtype, shape=(1, 3, 5, 5))
    geo = pool_geometry(x, 2, 3, 2, 1)
    triton_run(x, scores, tau, geo, torch.ones((1, 3, *geo.out_size), dtype=dtype))
    assert launches == ["forward", "backward_shared" if kind == "attention" else "backward"]


def non_finite_windows(kind):
    """(1, 2, 6, 6) float64 values (or scores) with windows of each limit (k = s = 2): x, scores, τ."""
    x, scores, tau = make(2, kind, shape=(1, 2, 6, 6))
    target = x if scores is None else scores
    target[0, 0, 0, 0] = float("inf")  # window (0, 0): a top of +inf
    target[0, 0, 0, 5] = float("-inf")  # −inf beside finite taps: gate 0
    target[0, 0, 4:6, 0:2] = float("-inf")  # a window of −inf only
    target[0, 0, 5, 5] = float("nan")  # NaN spoils its own window
    return x, scores, tau


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["soft", "attention"])
def test_half_precision_non_finite_windows_take_the_limits(dtype, kind):
    """The limits in fp16/bf16 (whose stats hold the log-sum-exp, or ±inf and 1/(taps at the top)): the
    float64 kernel's values and gradients on the same inputs, NaN where it has NaN."""
    x, scores, tau = non_finite_windows(kind)
    x, scores = x.to(dtype), None if scores is None else scores.to(dtype)
    geo = pool_geometry(x, 2, 2)
    grad = torch.randn((1, 2, 3, 3), generator=torch.Generator().manual_seed(1)).to(dtype)
    half = triton_run(x, scores, tau, geo, grad)
    wide = triton_run(x.double(), None if scores is None else scores.double(), tau, geo, grad.double())
    eps = torch.finfo(dtype).eps
    for i in (0, 2, 3, 4):  # out, ∂v, ∂s, ∂τ (stats: of another form)
        if half[i] is not None:
            assert half[i].dtype == (tau.dtype if i == 4 else dtype)
            torch.testing.assert_close(half[i].double(), wide[i], rtol=4 * eps, atol=4 * eps, equal_nan=True)


@pytest.mark.parametrize("kind", ["soft", "attention"])
def test_non_finite_windows_take_the_limits(kind):
    """+inf, −inf and NaN: the plain path's outputs, and the C kernel's gradients (max pooling's limits)."""
    x, scores, tau = non_finite_windows(kind)
    geo = pool_geometry(x, 2, 2)
    grad = torch.randn((1, 2, 3, 3), dtype=torch.float64)
    out, stats, gv, gs, gt = triton_run(x, scores, tau, geo, grad)
    r_out = reference(x, scores, tau, geo, grad)[0]
    torch.testing.assert_close(out, r_out, equal_nan=True)
    if scores is None:
        assert out[0, 0, 0, 0] == float("inf") and out[0, 0, 2, 0] == float("-inf")
        assert out[0, 0, 2, 2].isnan() and out[0, 1].isfinite().all()
    else:  # the +inf score takes the whole gate; the NaN score spoils its window in every channel
        assert torch.equal(out[0, :, 0, 0], x[0, :, 0, 0]) and out[0, :, 2, 2].isnan().all()
    if not fused_pool.available():
        return
    c_out, c_stats = torch.ops.gatepool.softmax_pool(x, scores, tau, fused_pool.encode(geo))
    c_grads = torch.ops.gatepool.softmax_pool_backward(grad, x, scores, tau, c_out, c_stats,
                                                       fused_pool.encode(geo), True)  # fmt: skip
    torch.testing.assert_close(gv, c_grads[0], equal_nan=True)
    if scores is not None:
        torch.testing.assert_close(gs, c_grads[1], equal_nan=True)


# ------------------------------------------------------------------------------------ the registration


@pytest.mark.parametrize("channels", [1, 3])
def test_score_weights_through_triton_equal_the_c_op(channels):
    """Score weights (C,) on Triton (the map w · v made for the kernel, the chain rule after it) against
    the C op, which computes the score in the kernel: values, stats and the gradients of x, w and τ."""
    if not fused_pool.available():
        pytest.skip("no fused C kernels here")
    torch.manual_seed(0)
    x = torch.randn(2, channels, 7, 8, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    w, tau = torch.randn(channels, dtype=torch.float64), torch.tensor([0.7], dtype=torch.float64)
    g = fused_pool.encode(pool_geometry(x, 2, 3, 2, 1, 1, True))
    c_out, c_stats = torch.ops.gatepool.softmax_pool(x, w, tau, g)
    t_out, t_stats = fused_pool._op_forward_cuda(x.to(DEVICE), w.to(DEVICE), tau.to(DEVICE), g)
    torch.testing.assert_close(t_out.cpu(), c_out)
    torch.testing.assert_close(t_stats.cpu(), c_stats)
    grad = torch.randn_like(c_out)
    c_grads = torch.ops.gatepool.softmax_pool_backward(grad, x, w, tau, c_out, c_stats, g, True)
    t_args = (t.to(DEVICE) for t in (grad, x, w, tau, t_out, t_stats))
    t_grads = fused_pool._op_backward_cuda(*t_args, g, True)
    for c, t in zip(c_grads, t_grads):
        torch.testing.assert_close(t.cpu(), c)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_score_weights_through_triton_equal_the_c_op(dtype):
    """fp16/bf16 values with score weights: both kernels give out in float32 (the attention gate projects
    it next) and the same gradients of x, w and τ within the half dtype's rounding."""
    if not fused_pool.available():
        pytest.skip("no fused C kernels here")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8).to(dtype)
    w, tau = torch.randn(3), torch.tensor([0.7])
    g = fused_pool.encode(pool_geometry(x, 2, 3, 2, 1))
    c_out, c_stats = torch.ops.gatepool.softmax_pool(x, w, tau, g)
    t_out, t_stats = fused_pool._op_forward_cuda(x.to(DEVICE), w.to(DEVICE), tau.to(DEVICE), g)
    assert t_out.dtype == c_out.dtype == torch.float32
    # Triton reads the score map w · v rounded to the half dtype (the C kernel forms it in float32)
    torch.testing.assert_close(t_out.cpu(), c_out, rtol=2e-2, atol=2e-2)
    grad = torch.randn_like(c_out)
    c_grads = torch.ops.gatepool.softmax_pool_backward(grad, x, w, tau, c_out, c_stats, g, True)
    t_args = (t.to(DEVICE) for t in (grad, x, w, tau, t_out, t_stats))
    t_grads = fused_pool._op_backward_cuda(*t_args, g, True)
    for c, t in zip(c_grads, t_grads):
        assert t.dtype == c.dtype
        torch.testing.assert_close(t.cpu().float(), c.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_the_ops_fake_stats_are_the_kernels(dtype, kind):
    """The shapes the op declares on CUDA (its fake, what torch.compile plans with) are the Triton kernel's:
    stats per channel for fp16/bf16 (their residual is), else per score channel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, scores, tau = make(2, kind, dtype=dtype, shape=(2, 3, 6, 6))
    tau = tau.float()  # as fused_pool.softmax_pool gives it
    geo = pool_geometry(x, 2, 3, 2, 1)
    out, stats = triton_pool.forward(x.to(DEVICE), None if scores is None else scores.to(DEVICE),
                                     tau.to(DEVICE), geo)  # fmt: skip
    with FakeTensorMode():  # CUDA tensors, as the op sees them there (on CPU tensors the C kernel runs)
        fake = [None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
                for t in (x, scores, tau)]  # fmt: skip
        f_out, f_stats = torch.ops.gatepool.softmax_pool(*fake, fused_pool.encode(geo))
    assert (f_out.shape, f_out.stride(), f_out.dtype) == (out.shape, out.stride(), out.dtype)
    assert (f_stats.shape, f_stats.dtype) == (stats.shape, stats.dtype)


def test_launch_arguments_within_budget():
    """Each launch binds every argument in Python (``JITFunction.run``): 29 + 19 (forward) and 48 + 18
    (backward) before the strides were folded into sizes and a layout flag. A change that adds one fails."""
    kernels = triton_pool._kernels()
    budget = {"forward": (13, 20), "backward": (17, 21), "backward_shared": (17, 19)}  # runtime, constexpr
    for name, (runtime, constant) in budget.items():
        params = inspect.signature(getattr(kernels, name).fn).parameters.values()
        constexprs = sum(p.annotation == "constexpr" for p in params)
        assert (len(params) - constexprs, constexprs) == (runtime, constant), name


def test_registered_as_the_ops_cuda_kernels():
    for op in ("gatepool::softmax_pool", "gatepool::softmax_pool_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
    assert triton_pool.available()


def test_gatepool_kernels_0_turns_them_off(monkeypatch):
    monkeypatch.setenv("GATEPOOL_KERNELS", "0")
    triton_pool._importable.cache_clear()
    try:
        assert not triton_pool.available()
    finally:
        monkeypatch.undo()
        triton_pool._importable.cache_clear()
    assert triton_pool.available()


COMPILE_FOR_SM90 = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gatepool.layers import triton_pool

kernels = triton_pool._kernels()
def build(fn, elem, consts):
    stats = "*fp64" if elem == "fp64" else "*fp32"
    sig = {n: "constexpr" if n in consts else (stats if n in ("a_ptr", "stats_ptr", "gt_ptr") else "*" + elem)
           if n.endswith("_ptr") or n in consts else "i32" for n in fn.arg_names}
    consts = {(fn.arg_names.index(n),): v for n, v in consts.items()}
    triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
geo = dict(KD=1, KH=3, KW=3, SD=1, SH=2, SW=2, PD=0, PH=1, PW=1, DD=1, DH=1, DW=1)
for elem, soft, shared, apc in (("fp32", True, False, True), ("fp16", False, True, False),
                                ("bf16", False, False, False)):
    kinds = dict(SOFT=soft, SHARED=shared, A_PER_CHANNEL=apc, HALF=elem != "fp32")
    build(kernels.forward, elem, dict(geo, **kinds, LAST=shared, BLOCK_P=16, BLOCK_C=64, ACC=tl.float32))
    common = dict(geo, TAU_GRAD=True, HALF=elem != "fp32", LAST=not shared, GO_LAST=soft, BLOCK_P=16,
                  BLOCK_C=64, ACC=tl.float32)
    if shared:
        build(kernels.backward_shared, elem, common)
    else:
        build(kernels.backward, elem, dict(common, SOFT=soft, A_PER_CHANNEL=apc))
"""


@pytest.mark.slow
def test_the_kernels_compile_for_a_gpu_without_one():
    """triton.compile for sm_90 (PTX and ptxas, no device needed): the real code generator accepts every
    kernel (the interpreter runs Python, so it would not see a type or constexpr error there)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], env=env, capture_output=True, text=True,
                          timeout=280)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.skipif(RUNNABLE, reason="runs only where this module's tests could not run in-process")
def test_in_a_fresh_interpreter():
    """triton was imported before TRITON_INTERPRET could be set: run this module again in a subprocess."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", __file__, "-m", "not gpu"]
    done = subprocess.run(cmd, env=env, cwd=Path(__file__).parents[2], capture_output=True, text=True,
                          timeout=280)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# ------------------------------------------------------------------------------- on a GPU (make gpu-check)


@gpu
@needs_cuda
@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_cuda_layers_dispatch_to_the_op(gate, layout, monkeypatch):
    # full float32 in cuDNN and cuBLAS: with TF32 (cuDNN's default) the attention gate's 1×1 projection
    # rounds its inputs to 10 bits, and the two paths' pooled maps, float32 roundings apart, went 1e-3 apart
    # in ∂L/∂x on an H200
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    pool = GatedPool2d(3, 2, 1, gate=gate, channels=8).cuda()
    x = torch.randn(4, 8, 15, 15, device="cuda")
    x = (x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x).requires_grad_()
    out = pool(x)
    assert FUSED_BACKWARD in graph_nodes(out)
    assert out.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
    grads = torch.autograd.grad(out.square().sum(), [x, *pool.parameters()])
    with pytest.MonkeyPatch.context() as m:  # the same layer on the plain path
        m.setattr(fused_pool, "usable", lambda t: False)
        ref = pool(x)
        ref_grads = torch.autograd.grad(ref.square().sum(), [x, *pool.parameters()])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@gpu
@needs_cuda
def test_cuda_soft_pool_uses_the_op_in_every_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(2, 4, 8, 8, device="cuda", dtype=dtype)
        assert fused_pool.usable(x)
        out = fused_pool.softmax_pool(x, None, 1.0, pool_geometry(x, 2, 2))
        assert out.dtype == dtype
        torch.testing.assert_close(out, soft_pool_unfold(x.float(), pool_geometry(x, 2, 2))[0].to(dtype))
    assert not fused_pool.usable(torch.randn(2, device="cuda", dtype=torch.float64))


@gpu
@needs_cuda
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_opcheck_and_gradcheck(kind):
    torch.manual_seed(0)
    x, scores, tau = make(2, kind, layout="channels_last")
    x, tau = x.cuda().requires_grad_(), tau.cuda().requires_grad_()
    scores = None if scores is None else scores.cuda().requires_grad_()
    g = fused_pool.encode(pool_geometry(x, 2, 3, 2, 1, 1, True))
    torch.library.opcheck(torch.ops.gatepool.softmax_pool.default, (x, scores, tau, g))
    inputs = (x, tau) if scores is None else (x, scores, tau)

    def f(*a):
        return torch.ops.gatepool.softmax_pool(a[0], None if scores is None else a[1], a[-1], g)[0]

    assert torch.autograd.gradcheck(f, inputs)


@gpu
@needs_cuda
def test_cuda_compile_fullgraph():
    from gatepool.models import create_model

    torch.manual_seed(0)
    model = create_model("residual_cnn", pool="soft-learned", width=8).cuda()
    x = torch.randn(4, 1, 28, 28, device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    compiled(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
