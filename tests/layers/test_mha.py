"""MultiHeadAttention against nn.MultiheadAttention (batch_first) with copied weights, and its properties.

Mask conventions differ: every bool mask of ours is True = takes part (``attn_mask`` as
F.scaled_dot_product_attention, ``key_mask`` True = a real key); torch's nn.MultiheadAttention takes True =
masked out in both ``attn_mask`` and ``key_padding_mask``, so the reference gets the negation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.symmetry import PermuteTokens, invariance_error
from gatepool.layers.attention import MultiHeadAttention

B, N, M, D, H = 2, 5, 6, 12, 3


def pair(context_dim=None, seed=0):
    """Our MHA and torch's with the same weights, float64."""
    torch.manual_seed(seed)
    ours = MultiHeadAttention(D, H, context_dim=context_dim, qkv_bias=True).double()
    kv = context_dim or D
    ref = nn.MultiheadAttention(D, H, bias=True, batch_first=True, kdim=kv, vdim=kv).double()
    with torch.no_grad():
        if context_dim is None:
            ref.in_proj_weight.copy_(torch.cat([ours.to_q.weight, ours.to_k.weight, ours.to_v.weight]))
        else:
            ref.q_proj_weight.copy_(ours.to_q.weight)
            ref.k_proj_weight.copy_(ours.to_k.weight)
            ref.v_proj_weight.copy_(ours.to_v.weight)
        ref.in_proj_bias.copy_(torch.cat([ours.to_q.bias, ours.to_k.bias, ours.to_v.bias]))
        ref.out_proj.weight.copy_(ours.to_out.weight)
        ref.out_proj.bias.copy_(ours.to_out.bias)
    return ours, ref


def inputs(n=N, m=M, context_dim=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, D, generator=g, dtype=torch.float64, requires_grad=True)
    c = None
    if context_dim is not None:
        c = torch.randn(B, m, context_dim, generator=g, dtype=torch.float64, requires_grad=True)
    return x, c


def padding(m=M):
    kpm = torch.zeros(B, m, dtype=torch.bool)
    kpm[0, -2:] = True  # the last two keys of sample 0 are padding
    kpm[1, 1] = True
    return kpm


def allowed(n, m, seed=3):
    mask = torch.rand(n, m, generator=torch.Generator().manual_seed(seed)) > 0.3
    mask[:, 0] = True
    return mask


MASKS = ["none", "key_padding", "attn_mask", "both", "float_attn_mask"]


@pytest.mark.parametrize(
    "masks, context_dim",
    [(m, None) for m in [*MASKS, "causal"]] + [(m, 7) for m in MASKS],
    ids=[f"self-{m}" for m in [*MASKS, "causal"]] + [f"cross-{m}" for m in MASKS],
)
def test_matches_torch_multihead_attention(masks, context_dim):
    ours, ref = pair(context_dim)
    x, c = inputs(context_dim=context_dim)
    m = N if c is None else M
    kw_ours, kw_ref = {}, {}
    if masks in ("key_padding", "both"):
        kw_ours["key_mask"], kw_ref["key_padding_mask"] = ~padding(m), padding(m)
    if masks in ("attn_mask", "both"):
        mask = allowed(N, m)
        kw_ours["attn_mask"], kw_ref["attn_mask"] = mask, ~mask
    if masks == "float_attn_mask":
        fm = torch.randn(N, m, dtype=torch.float64)
        kw_ours["attn_mask"] = kw_ref["attn_mask"] = fm
    if masks == "causal":
        kw_ours["is_causal"] = True
        kw_ref["attn_mask"] = torch.ones(N, N, dtype=torch.bool).triu(1)

    out, w = ours(x, context=c, return_weights=True, **kw_ours)
    kv = x if c is None else c
    ref_out, ref_w = ref(x, kv, kv, need_weights=True, average_attn_weights=False, **kw_ref)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    assert w.shape == (B, H, N, m)

    # the fused path (no weights) gives the same output; gradients match torch's
    out_fused = ours(x, context=c, **kw_ours)
    torch.testing.assert_close(out_fused, ref_out)
    leaves = [x] + ([c] if c is not None else [])
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(out_fused, leaves + [ours.to_q.weight, ours.to_out.weight], g)
    q_w = ref.in_proj_weight if c is None else ref.q_proj_weight
    want = torch.autograd.grad(ref_out, leaves + [q_w, ref.out_proj.weight], g)
    torch.testing.assert_close(got[-1], want[-1])
    torch.testing.assert_close(got[-2], want[-2][:D])
    for a, b in zip(got[:-2], want[:-2]):
        torch.testing.assert_close(a, b)


def test_3d_attn_mask_is_per_sample():
    ours, ref = pair()
    x, _ = inputs()
    mask = torch.stack([allowed(N, N, seed=4), allowed(N, N, seed=5)])  # (B, N, N)
    out = ours(x, attn_mask=mask)
    ref_out, _ = ref(x, x, x, attn_mask=(~mask).repeat_interleave(H, dim=0))  # torch wants (B·H, N, N)
    torch.testing.assert_close(out, ref_out)


def test_causal_property():
    """Perturbing token j > i leaves output i unchanged; perturbing j <= i changes it."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H).double()
    x, _ = inputs()
    out = attn(x, is_causal=True)
    for j in range(N):
        x2 = x.detach().clone()
        x2[:, j] += torch.randn(D, dtype=torch.float64)
        out2 = attn(x2, is_causal=True)
        torch.testing.assert_close(out2[:, :j], out[:, :j], rtol=0, atol=1e-12)
        assert (out2[:, j:] - out[:, j:]).abs().amax() > 1e-6


def test_key_mask_ignores_padded_keys_and_fully_padded_sample_is_finite():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, context_dim=7).double()
    x, c = inputs(context_dim=7)
    kpm = padding()
    out = attn(x, context=c, key_mask=~kpm)  # True = a real key
    c2 = c.detach().clone()
    c2[kpm] = 100 * torch.randn(int(kpm.sum()), 7, dtype=torch.float64)  # change only the padded keys
    torch.testing.assert_close(attn(x, context=c2, key_mask=~kpm), out)
    # the same as dropping those keys: sample 1 without its key 1
    torch.testing.assert_close(attn(x[1:], context=c[1:, [0, 2, 3, 4, 5]]), out[1:])
    all_real = torch.ones(B, M, dtype=torch.bool)
    torch.testing.assert_close(attn(x, context=c, key_mask=all_real), attn(x, context=c))

    every = torch.zeros(B, M, dtype=torch.bool)
    every[0] = True  # sample 1: no real key
    out, w = attn(x, context=c, key_mask=every, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (w[1] == 0).all()
    # no key, zero attention: only the output projection's bias is left
    torch.testing.assert_close(out[1], attn.to_out.bias.expand(N, D))


def test_cross_attention_has_query_length_and_ignores_context_order():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, context_dim=7).double()
    x, c = inputs(context_dim=7)
    assert attn(x, context=c).shape == (B, N, D)
    err = invariance_error(lambda ctx: attn(x, context=ctx), c, PermuteTokens(dim=1, seed=3))
    assert err < 1e-12


def test_head_dim_and_weights_rows_sum_to_one():
    attn = MultiHeadAttention(10, 4, head_dim=3)  # 10 is not divisible by 4: fine with head_dim
    x = torch.randn(2, 6, 10)
    out, w = attn(x, return_weights=True)
    assert out.shape == (2, 6, 10) and w.shape == (2, 4, 6, 6)
    assert attn.to_q.weight.shape == (12, 10) and attn.to_out.weight.shape == (10, 12)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(8, 2, dropout=1.5)
    attn = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        attn(torch.randn(4, 8))
    with pytest.raises(ValueError, match="x must have shape"):
        attn(torch.randn(2, 4, 9))
    with pytest.raises(ValueError, match="context"):
        attn(torch.randn(2, 4, 8), context=torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match="key_mask"):
        attn(torch.randn(2, 4, 8), key_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_mask.*True = a real key"):
        attn(torch.randn(2, 4, 8), key_mask=torch.zeros(2, 4))
    with pytest.raises(TypeError, match="key_mask"):
        attn(torch.randn(2, 4, 8), key_mask=[[True] * 4] * 2)
    with pytest.raises(ValueError, match="attn_mask"):
        attn(torch.randn(2, 4, 8), attn_mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask"):
        attn(torch.randn(2, 4, 8), attn_mask=torch.ones(4, dtype=torch.bool))
