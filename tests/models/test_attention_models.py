"""ConvAttentionNet, ViT and AttentionPoolLatent: shapes, and each step against a computation written out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gatepool
from gatepool.analysis.symmetry import PermuteTokens, assert_equivariant, assert_invariant
from gatepool.layers.attention_pool import AttentionPoolLatent
from gatepool.models.conv_attention import ConvAttentionNet
from gatepool.models.vit import ViT


def digits(n=3, seed=0):
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def test_conv_attention_shapes_tokens_and_gates():
    torch.manual_seed(0)
    net = ConvAttentionNet(attention=True, d=16).eval()
    x = digits()
    logits, g = net(x, return_weights=True)
    assert logits.shape == (3, 10) and g.shape == (3, 144, 144) and net.grid == (12, 12)
    torch.testing.assert_close(g.sum(-1), torch.ones(3, 144))

    # the stem's tokens: conv → relu → 2×2 max pool, read row-major
    conv = net.stem.conv
    fmap = F.max_pool2d(F.relu(F.conv2d(x, conv.weight, conv.bias)), 2)  # (3, 32, 12, 12)
    tokens = net.tokens(x)
    assert tokens.shape == (3, 144, 32)
    torch.testing.assert_close(tokens[:, 2 * 12 + 6], fmap[:, :, 2, 6])
    torch.testing.assert_close(tokens, fmap.permute(0, 2, 3, 1).reshape(3, 144, 32))

    # G = softmax(Q Kᵀ / √d) with Q = X W_Qᵀ, K = X W_Kᵀ (d = 16, no bias)
    a = net.attention
    q, k = tokens @ a.to_q.weight.T, tokens @ a.to_k.weight.T
    assert q.shape == (3, 144, 16)
    torch.testing.assert_close(net.gates(x), torch.softmax(q @ k.transpose(1, 2) / 4.0, dim=-1))
    # P = G V W_Oᵀ + b, then the mean over tokens and the linear head
    p = g @ (tokens @ a.to_v.weight.T) @ a.to_out.weight.T + a.to_out.bias
    torch.testing.assert_close(logits, p.mean(1) @ net.head.fc.weight.T + net.head.fc.bias)


def test_conv_stem_without_attention_and_residual_option():
    torch.manual_seed(0)
    stem = gatepool.create_model("conv_stem")
    x = digits()
    assert stem(x).shape == (3, 10)
    torch.testing.assert_close(stem(x), stem.head.fc(stem.tokens(x).mean(1)))
    with pytest.raises(ValueError, match="return_weights=True needs attention=True"):
        stem(x, return_weights=True)
    res = ConvAttentionNet(residual=True)
    t = res.tokens(x)
    torch.testing.assert_close(res.mix(t), t + res.attention(t))


def test_conv_attention_layer_is_shuffle_equivariant_and_prediction_invariant():
    torch.manual_seed(0)
    net = gatepool.create_model("conv_attention").eval()
    tokens = net.tokens(digits(2))
    shuffle = PermuteTokens(dim=1, seed=0)
    assert_equivariant(net.mix, tokens, shuffle)
    assert_invariant(lambda t: net.head(net.mix(t)), tokens, shuffle)


@pytest.mark.parametrize("pool", ["cls", "avg", "latent"])
@pytest.mark.parametrize("pos", ["learned", "learned-2d", "sinusoidal", "none"])
def test_vit_shapes(pool, pos):
    vit = ViT(image_size=28, patch_size=7, in_channels=1, dim=32, depth=2, num_heads=4, num_classes=10,
              pool=pool, pos=pos)  # fmt: skip
    logits, weights = vit(digits(2), return_weights=True)
    t = 16 + (pool == "cls")
    assert logits.shape == (2, 10)
    assert len(weights) == 2 and weights[0].shape == (2, 4, t, t)
    assert vit.forward_features(digits(2)).shape == (2, t, 32)


def test_vit_patchify_is_a_linear_map_of_each_patch():
    torch.manual_seed(0)
    vit = gatepool.create_model("vit_mnist", patch_size=7, dim=16, depth=1, num_heads=2)
    x = digits(2)
    patches = x.unfold(2, 7, 7).unfold(3, 7, 7).reshape(2, 16, 49)  # (B, 4·4 patches, 7·7 pixels), row-major
    conv = vit.patchify.conv
    want = patches @ conv.weight.reshape(16, 49).T + conv.bias
    torch.testing.assert_close(vit.patchify(x), want)
    embedded = vit.embed(x)  # CLS first, then positions added
    cls = vit.cls_token[0, 0] + vit.pos_embedding.weight[0]
    torch.testing.assert_close(embedded[:, 0], cls.expand(2, 16))
    torch.testing.assert_close(embedded[:, 1:], want + vit.pos_embedding.weight[1:])


def test_vit_mnist_defaults_and_errors():
    vit = gatepool.create_model("vit_mnist")
    assert vit.patch_size == 4 and vit.num_patches == 49
    assert vit(digits(2)).shape == (2, 10)
    assert 0.05e6 < sum(p.numel() for p in vit.parameters()) < 0.5e6
    with pytest.raises(ValueError, match="patch_size"):
        ViT(image_size=28, patch_size=5, in_channels=1, dim=8, depth=1, num_heads=1, num_classes=10)
    with pytest.raises(ValueError, match="pool"):
        gatepool.create_model("vit_mnist", pool="max")
    with pytest.raises(ValueError, match="pool must be one of .*'latent'"):
        gatepool.create_model("vit_mnist", pool="attention")  # the old name of the latent query
    with pytest.raises(ValueError, match="x must be images"):
        vit(torch.rand(2, 1, 32, 32))
    with pytest.raises(ValueError, match="num_heads"):
        gatepool.create_model("vit_mnist", num_heads=5)


def test_attention_pool_zero_query_is_average_pool_and_follows_its_gate():
    torch.manual_seed(0)
    pool = AttentionPoolLatent(8, num_queries=1, num_heads=2)
    x = torch.randn(3, 5, 8)
    a = pool.attn
    with torch.no_grad():
        pool.queries.zero_()
    # zero query → every score 0 → the even gate: the mean of the values, projected
    mean_of_values = (x @ a.to_v.weight.T).mean(1) @ a.to_out.weight.T + a.to_out.bias
    torch.testing.assert_close(pool(x), mean_of_values)

    with torch.no_grad():
        pool.queries.normal_()
    out, w = pool(x, return_weights=True)
    assert out.shape == (3, 8) and w.shape == (3, 2, 1, 5)
    q = (pool.queries @ a.to_q.weight.T).view(1, 2, 4)  # (Q, heads, d)
    k = (x @ a.to_k.weight.T).view(3, 5, 2, 4)
    g = torch.softmax(torch.einsum("qhd,bthd->bhqt", q, k) / 2.0, dim=-1)  # (B, heads, 1, T)
    torch.testing.assert_close(w, g)
    feat = torch.randn(3, 8, 2, 3)  # a CNN feature map: 6 positions
    assert pool(feat).shape == (3, 8)
    assert AttentionPoolLatent(8, num_queries=4)(x).shape == (3, 4, 8)
    assert_invariant(pool, x, PermuteTokens(dim=1, seed=2))


def test_attention_pool_latent_key_mask_drops_tokens():
    torch.manual_seed(0)
    pool = AttentionPoolLatent(8, num_queries=2, num_heads=2)
    x = torch.randn(3, 5, 8)
    real = torch.ones(3, 5, dtype=torch.bool)
    real[1, 3:] = False  # sample 1 has three real tokens, then two of padding
    out, w = pool(x, key_mask=real, return_weights=True)
    torch.testing.assert_close(out[1], pool(x[1:2, :3])[0])  # the same as the three tokens alone
    torch.testing.assert_close(out[[0, 2]], pool(x[[0, 2]]))
    assert (w[1, ..., 3:] == 0).all()


def test_vit_latent_pool_is_the_latent_query_over_the_tokens():
    torch.manual_seed(0)
    vit = ViT(image_size=28, patch_size=7, in_channels=1, dim=16, depth=1, num_heads=2, num_classes=10,
              pool="latent").eval()  # fmt: skip
    assert isinstance(vit.pool, AttentionPoolLatent) and vit.cls_token is None
    x = digits(2)
    torch.testing.assert_close(vit(x), vit.head(vit.pool(vit.forward_features(x))))


def test_registry_names():
    names = gatepool.list_models()
    for name in ("conv_attention", "conv_stem", "vit_mnist", "seq_decoder", "seq_encoder_decoder"):
        assert name in names
    assert gatepool.create_model("conv_attention").has_attention
    assert not gatepool.create_model("conv_stem").has_attention
