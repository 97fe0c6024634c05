"""Spatial-reduction attention (PVT v2's: keys and values from the tokens' map reduced by a strided conv and
a LayerNorm) against Monte Carlo, and the walk along a small PVT v2 in plain torch: a channels-last map into
(N, H·W, C) tokens and back, the attention called with the map's size, a contiguous copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import DT, assert_walk_holds, gaussian_field, tokens_of_a_map_ratios

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.conv import conv_rule
from gatepool.analysis.probe.correlated.layernorm import layernorm_rule


class _SRAttention(nn.Module):
    """PVT v2's attention as timm writes it (sr_ratio > 1), in plain torch."""

    def __init__(self, dim: int, heads: int, sr: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.kv, self.proj = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.sr, self.norm = nn.Conv2d(dim, dim, sr, stride=sr), nn.LayerNorm(dim)

    def forward(self, x, feat_size):  # x (B, T, C)
        B, N, C = x.shape
        H, W = feat_size
        q = self.q(x).reshape(B, N, self.heads, -1).permute(0, 2, 1, 3)
        y = self.sr(x.permute(0, 2, 1).reshape(B, C, H, W)).reshape(B, C, -1).permute(0, 2, 1)
        kv = self.kv(self.norm(y)).reshape(B, -1, 2, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)
        o = F.scaled_dot_product_attention(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(B, N, C))


def _rule(m: _SRAttention) -> cr.SpatialReductionAttention:
    w, b = torch.cat((m.q.weight, m.kv.weight)), torch.cat((m.q.bias, m.kv.bias))
    reduce, norm = conv_rule(m.sr), layernorm_rule(m.norm)
    return cr.SpatialReductionAttention(w, b, m.proj.weight, m.proj.bias, m.heads, reduce, norm)


cr.register_correlated_rule(_SRAttention, _rule)


@pytest.mark.parametrize("ell", [0.1, 0.8], ids=["independent-tokens", "correlated-tokens"])
def test_spatial_reduction_attention_matches_monte_carlo(ell):
    """36 tokens of a 6 × 6 map, their keys and values from its 3 × 3 reduction (sr 2): pooled variance
    within 10% forward and the input's E[g²] within 15% backward (at seed 0, torch 2.13.0: 1.03 and 1.04
    forward, 1.05 and 1.01 backward; with the queries' count for the keys' in the weights, 1/T for 1/S,
    0.006–0.010 forward; without the keys' and values' gradient back through the reduction, 0.03
    backward)."""
    torch.manual_seed(0)
    m = _SRAttention(32, 2, 2).double()
    fwd, bwd = tokens_of_a_map_ratios(m, _rule(m), 32, 6, 6, ell)
    assert abs(fwd - 1) < 0.10 and abs(bwd - 1) < 0.15, (fwd, bwd)
    with pytest.raises(NotImplementedError, match="size not given"):
        _rule(m).forward(cr.FlattenPositions().forward(gaussian_field(C=32, H=6, W=6, batch=1)[1]))


class _PVT(nn.Module):
    """PVT v2's path, small: an overlapping patch embedding, channels last, LayerNorm, the map's tokens
    (``x.reshape(B, -1, C)``), a block (LayerNorm, spatial-reduction attention, LayerNorm, MLP), the
    tokens back into a channels-last map (``x.reshape(B, H, W, -1)``), channels first, the head."""

    def __init__(self, D: int = 32) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, D, 3, stride=2, padding=1)
        self.norm0, self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = _SRAttention(D, 2, 2)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.head = nn.Linear(D, 10)

    def forward(self, x):
        x = self.norm0(self.embed(x).permute(0, 2, 3, 1))  # (B, H, W, C)
        B, H, W, C = x.shape
        x = x.reshape(B, -1, C)  # (B, T, C)
        x = x + self.attn(self.norm1(x), (H, W))
        x = x + self.mlp(self.norm2(x))
        x = x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()  # (B, C, H, W)
        return self.head(x.mean((2, 3)))


@pytest.mark.slow
def test_the_walk_follows_a_pvt():
    """Every module of :class:`_PVT` predicted, within 10% forward and 15% backward of its measurement
    (512 noise images, ∂L/∂logits ~ N(0, 1))."""
    torch.manual_seed(0)
    model = _PVT().double()
    x = torch.randn(512, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=DT)
    names = ["embed", "norm0", "norm1", "attn", "norm2", "mlp", "head"]
    assert_walk_holds(model, x, names)
