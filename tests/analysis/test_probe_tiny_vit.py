"""TinyViT's attention (timm's ``tiny_vit.Attention``) in its block's windows against Monte Carlo: the
module written out in plain torch (timm 1.0.31's, no fused kernel) with the block's partition."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from test_probe_correlated import DT, _ramp, gaussian_field
from test_probe_window_attention import _holds

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.tiny_vit import tiny_vit_attention_rule


class _Attention(torch.nn.Module):
    """timm's TinyViT ``Attention`` (attn_ratio 1): LayerNorm, qkv head by head, the offset bias, proj."""

    def __init__(self, dim: int, heads: int, w: int) -> None:
        super().__init__()
        self.num_heads, self.key_dim, self.val_dim = heads, dim // heads, dim // heads
        self.scale, self.resolution = self.key_dim**-0.5, (w, w)
        self.norm = torch.nn.LayerNorm(dim, dtype=DT)
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=DT)
        self.proj = torch.nn.Linear(dim, dim, dtype=DT)
        points = list(itertools.product(range(w), range(w)))
        offsets: dict = {}
        pairs = ((abs(a - c), abs(b - d)) for a, b in points for c, d in points)
        idxs = [offsets.setdefault(e, len(offsets)) for e in pairs]
        self.attention_biases = torch.nn.Parameter(torch.zeros(heads, len(offsets), dtype=DT))
        self.register_buffer("attention_bias_idxs", torch.tensor(idxs).view(w * w, w * w))

    def forward(self, x):
        B, N, _ = x.shape
        qkv = self.qkv(self.norm(x)).view(B, N, self.num_heads, -1)
        q, k, v = (t.permute(0, 2, 1, 3) for t in qkv.split([self.key_dim, self.key_dim, self.val_dim], 3))
        attn = (q * self.scale) @ k.transpose(-2, -1) + self.attention_biases[:, self.attention_bias_idxs]
        x = (attn.softmax(-1) @ v).transpose(1, 2).reshape(B, N, -1)
        return self.proj(x)


def _block_attention(attn: _Attention, x: torch.Tensor, w: int) -> torch.Tensor:
    """``TinyVitBlock``'s attention on a (B, C, H, W) map (channels-last inside): padded to whole windows,
    the partition, the attention, the reverse, the crop."""
    x = x.permute(0, 2, 3, 1)
    B, H, W, C = x.shape
    pb, pr = (w - H % w) % w, (w - W % w) % w
    x = F.pad(x, (0, 0, 0, pr, 0, pb))
    pH, pW = H + pb, W + pr
    nH, nW = pH // w, pW // w
    x = x.view(B, nH, w, nW, w, C).transpose(2, 3).reshape(B * nH * nW, w * w, C)
    x = attn(x)
    x = x.view(B, nH, nW, w, w, C).transpose(2, 3).reshape(B, pH, pW, C)
    return x[:, :H, :W].permute(0, 3, 1, 2)


def _module(D: int, heads: int, w: int, bias_std: float) -> _Attention:
    """Queries and keys of std 0.02 (TinyViT's init: near-uniform weights), values of std 1 (so a qkv
    read in the wrong order moves every output), a LayerNorm of spread γ and β (β sets the padding's
    tokens), an orthogonal projection (the value channels' covariance, which the state drops, summed
    away), an offset bias table of std ``bias_std``."""
    g = torch.Generator().manual_seed(0)
    m = _Attention(D, heads, w)
    with torch.no_grad():
        scale = torch.tensor([0.02] * 2 * (D // heads) + [1.0] * (D // heads), dtype=DT).repeat(heads)
        m.qkv.weight.copy_(torch.randn(3 * D, D, generator=g, dtype=DT) * scale[:, None])
        m.qkv.bias.copy_(torch.randn(3 * D, generator=g, dtype=DT) * 0.3 * (scale > 0.5))
        m.proj.weight.copy_(torch.linalg.qr(torch.randn(D, D, generator=g, dtype=DT))[0])
        m.proj.bias.copy_(torch.randn(D, generator=g, dtype=DT) * 0.1)
        m.norm.weight.copy_(1 + 0.3 * torch.randn(D, generator=g, dtype=DT))
        m.norm.bias.copy_(0.5 * torch.randn(D, generator=g, dtype=DT))
        m.attention_biases.copy_(torch.randn(m.attention_biases.shape, generator=g, dtype=DT) * bias_std)
    return m


def _run(H: int, W: int, w: int, bias_std: float, D: int = 32, rule=None):
    """(forward pred, draws, backward pred, draws) of D channels in 2 heads on an (H, W) map, windows w."""
    heads = 2
    m = _module(D, heads, w, bias_std)
    rule = tiny_vit_attention_rule(m) if rule is None else rule(m)
    mean, var = _ramp(D, H, W, -0.5, 0.5), _ramp(D, H, W, 0.5, 2.0)
    x, f = gaussian_field(C=D, H=H, W=W, ell=0.8, mean=mean, var=var, batch=2000)
    xr = x.clone().requires_grad_()
    y = _block_attention(m, xr, w)
    pred = rule.forward(f)
    g, gf = gaussian_field(C=D, H=H, W=W, seed=2, ell=1.0, var=_ramp(D, H, W, 0.3, 3.0), batch=2000)
    (y * g).sum().backward()
    return pred, y.detach(), rule.backward(gf), xr.grad


@pytest.mark.parametrize("H, W, w", [(5, 7, 3), (4, 4, 4)], ids=["padded-windows", "one-window"])
def test_tiny_vit_attention_matches_monte_carlo(H, W, w):
    """Every position's variance and mean within 5 Monte Carlo standard errors plus 2% forward and
    backward, lags 1 and 2 within 0.02: the 5 × 7 map in 3 × 3 windows padded to 6 × 9 (padding tokens
    x̂ = β, values W β + b) and a 4 × 4 map that is one window. There the gradient at the values is one
    map over the window (correlation 1) and x's lags are the LayerNorm's, whose rule drops those of its
    x̂ mean_c(ĝ x̂) term: 1.00 at lags 1 and 2 against 0.972 and 0.953 (seed 0, torch 2.13.0), as the
    LayerNorm's alone on this field with a gradient constant over the map (0.972, 0.954); its lags are
    held to 0.05. Without the LayerNorm, with qkv's rows read as three chunks (Swin's order) or with the
    padding's tokens at the projections' bias alone (β left out) it fails."""
    pred, y, back, grad = _run(H, W, w, 0.0)
    _holds(pred, y, 0.02)
    _holds(back, grad, 0.02 if H > w else 0.05)


@pytest.mark.parametrize("H, W, w", [(5, 7, 3), (4, 4, 4)], ids=["padded-windows", "one-window"])
def test_tiny_vit_attention_bias_matches_monte_carlo(H, W, w):
    """An offset bias table of std 0.5 (κ ≈ 0.28 from it alone): pooled over the positions within 2%
    forward and backward (at seed 0, torch 2.13.0: 0.998 and 1.005 padded, 0.997 and 0.998 one window;
    the bias left out of the rule 0.968 and 0.965, 0.977 and 0.977)."""
    pred, y, back, grad = _run(H, W, w, 0.5)
    assert abs(float(pred.var.mean()) / float(cr.measure_field(y).var.mean()) - 1) < 0.02
    assert abs(float(back.var.mean()) / float(grad.pow(2).mean()) - 1) < 0.02
