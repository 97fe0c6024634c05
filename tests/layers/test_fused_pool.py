"""The fused CPU kernels as torch operators: opcheck, torch.compile(fullgraph=True), torch.export, threads,
and the fallback when no compiler is there. Their values and gradients are checked against the plain path
by every test of the soft family (the ``pool_path`` fixture runs each on both paths)."""

from __future__ import annotations

import pytest
import torch

from gatepool.layers import GATES, GatedPool2d, c_kernels, fused_pool, soft_pool2d
from gatepool.layers.windows import pool_geometry, project
from gatepool.models import create_model

pytestmark = pytest.mark.skipif(not fused_pool.available(), reason="no fused kernels here (no C compiler)")

EAGER_NODE = "torch::autograd::CppNode<gatepool::SoftmaxPoolEager>"  # the eager C++ operator's node
GEOMETRIES = [(2, 2, 0, 1, False), (3, 2, 1, 1, True), (3, 1, 1, 2, False)]
KINDS = ["soft", "soft-per-channel", "soft-log-tau", "attention", "attention-weights"]  # τ (1), (C), log τ


def op_args(d, geo, scores, per_channel, dtype, channels_last=False, channels=3):
    """x, scores (None; True: a score map (N, 1, *spatial); "weights": score weights (C,)), τ, geometry."""
    k, s, p, dl, ceil = geo
    shape = {1: (2, channels, 9), 2: (2, channels, 7, 8), 3: (2, channels, 5, 6, 5)}[d]
    x = torch.randn(shape, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    tau = (torch.rand(channels if per_channel else 1, dtype=dtype) + 0.5).requires_grad_()
    if scores == "weights":
        sc = torch.randn(channels, dtype=dtype, requires_grad=True)
    else:
        sc = torch.randn(shape[0], 1, *shape[2:], dtype=dtype, requires_grad=True) if scores else None
    g = fused_pool.encode(pool_geometry(x, d, k, s, p, dl, ceil))
    return x, sc, tau, g


@pytest.mark.slow
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("geo", GEOMETRIES)
@pytest.mark.parametrize("kind", KINDS)
def test_opcheck(d, geo, kind):
    torch.manual_seed(0)
    scores = {"attention": True, "attention-weights": "weights"}.get(kind)
    for dtype in (torch.float32, torch.float64):
        args = op_args(d, geo, scores, kind != "soft", dtype, channels_last=d == 2)
        log_tau = kind == "soft-log-tau"  # tau is then log τ: any sign
        torch.library.opcheck(torch.ops.gatepool.softmax_pool.default, (*args, log_tau))


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("geo", GEOMETRIES)
@pytest.mark.parametrize("channels", [1, 3, 37])  # one channel: the score is still one per position
def test_score_weights_equal_the_score_map_they_make(d, geo, channels):
    """Score weights w (s_j = w · v_j in the kernel) against the map w · v made outside and passed in:
    the values, and the gradients of x, w and τ (the chain rule through the map by autograd)."""
    torch.manual_seed(0)
    x, w, tau, g = op_args(d, geo, "weights", False, torch.float64, channels_last=d == 2, channels=channels)
    x = (3 * x).detach().requires_grad_()  # peaked gates: g_j (v_j − out) far from 0
    out, stats = torch.ops.gatepool.softmax_pool(x, w, tau, g)
    grad = torch.randn_like(out)
    got = torch.autograd.grad((out * grad).sum(), (x, w, tau))
    score_map = torch.einsum("nc...,c->n...", x, w).unsqueeze(1)
    ref, ref_stats = torch.ops.gatepool.softmax_pool(x, score_map, tau, g)
    expected = torch.autograd.grad((ref * grad).sum(), (x, w, tau))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(stats, ref_stats)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_backward_takes_the_forwards_gates_at_large_scores(dtype):
    """a · s ≈ 1e5: the forward's top z = a · s − m may come out a hair over 0 (a fused multiply-add keeps
    the product unrounded), and the backward takes it as the forward did: the gates sum to 1, ∂out/∂x = 1
    at the top (clamped to 0 there, the top's gate was 1/den = 0.9977 in float32)."""
    x = torch.tensor([[[[34112.0, 15208.0], [-15312.0, 100.0]]]], dtype=dtype, requires_grad=True)
    (g,) = torch.autograd.grad(soft_pool2d(x, 2, temperature=0.5).sum(), x)
    want = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]], dtype=dtype)
    torch.testing.assert_close(g, want, rtol=0, atol=8 * torch.finfo(dtype).eps)


@pytest.mark.parametrize("log_tau", [False, True])
def test_opcheck_backward(log_tau):
    torch.manual_seed(0)
    x, sc, tau, g = op_args(2, GEOMETRIES[1], False, True, torch.float64)
    out, stats = torch.ops.gatepool.softmax_pool(x, sc, tau, g, log_tau)
    grad = torch.randn_like(out)
    args = (grad, x.detach(), None, tau.detach(), out.detach(), stats, g, True, log_tau)
    torch.library.opcheck(torch.ops.gatepool.softmax_pool_backward.default, args)


def _through(path, x, sc, tau, geo, **kwargs):
    """``fused_pool.softmax_pool`` on ``path`` ("eager": the C kernel called directly; "op": the custom op):
    the output, its strides and the gradients of x, the scores, τ (or log τ) and a projection (``kwargs``)
    for a fixed random upstream gradient."""
    x, tau = x.detach().requires_grad_(), tau.detach().requires_grad_()
    sc = None if sc is None else sc.detach().requires_grad_()
    v = kwargs.get("projection")
    kwargs = {**kwargs, "projection": v.detach().requires_grad_()} if v is not None else kwargs
    with pytest.MonkeyPatch.context() as m:
        if path == "op":
            m.setattr(fused_pool, "eager", lambda *args: False)
        out = fused_pool.softmax_pool(x, sc, tau, geo, **kwargs)
    node = out.grad_fn.name()
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype))
    grads = [x.grad, tau.grad, None if sc is None else sc.grad]
    grads += [kwargs["projection"].grad] if v is not None else []
    return node, out, out.stride(), x.grad.stride(), grads


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("geo", GEOMETRIES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_eager_path_is_the_op_bit_for_bit(d, geo, kind, channels_last):
    """The eager path (the C kernel called from an autograd Function) against the op it stands in for:
    the same values, gradients and memory formats, bit for bit, in every dtype the C kernel takes, at one
    thread and two (the per-thread partial sums of ∂L/∂τ and ∂L/∂w); "soft-log-tau": τ given as log τ,
    the learned gate's parameter (its gradient ∂L/∂log τ from the op)."""
    torch.manual_seed(0)
    scores = {"attention": True, "attention-weights": "weights"}.get(kind)
    options = {"log_tau": True} if kind == "soft-log-tau" else {}
    before = torch.get_num_threads()
    cases = ((torch.float32, 1), (torch.float32, 2), (torch.float64, 2), (torch.float16, 2),
             (torch.bfloat16, 1))  # fmt: skip
    for dtype, threads in cases:
        torch.set_num_threads(threads)
        x, sc, tau, g = op_args(d, geo, scores, kind.startswith("soft-"), dtype, channels_last and d == 2,
                                channels=19)  # fmt: skip
        geometry = fused_pool.decode(g)
        try:
            node, *eager = _through("eager", x, sc, tau, geometry, **options)
            op_node, *op = _through("op", x, sc, tau, geometry, **options)
        finally:
            torch.set_num_threads(before)
        assert node == EAGER_NODE and op_node != node
        assert eager[1:3] == op[1:3]  # strides of out and of ∂L/∂x
        for a, b in zip([eager[0], *eager[3]], [op[0], *op[3]]):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("geo", GEOMETRIES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("size", ["small", "large"])  # the eager operator's loop, and its matrix product
def test_the_eager_projection_is_the_ops_convolution(d, geo, channels_last, size):
    """The attention gate's value projection V inside the eager operator (``projection``) against the op
    followed by the 1×1 convolution: the same values and gradients (x, w, τ and V) up to rounding, at one
    thread and two, NCHW and channels_last, on both sides of its plain loop's size."""
    torch.manual_seed(0)
    channels = 5 if size == "small" else 37
    before = torch.get_num_threads()
    for dtype, threads in ((torch.float32, 1), (torch.float64, 2), (torch.bfloat16, 1)):
        torch.set_num_threads(threads)
        x, w, tau, g = op_args(d, geo, "weights", False, dtype, channels=channels)
        if size == "large":  # rows · C² above the loop's limit
            x = x.detach().repeat(1, 1, *[{1: 8, 2: 3, 3: 2}[d]] * d)
        if channels_last and d == 2:
            x = x.contiguous(memory_format=torch.channels_last)
        v = torch.randn(channels, channels, *[1] * d, dtype=w.dtype)
        w = w.view(1, channels, *[1] * d) if threads == 2 else w  # the score's 1×1 conv weight, or (C,)
        geometry = pool_geometry(x, d, *geo)
        try:
            node, *eager = _through("eager", x, w, tau, geometry, projection=v)
            op_node, *op = _through("op", x, w, tau, geometry, projection=v)
        finally:
            torch.set_num_threads(before)
        assert node == EAGER_NODE and op_node != node
        assert eager[1:3] == op[1:3]  # strides of out and of ∂L/∂x
        # another order of the same sums (∂L/∂V sums over every output position)
        tol = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 2e-2}[dtype]
        for a, b in zip([eager[0], *eager[3]], [op[0], *op[3]]):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_projection_and_log_tau_arguments():
    x, w, tau, g = op_args(2, GEOMETRIES[0], "weights", False, torch.float32)
    geo, v = fused_pool.decode(g), torch.eye(3).view(3, 3, 1, 1)
    with pytest.raises(ValueError, match="projection needs score weights"):
        fused_pool.softmax_pool(x, None, tau, geo, projection=v)
    dilated = pool_geometry(torch.zeros(1, 3, 2, 2), 2, 2, 1, 1, 3)  # windows that read no input
    with pytest.raises(ValueError, match="has_empty_windows"):
        fused_pool.softmax_pool(torch.zeros(1, 3, 2, 2), w, tau, dilated, projection=v)
    with pytest.raises(TypeError, match="log_tau=True takes log τ as a tensor"):
        fused_pool.softmax_pool(x, None, 0.5, geo, log_tau=True)
    out = fused_pool.softmax_pool(x, w, tau, geo, projection=v)  # V = I: the pool itself
    torch.testing.assert_close(out, fused_pool.softmax_pool(x, w, tau, geo))
    torch.testing.assert_close(project(out, 2 * v), 2 * out)


@pytest.mark.parametrize("eager", [True, False])
def test_gradcheck_and_gradgradcheck_with_log_tau_and_projection(eager, monkeypatch):
    """∂/∂log τ and ∂/∂V (the eager operator's own, or the op's and the convolution's), and their double
    backward (through the plain path), against finite differences."""
    torch.manual_seed(0)
    if not eager:
        monkeypatch.setattr(fused_pool, "eager", lambda *args: False)
    x = torch.randn(1, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    log_tau = torch.tensor([-0.3, 0.2, 0.5], dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 3, 1, 1, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor([0.8], dtype=torch.float64, requires_grad=True)
    geo = pool_geometry(x, 2, 3, 2, 1, 1, True)

    def soft(a, t):
        return fused_pool.softmax_pool(a, None, t, geo, log_tau=True)

    def attention(a, s, t, p):
        return fused_pool.softmax_pool(a, s, t, geo, projection=p)

    assert (soft(x, log_tau).grad_fn.name() == EAGER_NODE) == eager
    assert (attention(x, w, tau, v).grad_fn.name() == EAGER_NODE) == eager
    for f, inputs in ((soft, (x, log_tau)), (attention, (x, w, tau, v))):
        assert torch.autograd.gradcheck(f, inputs)
        assert torch.autograd.gradgradcheck(f, inputs)


def test_the_eager_path_steps_aside_for_what_must_see_the_op():
    """Fake tensors, a dispatch mode, a function mode, torch.func and tracing get the op; a plain call not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x, tau = torch.randn(2, 3, 4, 4), torch.ones(1)
    assert fused_pool.eager(x, None, tau)
    assert fused_pool.eager(x.half(), None, tau) and not fused_pool.eager(x.to(torch.int32), None, tau)
    with Passing():
        assert not fused_pool.eager(x, None, tau)
    with torch.device("cpu"):  # a function mode
        assert not fused_pool.eager(x, None, tau)
    with FakeTensorMode() as mode:
        assert not fused_pool.eager(mode.from_tensor(x), None, tau)
    seen = []
    torch.func.vmap(lambda t: seen.append(fused_pool.eager(t, None, tau)) or t)(x)
    assert seen == [False]
    torch.jit.trace(lambda t: seen.append(fused_pool.eager(t, None, tau)) or t * 1, (x,), check_trace=False)
    assert seen == [False, False]


def test_double_backward_through_the_eager_path():
    """``create_graph=True``: the eager Function's backward goes through the plain path's graph, so the
    gradient is itself differentiable (the same as the plain path's)."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)
    geometry = pool_geometry(x, 2, 3, 2, 1, 1, True)
    out = fused_pool.softmax_pool(x, None, tau, geometry)
    assert out.grad_fn.name() == EAGER_NODE
    assert torch.autograd.gradgradcheck(lambda a, t: fused_pool.softmax_pool(a, None, t, geometry), (x, tau))


@pytest.mark.slow
def test_gradcheck_through_the_op():
    torch.manual_seed(0)
    for kind in ("soft-per-channel", "attention", "attention-weights"):
        scores = {"attention": True, "attention-weights": "weights"}.get(kind)
        x, sc, tau, g = op_args(2, GEOMETRIES[1], scores, kind == "soft-per-channel", torch.float64)
        inputs = (x, sc, tau) if sc is not None else (x, tau)

        def f(*a, g=g, sc=sc):
            return torch.ops.gatepool.softmax_pool(a[0], a[1] if sc is not None else None, a[-1], g)[0]

        assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("gate", GATES)
def test_compile_fullgraph_and_export_residual_cnn(gate):
    torch.manual_seed(0)
    model = create_model("residual_cnn", pool=gate, width=8)
    x = torch.randn(4, 1, 28, 28)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # the ops trace as single nodes
    torch.testing.assert_close(compiled(x), model(x))
    loss = compiled(x).sum()
    loss.backward()  # the registered backward traces too
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    exported = torch.export.export(model, (x,))
    torch.testing.assert_close(exported.module()(x), model(x))
    if gate in ("soft", "soft-learned", "attention"):
        assert "gatepool.softmax_pool" in str(exported.graph)


def test_threads_do_not_change_the_result():
    torch.manual_seed(0)
    pool = GatedPool2d(3, 2, 1, gate="soft-learned", channels=16)
    x = torch.randn(8, 16, 12, 12, requires_grad=True)
    results = []
    for threads in (1, 2):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            out = pool(x)
            gx, gt = torch.autograd.grad(out.square().sum(), (x, pool.log_temperature))
        finally:
            torch.set_num_threads(before)
        results.append((out, gx, gt))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    # ∂L/∂τ sums per-thread float32 partial sums: another order of the same terms, a few ulp apart
    torch.testing.assert_close(results[0][2], results[1][2], rtol=1e-5, atol=0)


def test_no_compiler_warns_once_and_the_pure_pytorch_path_takes_over(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    c_kernels._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="could not be built.*pure-PyTorch paths"):
            assert not fused_pool.available()
        x = torch.randn(2, 3, 6, 6, requires_grad=True)
        assert not fused_pool.usable(x)
        out = GatedPool2d(2, gate="soft")(x)
        assert type(out.grad_fn).__name__ == "_TiledSoftPoolBackward"
    finally:
        monkeypatch.undo()
        c_kernels._library.cache_clear()
    assert fused_pool.available()  # and back, for the tests after this one


def test_no_cxx_compiler_warns_once_and_the_op_takes_the_eager_calls(tmp_path, monkeypatch):
    """Without the C++ operator (no C++ compiler) eager CPU calls take the Python op: the same kernels."""
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    want = GatedPool2d(2, gate="soft")(x)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-cxx"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    c_kernels.eager_op.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="C\\+\\+ operator.*could not be built.*take the Python op"):
            out = GatedPool2d(2, gate="soft")(x)
        assert not fused_pool.eager(x, None, torch.ones(1)) and fused_pool.available()
        below = [f.name() for f, _ in out.grad_fn.next_functions if f]  # under the copy back to NCHW
        assert any("gatepool_softmax_pool" in n for n in below) and torch.equal(out, want)
    finally:
        monkeypatch.undo()
        c_kernels.eager_op.cache_clear()
    assert fused_pool.eager(x, None, torch.ones(1))  # and back, for the tests after this one


@pytest.mark.slow
def test_the_build_is_cached_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _unoptimized(monkeypatch)
    c_kernels._library.cache_clear()
    try:
        assert fused_pool.available()
        (built,) = (tmp_path / "cache" / "gatepool" / "kernels").glob("softmax_pool-*.so")
        stamp = built.stat().st_mtime_ns
        c_kernels._library.cache_clear()
        assert fused_pool.available() and built.stat().st_mtime_ns == stamp  # loaded, not rebuilt
        assert [p.name for p in built.parent.iterdir()] == [built.name]  # no temp file left behind
    finally:
        monkeypatch.undo()
        c_kernels._library.cache_clear()


# ------------------------------------------------------------------------------------------ the boundary


def _unoptimized(monkeypatch):
    """Builds at -O0 (3.5 s, not -O3's 22 s on the 2-core VM): for the tests of what a build is (its
    cache, its layout check), not of what its code computes."""
    monkeypatch.setattr(c_kernels, "FLAGS", ["-O0" if f == "-O3" else f for f in c_kernels.FLAGS])


def _altered_copy(tmp_path, old, new):
    """A copy of the kernels' sources with ``old`` replaced by ``new`` in the one file that has it: the
    copy's .c path."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    for path in c_kernels.SOURCE.parent.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    (altered,) = [p for p in folder.iterdir() if old in p.read_text()]
    text = altered.read_text()
    assert text.count(old) == 1
    altered.write_text(text.replace(old, new))
    return folder / c_kernels.SOURCE.name


def test_the_structs_match_the_c_side():
    lib = c_kernels._library()
    buf = __import__("ctypes").create_string_buffer(4096)
    lib.gp_layout(buf, len(buf))
    assert buf.value.decode() == c_kernels.layout()  # the check load() makes, field by field
    assert "gp_geometry.dilation" in c_kernels.layout() and "gp_tensors.ga" in c_kernels.layout()


@pytest.mark.parametrize(
    "old, new, where",
    [
        ("int64_t n, c, cs, ca;", "int64_t c, n, cs, ca;", "gp_geometry.n"),  # two fields swapped
        ("int64_t n, c, cs, ca;", "int64_t n, c, cs, ca, extra;", "gp_geometry 184"),  # one more: the size
        ("const void *v, *s, *a;", "const void *s, *v, *a;", "gp_tensors.v"),
    ],
)
def test_a_c_side_that_disagrees_fails_at_load(tmp_path, monkeypatch, old, new, where):
    _unoptimized(monkeypatch)
    source = _altered_copy(tmp_path, old, new)
    lib = c_kernels.build(source, tmp_path / "cache")
    with pytest.raises(RuntimeError, match=f"disagree.*C says '{where}"):
        c_kernels.load(lib)


def test_a_python_side_that_disagrees_fails_at_load():
    import ctypes

    class Shorter(ctypes.Structure):  # the geometry without its last field
        _fields_ = c_kernels.Geometry._fields_[:-1]

    lib = c_kernels.build()
    c_kernels.load(lib)  # the real one loads
    structs = {"gp_geometry": Shorter, "gp_tensors": c_kernels.Tensors}
    with pytest.raises(RuntimeError, match="disagree at line 1 .*Python says 'gp_geometry 152'"):
        c_kernels.load(lib, structs)


@pytest.mark.parametrize("channels", [1, 15, 16, 17, 33, 48])  # blocks of 16 floats, 8 doubles, the rest
@pytest.mark.parametrize("geo", GEOMETRIES[:2])
def test_every_channel_block_against_the_plain_path(channels, geo):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = (3 * torch.randn(2, channels, 7, 8, dtype=dtype)).contiguous(memory_format=torch.channels_last)
        x[0, -1, 1, 1] = float("-inf")  # one lane redone by the limits, in the last block
        x.requires_grad_()
        tau = (torch.rand(channels, dtype=dtype) + 0.5).requires_grad_()
        g = pool_geometry(x, 2, *geo)
        out = fused_pool.softmax_pool(x, None, tau, g)
        want = fused_pool._plain(x, None, tau, g)
        torch.testing.assert_close(out, want)
        grad = torch.randn_like(out)
        # ∂L/∂τ is a signed sum over every window: two float32 summation orders differ by more than
        # float32's rtol there, so it is compared in float64 (the same blocks, 8 lanes wide) only
        inputs = (x, tau) if dtype == torch.float64 else (x,)
        got = torch.autograd.grad(out, inputs, grad)
        for a, b in zip(got, torch.autograd.grad(want, inputs, grad)):
            torch.testing.assert_close(a, b)


# score weights: up to 4 channel blocks in registers (64 floats, 32 doubles: 1 block to 4, whole or with a
# rest), more on the loops over channels; 65 floats and 33 doubles are past the blocks
@pytest.mark.parametrize("channels", [1, 15, 16, 17, 30, 32, 33, 48, 50, 64, 65])
@pytest.mark.parametrize("geo", GEOMETRIES[:2])  # tiling (each gradient written once), overlapping (added)
def test_score_weights_in_every_channel_block_against_the_plain_path(channels, geo):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = (3 * torch.randn(2, channels, 7, 8, dtype=dtype)).contiguous(memory_format=torch.channels_last)
        x[1, 0, 2, 3] = float("inf")  # a window whose score is not finite: redone by the limits
        x.requires_grad_()
        w = (torch.randn(channels, dtype=dtype) / channels**0.5).requires_grad_()  # the gate's init
        tau = torch.tensor([0.7], dtype=dtype, requires_grad=True)
        g = pool_geometry(x, 2, *geo)
        out = fused_pool.softmax_pool(x, w, tau, g)
        want = fused_pool._plain(x, w, tau, g)
        torch.testing.assert_close(out, want, equal_nan=True)
        grad = torch.randn_like(out)
        # ∂L/∂w and ∂L/∂τ are signed sums over every window, as ∂L/∂τ above: float64 only
        inputs = (x, w, tau) if dtype == torch.float64 else (x,)
        got = torch.autograd.grad(out, inputs, grad)
        for a, b in zip(got, torch.autograd.grad(want, inputs, grad)):
            torch.testing.assert_close(a, b, equal_nan=True)
