"""Blocks against torch's nn.TransformerEncoderLayer / nn.TransformerDecoderLayer with copied weights,
and the MLPs against their formulas written out here."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers.blocks import MLP, Decoder, DecoderBlock, Encoder, EncoderBlock, make_norm

B, T, S, D, H, FF = 2, 5, 4, 16, 4, 32


def copy_mha(ours, ref):
    ref.in_proj_weight.copy_(torch.cat([ours.to_q.weight, ours.to_k.weight, ours.to_v.weight]))
    ref.in_proj_bias.copy_(torch.cat([ours.to_q.bias, ours.to_k.bias, ours.to_v.bias]))
    ref.out_proj.weight.copy_(ours.to_out.weight)
    ref.out_proj.bias.copy_(ours.to_out.bias)


def copy_mlp_norms(ours, ref, n_norms):
    ref.linear1.load_state_dict(ours.mlp.fc1.state_dict())
    ref.linear2.load_state_dict(ours.mlp.fc2.state_dict())
    for i in range(1, n_norms + 1):
        getattr(ref, f"norm{i}").load_state_dict(getattr(ours, f"norm{i}").state_dict())


def randomize(module, seed=0):
    """Non-trivial norm weights and biases (defaults are 1 and 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.copy_(noise * 0.3 if p.ndim > 1 else 1 + 0.5 * noise)


@pytest.mark.parametrize("prenorm", [True, False], ids=["prenorm", "postnorm"])
def test_encoder_block_matches_torch(prenorm):
    ours = EncoderBlock(D, H, mlp="gelu", mlp_ratio=FF / D, prenorm=prenorm, qkv_bias=True).double()
    randomize(ours)
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=prenorm).double()  # fmt: skip
    with torch.no_grad():
        copy_mha(ours.attn, ref.self_attn)
        copy_mlp_norms(ours, ref, 2)
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, -1] = True
    out = ours(x, key_mask=~kpm)  # ours: True = a real token; torch's: True = padding
    want = ref(x, src_key_padding_mask=kpm)
    torch.testing.assert_close(out, want)
    g = torch.randn(out.shape, dtype=out.dtype)
    torch.testing.assert_close(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(want, x, g)[0])

    causal = ours(x, is_causal=True)
    mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    want = ref(x, src_mask=mask, is_causal=True)
    torch.testing.assert_close(causal, want)


@pytest.mark.parametrize("prenorm", [True, False], ids=["prenorm", "postnorm"])
def test_decoder_block_matches_torch(prenorm):
    ours = DecoderBlock(D, H, mlp="gelu", mlp_ratio=FF / D, prenorm=prenorm, qkv_bias=True).double()
    randomize(ours, seed=1)
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=prenorm).double()  # fmt: skip
    with torch.no_grad():
        copy_mha(ours.self_attn, ref.self_attn)
        copy_mha(ours.cross_attn, ref.multihead_attn)
        copy_mlp_norms(ours, ref, 3)
    x = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    mem = torch.randn(B, S, D, dtype=torch.float64, requires_grad=True)
    mem_pad = torch.zeros(B, S, dtype=torch.bool)
    mem_pad[0, 0] = True
    out = ours(x, mem, context_mask=~mem_pad)
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    want = ref(x, mem, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=mem_pad)
    torch.testing.assert_close(out, want)
    g = torch.randn(out.shape, dtype=out.dtype)
    for a, b in zip(torch.autograd.grad(out, (x, mem), g), torch.autograd.grad(want, (x, mem), g)):
        torch.testing.assert_close(a, b)


def test_encoder_stack_matches_torch_and_returns_weights():
    depth = 2
    ours = Encoder(D, depth, H, mlp="gelu", mlp_ratio=FF / D, qkv_bias=True).double()
    randomize(ours, seed=2)
    layer = nn.TransformerEncoderLayer(D, H, FF, 0.0, "gelu", batch_first=True, norm_first=True)
    ref = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(D), enable_nested_tensor=False).double()
    with torch.no_grad():
        for ob, rb in zip(ours.blocks, ref.layers):
            copy_mha(ob.attn, rb.self_attn)
            copy_mlp_norms(ob, rb, 2)
        ref.norm.load_state_dict(ours.norm.state_dict())
    x = torch.randn(B, T, D, dtype=torch.float64)
    out, weights = ours(x, return_weights=True)
    torch.testing.assert_close(out, ref(x))
    assert len(weights) == depth and all(w.shape == (B, H, T, T) for w in weights)
    torch.testing.assert_close(ours(x), out)


def test_decoder_stack_shapes_and_final_norm():
    dec = Decoder(D, 2, H, context_dim=8)
    out = dec(torch.randn(B, T, D), torch.randn(B, S, 8))
    assert out.shape == (B, T, D)
    torch.testing.assert_close(out.mean(-1), torch.zeros(B, T), atol=1e-5, rtol=0)  # LayerNorm at the end
    assert isinstance(Decoder(D, 1, H, prenorm=False).norm, nn.Identity)


def test_mlp_formulas():
    torch.manual_seed(0)
    x = torch.randn(3, D)
    gelu = MLP(D, kind="gelu", mlp_ratio=2)
    assert gelu.hidden_dim == 2 * D
    ref = F.gelu(x @ gelu.fc1.weight.T + gelu.fc1.bias) @ gelu.fc2.weight.T + gelu.fc2.bias
    torch.testing.assert_close(gelu(x), ref)

    swiglu = MLP(D, kind="swiglu", mlp_ratio=4)
    h = swiglu.hidden_dim
    assert h % 8 == 0 and abs(h - 2 * 4 * D / 3) < 8  # ⅔ of 4·D, rounded up to a multiple of 8
    w1, w3 = swiglu.fc1.weight[:h], swiglu.fc1.weight[h:]
    b1, b3 = swiglu.fc1.bias[:h], swiglu.fc1.bias[h:]
    a = x @ w1.T + b1
    ref = ((a * torch.sigmoid(a)) * (x @ w3.T + b3)) @ swiglu.fc2.weight.T + swiglu.fc2.bias
    torch.testing.assert_close(swiglu(x), ref)


def test_rms_norm_option():
    block = EncoderBlock(D, H, norm="rms")
    assert isinstance(block.norm1, nn.RMSNorm)
    x = torch.randn(B, T, D)
    r = make_norm("rms", D)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)
    torch.testing.assert_close(r(x), ref)
    assert block(x).shape == (B, T, D)


def test_block_errors():
    with pytest.raises(ValueError, match="mlp"):
        EncoderBlock(D, H, mlp="relu")
    with pytest.raises(ValueError, match="norm"):
        DecoderBlock(D, H, norm="batch")
    with pytest.raises(ValueError, match="num_heads"):
        EncoderBlock(D, 3)
    with pytest.raises(ValueError, match="depth"):
        Encoder(D, -1, H)
    with pytest.raises(ValueError, match="mlp_ratio"):
        MLP(D, mlp_ratio=0)
