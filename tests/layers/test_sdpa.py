"""Our scaled_dot_product_attention against torch's F.scaled_dot_product_attention and an explicit softmax.

Both of our paths (fused: weights not requested; explicit: ``return_weights=True``) are compared, values
and gradients, in float64, with bool masks, float masks, causal masks, a custom scale, batch dims that
broadcast, grouped-query heads and empty dims. torch's own sample inputs: test_sdpa_torch_samples.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gatepool.layers.attention import MultiHeadAttention, scaled_dot_product_attention

B, H, N, M, E, EV = 2, 3, 5, 7, 8, 6


def qkv(n=N, m=M, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, E, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, H, m, E, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, H, m, EV, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def run_both(fn, q, k, v):
    """Output and gradients (for a fixed random upstream gradient) of fn(q, k, v)."""
    out = fn(q, k, v)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), grad, allow_unused=True, materialize_grads=True)
    return out.detach(), gq, gk, gv


def leaves(*shapes, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def ours_on(return_weights, **kw):
    """Our SDPA on one path as a function of (q, k, v), returning the output only."""

    def fn(q, k, v):
        res = scaled_dot_product_attention(q, k, v, **kw, return_weights=return_weights)
        return res[0] if return_weights else res

    return fn


def assert_matches_torch(q, k, v, return_weights, tol=1e-10, **kw):
    got = run_both(ours_on(return_weights, **kw), q, k, v)
    want = run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v)
    for name, a, b in zip(("out", "grad q", "grad k", "grad v"), got, want):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m, name=name: f"{name}: {m}")


def explicit_reference(q, k, v, allowed, scale):
    """softmax over the allowed keys, written out with exp and sums; rows with none allowed give 0."""
    scores = (q @ k.transpose(-2, -1)) * scale
    e = torch.where(allowed, torch.exp(scores - scores.amax(-1, keepdim=True)), torch.zeros_like(scores))
    total = e.sum(-1, keepdim=True)
    w = torch.where(total > 0, e / total.clamp_min(1e-300), torch.zeros_like(e))
    return w @ v, w


def random_bool_mask(shape, seed=2):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) > 0.4
    mask[..., 0] = True  # every row keeps a key (torch's own kernels differ on empty rows across versions)
    return mask


CASES = {
    "plain": dict(),
    "bool-mask-2d": dict(attn_mask=random_bool_mask((N, M))),
    "bool-mask-4d": dict(attn_mask=random_bool_mask((B, 1, N, M))),
    "float-mask": dict(attn_mask=torch.randn(B, H, N, M, dtype=torch.float64)),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.3),
}


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_torch_values_and_grads(case, return_weights):
    kw = CASES[case]
    q, k, v = qkv()

    def ours(q, k, v):
        res = scaled_dot_product_attention(q, k, v, return_weights=return_weights, **kw)
        return res[0] if return_weights else res

    got = run_both(ours, q, k, v)
    want = run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_weights_match_explicit_softmax():
    q, k, v = qkv()
    mask = random_bool_mask((N, M))
    out, w = scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True)
    ref_out, ref_w = explicit_reference(q, k, v, mask, 1 / math.sqrt(E))
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)
    assert w.shape == (B, H, N, M)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, N, dtype=w.dtype))
    assert (w[..., ~mask.expand(B, H, N, M)[0, 0]] == 0).all()


def test_causal_is_top_left_and_rectangular():
    q, k, v = qkv(n=4, m=6)
    allowed = torch.ones(4, 6, dtype=torch.bool).tril()  # query i sees keys 0..i
    _, w = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    _, ref_w = explicit_reference(q, k, v, allowed, 1 / math.sqrt(E))
    torch.testing.assert_close(w, ref_w)
    fused = scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(fused, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_causal_combined_with_mask(return_weights):
    q, k, v = qkv(n=6, m=6)
    mask = random_bool_mask((6, 6))
    res = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True, return_weights=return_weights)
    out = res[0] if return_weights else res
    ref, _ = explicit_reference(q, k, v, mask & torch.ones(6, 6, dtype=torch.bool).tril(), 1 / math.sqrt(E))
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_fully_masked_rows_give_zeros_not_nan(kind, return_weights):
    q, k, v = qkv(dtype=torch.float32)
    allowed = random_bool_mask((B, H, N, M))
    allowed[0, 1, 2] = False  # one query row with no key
    allowed[1, :, 4] = False  # and one in every head
    mask = allowed if kind == "bool" else torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    res = scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=return_weights)
    out = res[0] if return_weights else res
    out.sum().backward()
    dead = ~allowed.any(-1)  # (B, H, N)
    assert not out.isnan().any()
    assert (out[dead] == 0).all()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[dead] == 0).all()
    ref, ref_w = explicit_reference(q.detach(), k.detach(), v.detach(), allowed, 1 / math.sqrt(E))
    torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-5)
    if return_weights:
        assert (res[1][dead] == 0).all()
        torch.testing.assert_close(res[1].detach(), ref_w, rtol=1e-5, atol=1e-6)


def test_dropout_weights_are_the_ones_applied():
    q, k, v = qkv()
    torch.manual_seed(0)
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5, return_weights=True)
    assert (w == 0).any()  # some gates dropped (2·3·5·7 = 210 of them, p = ½)
    torch.testing.assert_close(out, w @ v)
    fused = scaled_dot_product_attention(q, k, v, dropout_p=0.5)  # torch's kernel, random too
    assert fused.shape == out.shape and torch.isfinite(fused).all()


BROADCAST = {  # q, k, v shapes whose batch dims (all but the last two) broadcast, as in q @ kᵀ and G @ v
    "3d": ((4, N, E), (4, M, E), (4, M, EV)),
    "q3-kv4": ((4, N, E), (B, 4, M, E), (B, 4, M, EV)),  # torch's OpInfo sample: q (4, 3, 8), k (4, 4, 6, 8)
    "q2-kv3": ((N, E), (B, M, E), (B, M, EV)),
    "k2": ((B, N, E), (M, E), (B, M, EV)),
    "v-only": ((N, E), (M, E), (B, M, EV)),  # the scores are (N, M), the output (B, N, EV)
    "ones": ((B, 1, N, E), (1, H, M, E), (B, H, M, EV)),
    "k-v-differ": ((B, H, N, E), (B, 1, M, E), (1, H, M, EV)),
    "5d": ((2, 1, 3, N, E), (4, 1, M, E), (1, 4, 3, M, EV)),
}


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("case", list(BROADCAST))
def test_batch_dims_broadcast(case, return_weights):
    assert_matches_torch(*leaves(*BROADCAST[case]), return_weights)


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_mask_broadcasts_to_broadcast_scores(return_weights):
    """The scores take the batch dims of q and k broadcast: (B, 4, N, M) here, and so may the mask."""
    q, k, v = leaves((4, N, E), (B, 4, M, E), (B, 4, M, EV))
    for shape in [(4, 1, M), (B, 1, 1, M), (B, 4, N, M)]:
        mask = random_bool_mask(shape)
        assert_matches_torch(q, k, v, return_weights, attn_mask=mask)
        _, w = scaled_dot_product_attention(q, k, v, attn_mask=mask, return_weights=True)
        assert w.shape == (B, 4, N, M)


GQA = {  # q heads, k heads, v heads (dim -3)
    "4-2-2": ((B, 4, N, E), (B, 2, M, E), (B, 2, M, EV)),
    "4-2-1": ((B, 4, N, E), (B, 2, M, E), (B, 1, M, EV)),
    "6-3-3": ((B, 6, N, E), (B, 3, M, E), (B, 3, M, EV)),
    "q3": ((4, N, E), (B, 2, M, E), (B, 2, M, EV)),  # the heads of a 3-d q are its dim 0
    "equal": ((B, 3, N, E), (B, 3, M, E), (B, 3, M, EV)),
}


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("case", list(GQA))
def test_enable_gqa(case, return_weights):
    q, k, v = leaves(*GQA[case])
    assert_matches_torch(q, k, v, return_weights, enable_gqa=True)
    assert_matches_torch(q, k, v, return_weights, enable_gqa=True, is_causal=True)


def test_enable_gqa_repeats_each_head_for_its_group():
    q, k, v = (t.detach() for t in leaves((B, 4, N, E), (B, 2, M, E), (B, 2, M, EV)))
    out = scaled_dot_product_attention(q, k, v, enable_gqa=True, return_weights=True)[0]
    for h in range(4):  # query heads 0, 1 use kv head 0; 2, 3 use kv head 1
        ref = scaled_dot_product_attention(q[:, h], k[:, h // 2], v[:, h // 2])
        torch.testing.assert_close(out[:, h], ref, rtol=1e-10, atol=1e-10)


EMPTY = {  # torch gives zeros where there is no key (M = 0) and a plain average where no feature (E = 0)
    "N=0": ((B, 0, E), (B, M, E), (B, M, EV)),
    "M=0": ((B, N, E), (B, 0, E), (B, 0, EV)),
    "E=0": ((B, N, 0), (B, M, 0), (B, M, EV)),
    "EV=0": ((B, N, E), (B, M, E), (B, M, 0)),
    "B=0": ((0, H, N, E), (0, H, M, E), (0, H, M, EV)),
    "M=0-4d": ((B, H, N, E), (B, H, 0, E), (B, H, 0, EV)),
}


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("case", list(EMPTY))
def test_empty_dims(case, return_weights):
    q, k, v = leaves(*EMPTY[case])
    assert_matches_torch(q, k, v, return_weights)
    assert_matches_torch(q, k, v, return_weights, is_causal=True)
    n, m = q.shape[-2], k.shape[-2]
    assert_matches_torch(q, k, v, return_weights, attn_mask=torch.ones(n, m, dtype=torch.bool))


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("scale", [0.0, -0.7, 2.5])
def test_any_finite_scale(scale, return_weights):
    """torch takes any scale: 0 makes every gate uniform, a negative one prefers the least similar key."""
    assert_matches_torch(*qkv(), return_weights, scale=scale)


@pytest.mark.parametrize("n, m", [(3, 7), (7, 3), (5, 5)])
@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_causal_rectangular_matches_torch(n, m, return_weights):
    assert_matches_torch(*qkv(n=n, m=m), return_weights, is_causal=True)


@pytest.mark.skipif(torch.__version__ < "2.5", reason="torch < 2.5 returns NaN for fully masked rows")
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "explicit"])
def test_fully_masked_rows_match_torch(kind, return_weights):
    """torch's CPU kernels (math for 3-d inputs, flash for 4-d) give such rows zeros, and zero gradients."""
    allowed = random_bool_mask((B, H, N, M))
    allowed[0, 1, 2] = False
    allowed[1, :, 4] = False
    mask = allowed if kind == "bool" else torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(
        ~allowed, float("-inf")
    )
    assert_matches_torch(*qkv(), return_weights, attn_mask=mask)  # 4-d: torch's flash kernel
    q, k, v = (t.flatten(0, 1).detach().requires_grad_() for t in qkv())
    assert_matches_torch(q, k, v, return_weights, attn_mask=mask.flatten(0, 1))  # 3-d: its math kernel


@pytest.mark.parametrize("kw", [{}, dict(attn_mask=random_bool_mask((N, M))), dict(enable_gqa=True)])
def test_fast_path_is_torchs_kernel(kw, monkeypatch):
    """Without return_weights, the attention itself is one call of torch's SDPA (its fused kernels)."""
    calls, torchs = [], F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return torchs(*args, **kwargs)

    q, k, v = (t.detach() for t in qkv())
    monkeypatch.setattr("gatepool.layers.attention.F.scaled_dot_product_attention", counting)
    scaled_dot_product_attention(q, k, v, **kw)
    assert calls == [q.shape]
    scaled_dot_product_attention(q, k, v, **kw, return_weights=True)
    assert calls == [q.shape]


def test_arguments_in_torchs_order():
    """(q, k, v, attn_mask, dropout_p, is_causal) positionally, scale and enable_gqa by keyword only."""
    q, k, v = (t.detach() for t in qkv())
    mask = random_bool_mask((N, M))
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, mask, 0.0, True),
        F.scaled_dot_product_attention(q, k, v, mask & torch.ones(N, M, dtype=torch.bool).tril()),
    )
    with pytest.raises(TypeError):
        scaled_dot_product_attention(q, k, v, None, 0.0, False, 0.5)


def test_dropout_p_one_drops_every_gate():
    q, k, v = (t.detach() for t in qkv())
    for return_weights in (False, True):
        out = ours_on(return_weights, dropout_p=1.0)(q, k, v)
        assert (out == 0).all()


def test_mha_float_mask_takes_the_autocast_dtype():
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).eval()
    x = torch.randn(B, N, 12)
    allowed = random_bool_mask((N, N))
    bias = torch.zeros(N, N).masked_fill(~allowed, float("-inf"))  # float32 under bfloat16 autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for return_weights in (False, True):
            got = mha(x, attn_mask=bias, return_weights=return_weights)
            want = mha(x, attn_mask=allowed, return_weights=return_weights)
            got, want = (got[0], want[0]) if return_weights else (got, want)
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "shapes, kw, match",
    [
        (((E,), (E,), (E,)), {}, "q must have at least 2 dims"),
        (((N, E), (M, E), (M,)), {}, "v must have at least 2 dims"),
        (((B, N, E), (B, M, E + 1), (B, M, E)), {}, "q and k"),
        (((B, N, E), (B, M, E), (B, M + 1, E)), {}, "k and v"),
        (((2, N, E), (3, M, E), (3, M, E)), {}, "batch dims"),
        (((2, N, E), (2, M, E), (3, M, E)), {}, "batch dims"),  # q, k fine, v's does not broadcast
        (((4, N, E), (B, 4, M, E), (3, 4, M, E)), {}, "batch dims"),
        (((N, E), (M, E), (M, E)), dict(enable_gqa=True), "q must have at least 3 dims"),
        (((B, 4, N, E), (B, 3, M, E), (B, 3, M, E)), dict(enable_gqa=True), "k's 3 heads"),
        (((B, 4, N, E), (B, 2, M, E), (B, 3, M, E)), dict(enable_gqa=True), "v's 3 heads"),
        (((B, 2, N, E), (B, 4, M, E), (B, 4, M, E)), dict(enable_gqa=True), "k's 4 heads"),
        (((B, 4, N, E), (B, 2, M, E), (B, 2, M, E)), {}, "batch dims"),  # grouped heads need enable_gqa
    ],
)
def test_bad_shapes_raise(shapes, kw, match):
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(q, k, v, **kw)
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(q, k, v, **kw, return_weights=True)
    if match == "k and v" and torch.__version__ >= "2.14":
        return  # torch 2.14.1's CPU kernel takes k and v of different lengths and returns wrong values
    with pytest.raises((RuntimeError, IndexError)):  # torch refuses them too
        F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("mask_shape", [(N, M + 1), (4, N, M), (1, 1, 1, N, M)])
def test_mask_shape_mismatch_raises(mask_shape):
    q, k, v = (t.detach() for t in qkv())
    mask = torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match="attn_mask"):
        scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with pytest.raises(RuntimeError):  # torch refuses them too
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_mask_may_not_take_the_batch_dims_of_v_alone():
    """The mask is added to the scores (N, M) here, in place in torch: v's batch dim (B) is not theirs."""
    q, k, v = torch.randn(N, E), torch.randn(M, E), torch.randn(B, M, EV)
    mask = torch.ones(B, N, M, dtype=torch.bool)
    with pytest.raises(ValueError, match="attn_mask"):
        scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(attn_mask=torch.ones(N, M, dtype=torch.long)), "attn_mask must be bool"),
        (dict(attn_mask=torch.ones(N, M, dtype=torch.float32)), "attn_mask .* of q's dtype torch.float64"),
        (dict(scale=float("nan")), "scale must be a finite number"),
        (dict(scale=float("inf")), "scale must be a finite number"),
        (dict(dropout_p=1.5), r"dropout_p must be a finite number in \[0, 1\]"),
        (dict(dropout_p=-0.1), r"dropout_p must be a finite number in \[0, 1\]"),
    ],
)
def test_bad_arguments_raise(kw, match):
    q, k, v = (t.detach() for t in qkv())
    for return_weights in (False, True):
        with pytest.raises(ValueError, match=match):
            scaled_dot_product_attention(q, k, v, **kw, return_weights=return_weights)


def test_mixed_dtypes_raise():
    q, k, v = (t.detach() for t in qkv())
    with pytest.raises(ValueError, match="same dtype"):
        scaled_dot_product_attention(q, k, v.float())
