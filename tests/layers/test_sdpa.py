"""Our scaled_dot_product_attention against torch's F.scaled_dot_product_attention and an explicit softmax.

Both of our paths (fused: weights not requested; explicit: ``return_weights=True``) are compared, values
and gradients, in float64, with bool masks, float masks, causal masks, and a custom scale.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gatepool.layers.attention import scaled_dot_product_attention

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
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), grad)
    return out.detach(), gq, gk, gv


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


def test_batch_dims_broadcast_and_3d():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, N, E, generator=g) for _ in range(3))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize(
    "shapes, match",
    [
        (((N, E), (B, M, E), (B, M, E)), "same number of dims"),
        (((E,), (E,), (E,)), "q must have at least 2 dims"),
        (((B, N, E), (B, M, E + 1), (B, M, E)), "q and k"),
        (((B, N, E), (B, M, E), (B, M + 1, E)), "k and v"),
        (((2, N, E), (3, M, E), (3, M, E)), "batch dims"),
    ],
)
def test_bad_shapes_raise(shapes, match):
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("mask_shape", [(N, M + 1), (4, N, M), (1, 1, 1, N, M)])
def test_mask_shape_mismatch_raises(mask_shape):
    q, k, v = (t.detach() for t in qkv())
    with pytest.raises(ValueError, match="attn_mask"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(mask_shape, dtype=torch.bool))


def test_bad_mask_dtype_scale_dropout_raise():
    q, k, v = (t.detach() for t in qkv())
    with pytest.raises(ValueError, match="attn_mask"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(N, M, dtype=torch.long))
    with pytest.raises(ValueError, match="scale"):
        scaled_dot_product_attention(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)
