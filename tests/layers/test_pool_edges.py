"""Every gate at torch's edges, in 1-D, 2-D and 3-D: empty batches, ±inf, NaN, views, no grad, half
precision, double backward. The expected behaviour is torch's max pool's (or torch's own kernel's)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gatepool.layers import GATES, GatedPool1d, GatedPool2d, GatedPool3d, soft_pool1d, soft_pool2d

GATED = {1: GatedPool1d, 2: GatedPool2d, 3: GatedPool3d}
MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
SIZE = {1: (8,), 2: (6, 7), 3: (4, 5, 4)}
GEOMETRIES = [  # (kernel, stride, padding, dilation, ceil_mode): tiling (the fast path), padded, dilated
    (2, None, 0, 1, False),
    (3, 2, 1, 1, True),
    (2, 1, 1, 2, False),
]
SOFT_FAMILY = ("soft", "soft-learned", "attention")

pytestmark = pytest.mark.usefixtures("pool_path")  # every test on the fused and the pure-PyTorch paths


def make(gate, d, geo, channels, **kwargs):
    """A pool whose weights are positive (so ±inf stays ±inf through the attention and conv gates)."""
    k, s, p, dl, ceil = geo
    torch.manual_seed(0)
    pool = GATED[d](k, s, p, dl, False, ceil, gate=gate, channels=channels, **kwargs)
    if gate == "attention":
        with torch.no_grad():
            pool.score.weight.abs_()  # a larger input scores higher: the attention gate's max is the max
    return pool


def covering(x, pos, geo):
    """``(N, C, *out)`` bool: the windows that read spatial position ``pos`` (torch's max pool decides)."""
    d = len(pos)
    k, s, p, dl, ceil = geo
    ind = torch.zeros_like(x)
    ind[(slice(None), slice(None), *pos)] = 1.0
    return MAX_POOL[d](ind, k, s, p, dl, ceil_mode=ceil) > 0


def grad_of(pool, x, grad_out=None):
    x = x.detach().clone().requires_grad_()
    out = pool(x)
    grad_out = torch.ones_like(out) if grad_out is None else grad_out
    (g,) = torch.autograd.grad(out, x, grad_out)
    return out, g


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("gate", GATES)
def test_empty_batch_gives_empty_output_and_gradient(d, gate):
    for geo in GEOMETRIES:
        pool = make(gate, d, geo, 3)
        x = torch.randn(0, 3, *SIZE[d], requires_grad=True)
        out = pool(x)
        k, s, p, dl, ceil = geo
        assert out.shape == MAX_POOL[d](x.detach(), k, s, p, dl, ceil_mode=ceil).shape  # (0, 3, *out)
        out.sum().backward()
        assert x.grad.shape == x.shape
        for q in pool.parameters():  # the gate's weights get a gradient, of zeros
            assert q.grad is not None and not q.grad.any()


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("gate", GATES)
def test_nan_spoils_only_the_windows_that_read_it(d, gate):
    torch.manual_seed(d)
    x = torch.randn(2, 3, *SIZE[d])
    pos = tuple(n // 2 for n in SIZE[d])
    for geo in GEOMETRIES:
        pool = make(gate, d, geo, 3)
        clean, g_clean = grad_of(pool, x)
        xn = x.clone()
        xn[(slice(None), slice(None), *pos)] = float("nan")  # every channel: the attention gate mixes them
        out, g = grad_of(pool, xn)
        hit = covering(x, pos, geo)
        assert hit.any() and not hit.all()
        assert out[hit].isnan().all(), geo
        torch.testing.assert_close(out[~hit], clean[~hit], msg=lambda m, geo=geo: f"{geo}: {m}")
        # inputs that no spoiled window reads keep their gradient
        untouched = _windows_per_input(x, geo, hit[0, 0]) == 0
        assert untouched.any()
        torch.testing.assert_close(g[:, :, untouched], g_clean[:, :, untouched])


def _reads(x, geo):
    """``(*out, K)``: the flat input position each window tap reads (−1: padding), by torch's unfold."""
    d = x.dim() - 2
    k, s, p, dl, ceil = geo
    s = s or k
    plane = torch.arange(x[0, 0].numel(), dtype=torch.float64).view(1, 1, *x.shape[2:])
    out_size = MAX_POOL[d](x, k, s, p, dl, ceil_mode=ceil).shape[2:]
    span = [(o - 1) * s + dl * (k - 1) + 1 for o in out_size]
    full = torch.full([max(sp, n + p) for sp, n in zip(span, x.shape[2:])], -1.0, dtype=torch.float64)
    full[tuple(slice(p, p + n) for n in x.shape[2:])] = plane[0, 0]
    w = full[tuple(slice(0, sp) for sp in span)]
    for i in range(d):
        w = w.unfold(i, dl * (k - 1) + 1, s)[..., ::dl]
    return w.reshape(*out_size, -1).long()


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("gate", GATES)
def test_plus_inf_gives_plus_inf_like_max_pool(d, gate):
    torch.manual_seed(d)
    x = torch.randn(2, 1, *SIZE[d])  # one channel: the attention gate's value projection is then a scale
    pos = tuple(n // 2 for n in SIZE[d])
    for geo in GEOMETRIES:
        pool = make(gate, d, geo, 1)
        clean = pool(x)
        xi = x.clone()
        xi[(0, 0, *pos)] = float("inf")
        out, g = grad_of(pool, xi)
        hit = covering(xi, pos, geo)
        hit[1] = False  # the other sample holds no inf
        assert torch.equal(out[hit], torch.full_like(out[hit], float("inf"))), geo
        torch.testing.assert_close(out[~hit], clean[~hit], msg=lambda m, geo=geo: f"{geo}: {m}")
        if gate == "max":
            want = xi.clone().requires_grad_()
            (g_max,) = torch.autograd.grad(MAX_POOL[d](want, *geo[:4], ceil_mode=geo[4]).sum(), want)
            assert torch.equal(g, g_max)
        if gate in ("soft", "soft-learned"):  # the max-pool gradient: the inf tap takes its windows' all
            n_inf = _windows_per_input(x, geo, hit[0, 0])  # inf windows reading each input
            only_inf = (n_inf == _windows_per_input(x, geo, None)) & (n_inf > 0)
            only_inf[pos] = False
            assert g[(0, 0, *pos)] == n_inf[pos] > 0
            assert (g[0, 0][only_inf] == 0).all() and torch.isfinite(g).all()
            assert only_inf.any() or geo[1] is not None  # tiling windows: the inf tap's neighbours
            torch.testing.assert_close(g[1], grad_of(pool, x)[1][1])  # the other sample: untouched
        if gate == "soft-learned":  # τ still gets a finite gradient: 0 from the inf windows
            (g_tau,) = torch.autograd.grad(pool(xi), pool.log_temperature, torch.ones_like(out))
            (want,) = torch.autograd.grad(pool(x), pool.log_temperature, (~hit).float())  # the rest
            torch.testing.assert_close(g_tau, want)


def _windows_per_input(x, geo, which):
    """How many windows (of ``which``, a ``(*out)`` mask, or all) read each input position."""
    reads = _reads(x, geo)
    if which is not None:
        reads = reads[which]
    count = torch.zeros(x[0, 0].numel(), dtype=torch.long)
    taps = reads[reads >= 0]
    count.index_add_(0, taps, torch.ones_like(taps))
    return count.view(x.shape[2:])


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("gate", GATES)
def test_all_minus_inf_window_gives_minus_inf(d, gate):
    x = torch.randn(2, 1, *SIZE[d])
    geo = (2, None, 0, 1, False)
    corner = (slice(0, 2),) * d  # exactly the first window
    x[(slice(None), slice(None), *corner)] = float("-inf")
    out, g = grad_of(make(gate, d, geo, 1), x)
    first = (slice(None), slice(None), *([0] * d))
    assert torch.equal(out[first], torch.full_like(out[first], float("-inf")))
    rest = out.flatten(2)[:, :, 1:]
    assert torch.isfinite(rest).all()
    if gate != "attention":  # a −inf score beside them would make the value projection's gradient NaN
        assert not g.flatten(2)[:, :, 2 ** d :].isnan().any()


def test_minus_inf_tap_beside_finite_ones_gets_gate_zero():
    x = torch.tensor([[[1.0, float("-inf"), 2.0, 0.5]]], dtype=torch.float64, requires_grad=True)
    out, weights = soft_pool1d(x, 4, temperature=0.5, return_weights=True)
    v = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    g = torch.softmax(v / 0.5, 0)
    torch.testing.assert_close(out.reshape(()), (g * v).sum())
    torch.testing.assert_close(weights.reshape(-1), torch.stack([g[0], g.new_zeros(()), g[1], g[2]]))
    assert MAX_POOL[1](x, 4).item() == 2.0  # max pool also ignores it
    (grad,) = torch.autograd.grad(soft_pool1d(x, 4, temperature=0.5).sum(), x)  # the tiled fast path
    assert grad[0, 0, 1] == 0 and torch.isfinite(grad).all()
    torch.testing.assert_close(grad[0, 0, [0, 2, 3]], g * (1 + (v - (g * v).sum()) / 0.5))


def test_a_window_with_no_input_tap_gives_minus_inf_as_torch():
    """Dilation 3, kernel 2, padding 1 on a length-2 input: the one window reads positions −1 and 2."""
    x = torch.randn(1, 2, 2, requires_grad=True)
    assert MAX_POOL[1](x, 2, 1, 1, 3).isneginf().all()
    for gate in ("soft", "attention"):
        out, weights = make(gate, 1, (2, 1, 1, 3, False), 2, return_weights=True)(x)
        assert out.isneginf().all() and (weights == 0).all()
        (g,) = torch.autograd.grad(out, x, torch.ones_like(out))
        assert (g == 0).all()


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("gate", GATES)
def test_strided_and_non_contiguous_views(d, gate):
    """A view of a leaf: the same values and leaf gradients as through ``.contiguous()``."""
    torch.manual_seed(d)
    n = SIZE[d]
    views = {  # leaf shape, and the view of it that is (2, 3, *n)
        "strided": ((2, 6, *[2 * m for m in n]), lambda t: t[(slice(None), slice(None, None, 2),
                                                            *[slice(1, None, 2)] * d)]),
        "permuted": ((*n, 3, 2), lambda t: t.permute(d + 1, d, *range(d))),  # batch and channels last
        "transposed": ((2, 3, *n[:-2], n[-1], n[-2]), lambda t: t.transpose(-1, -2)) if d > 1
        else ((3, 2, n[0]), lambda t: t.transpose(0, 1)),
        "expanded": ((1, 3, *n), lambda t: t.expand(2, 3, *n)),  # batch stride 0
    }
    for name, (shape, view) in views.items():
        src = torch.randn(shape, requires_grad=True)
        assert view(src).shape == (2, 3, *n) and not view(src).is_contiguous()
        for geo in GEOMETRIES:
            pool = make(gate, d, geo, 3)
            out = pool(view(src))
            grad_out = torch.randn_like(out)
            (g,) = torch.autograd.grad(out, src, grad_out)
            want = pool(view(src).contiguous())
            (g_want,) = torch.autograd.grad(want, src, grad_out)
            torch.testing.assert_close(out, want, msg=lambda m, name=name, geo=geo: f"{name} {geo}: {m}")
            torch.testing.assert_close(g, g_want, msg=lambda m, name=name, geo=geo: f"{name} {geo}: {m}")


@pytest.mark.parametrize("gate", GATES)
def test_inputs_that_do_not_require_grad(gate):
    x = torch.randn(2, 3, 6, 6)
    for geo in GEOMETRIES:
        pool = make(gate, 2, geo, 3)
        out = pool(x)
        assert out.requires_grad == any(True for _ in pool.parameters())
        with torch.no_grad():
            assert torch.equal(pool(x), out.detach())
        if out.requires_grad:  # the gate's own weights still learn
            out.sum().backward()
            assert all(q.grad is not None and torch.isfinite(q.grad).all() for q in pool.parameters())
    tau = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)  # τ learns, x is data: both soft paths
    for p in (0, 1):
        (g,) = torch.autograd.grad(soft_pool2d(x, 2 + p, 2, p, temperature=tau).sum(), tau)
        assert g.shape == (3,) and torch.isfinite(g).all() and g.abs().min() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [1, 2, 3])
def test_half_precision_max_avg_stay_in_dtype_soft_family_computes_in_float32(dtype, d):
    torch.manual_seed(d)
    x = (torch.randn(2, 3, *SIZE[d]) * 3).to(dtype)
    for geo in GEOMETRIES:
        out, g = grad_of(make("max", d, geo, 3), x)
        want, g_want = grad_of(lambda t, geo=geo: MAX_POOL[d](t, *geo[:4], ceil_mode=geo[4]), x)
        assert out.dtype == dtype and torch.equal(out, want) and torch.equal(g, g_want)
        if geo[3] == 1:  # torch's average pool, in the input's dtype
            try:
                want, g_want = grad_of(lambda t, geo=geo: AVG_POOL[d](t, *geo[:3], ceil_mode=geo[4]), x)
            except NotImplementedError:  # e.g. avg_pool3d has no float16 kernel on CPU: nor has the gate
                with pytest.raises(NotImplementedError):
                    make("avg", d, geo, 3)(x)
            else:
                out, g = grad_of(make("avg", d, geo, 3), x)
                assert out.dtype == dtype and torch.equal(out, want) and torch.equal(g, g_want)
        for gate in SOFT_FAMILY + ("conv",):  # float32 inside, rounded once to the dtype
            pool = make(gate, d, geo, 3)
            out, g = grad_of(pool, x)
            want, g_want = grad_of(pool, x.float())
            assert out.dtype == dtype and g.dtype == dtype
            assert torch.equal(out, want.to(dtype)), (gate, geo)
            assert torch.equal(g, g_want.to(dtype)), (gate, geo)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gate", SOFT_FAMILY)
def test_adaptive_windows_that_do_not_tile_compute_half_precision_in_float32_chunks(dtype, gate, monkeypatch):
    """9 × 7 → 4 × 3 (uneven, overlapping windows: the gather): the float32 result on the same rounded
    input, rounded once (values, ∂x and the gate's parameters'), a sample at a time as one chunk, and
    nothing in float32 of the input's size saved for the backward."""
    from gatepool.layers import AdaptiveGatedPool2d, adaptive_pool

    torch.manual_seed(0)
    pool = AdaptiveGatedPool2d((4, 3), gate=gate, channels=5)
    with torch.no_grad():
        for q in pool.parameters():
            q.add_(0.3 * torch.randn_like(q))
    x = (2 * torch.randn(3, 5, 9, 7)).to(dtype)
    monkeypatch.setattr(adaptive_pool, "_HALF_CHUNK", 5 * 12 * 9)  # one sample's taps: three chunks
    saved = []

    def keep(t):
        saved.append((t.dtype, t.numel()))
        return t

    results = []
    for t in (x, x.float()):
        t = t.detach().requires_grad_()
        hook = keep if t.dtype == dtype else (lambda u: u)
        with torch.autograd.graph.saved_tensors_hooks(hook, lambda u: u):
            out = pool(t)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(out.dtype)
        results.append((out, *torch.autograd.grad(out, [t, *pool.parameters()], g)))
    (out, gx, *gp), (want, gx_want, *gp_want) = results
    assert out.dtype == gx.dtype == dtype
    assert torch.equal(out, want.to(dtype)) and torch.equal(gx, gx_want.to(dtype))
    for a, b in zip(gp, gp_want):  # the parameters' gradients: float32, summed over three chunks
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not [s for s in saved if s[0] == torch.float32 and s[1] >= x.numel()], saved
    with torch.no_grad():
        assert torch.equal(pool(x), out)


@pytest.mark.parametrize("geo", [(2, None, 0), (3, 2, 1)], ids=["tiled", "unfold"])
def test_double_backward_soft_family(geo, pool_path):
    """gradgradcheck in float64 for soft (the fast tiled path included), learned τ and attention."""
    k, s, p = geo
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor([0.7, 1.9], dtype=torch.float64, requires_grad=True)
    out = soft_pool2d(x, k, s, p, temperature=tau)
    assert pool_path.node(out) == pool_path.backward(tiles=p == 0)  # the path named above
    check = dict(fast_mode=True)  # random projections: quick, and still exact
    gradgradcheck = torch.autograd.gradgradcheck
    assert gradgradcheck(lambda a, t: soft_pool2d(a, k, s, p, temperature=t), (x, tau), **check)
    assert gradgradcheck(lambda a: soft_pool2d(a, k, s, p, temperature=0.4), (x,), **check)
    x1 = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)  # unbatched 1-D
    assert gradgradcheck(lambda a: soft_pool1d(a, k, s, p), (x1,), **check)
    for gate in ("soft-learned", "attention"):
        pool = GatedPool2d(k, s, p, gate=gate, channels=2).double()
        names = [n for n, _ in pool.named_parameters()]

        def f(a, *params, pool=pool, names=names):
            return torch.func.functional_call(pool, dict(zip(names, params)), (a,))

        params = tuple(q.detach().clone().requires_grad_() for q in pool.parameters())
        assert gradgradcheck(f, (x, *params), **check)


def test_double_backward_of_the_fast_path_equals_the_plain_path():
    """A Hessian-vector product through the tiled path equals the one through return_weights' plain path."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    tau = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    hvps = []
    for weights in (False, True):
        res = soft_pool2d(x, 2, temperature=tau, return_weights=weights)
        out = res[0] if weights else res
        (g,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        hvps.append(torch.autograd.grad((g * v).sum(), [x, tau]))
    for a, b in zip(*hvps):
        torch.testing.assert_close(a, b)
