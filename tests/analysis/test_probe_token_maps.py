"""Tokens back into a map (PiT's ``x.transpose(1, 2).reshape(N, C, H, W)``) against Monte Carlo, and the
walk along a small PiT: class tokens sliced off by their traced count, the patches back into a map, a
depthwise conv's pooling beside a Linear on the class tokens, a second stage of tokens."""

from __future__ import annotations

import torch
from test_probe_correlated import DT, _ramp, assert_walk_holds, close, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.field import _field_from_sums


def test_unflatten_positions_matches_monte_carlo():
    """A (C, 1, 24) sequence stationary along it (a varying envelope) into a 4 × 6 map: exact, map lag
    (d_h, d_w) at sequence lag 6 d_h + d_w (lag (1, 0) is the sequence's lag 6, (0, 1) its lag 1); back,
    a correlated map's gradient flattened."""
    mean, var = _ramp(2, 1, 24, -1.0, 2.0), _ramp(2, 1, 24, 0.5, 2.0)
    x, field = gaussian_field(H=1, W=24, mean=mean, var=var, ell=2.5)
    rule = cr.UnflattenPositions(4, 6)
    xr = x.clone().requires_grad_()
    y = xr[:, :, 0].reshape(-1, 2, 4, 6)
    out = rule.forward(field)
    close(out, y.detach(), rel=0.02, corr=0.01, lags=(1, 2))
    mc = cr.measure_field(y.detach())
    for lag in ((1, 0), (0, 1), (1, 1), (1, -2)):
        e = (3 + lag[0], 5 + lag[1])
        assert abs(float(out.corr[:, e[0], e[1]].mean()) - float(mc.corr[:, e[0], e[1]].mean())) < 0.02, lag
    g, gf = gaussian_field(H=4, W=6, seed=2, ell=1.2, var=_ramp(2, 4, 6, 0.3, 3.0))
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad[:, :, 0][:, :, None], rel=0.02, corr=0.02, lags=(1, 2, 6))


class _PiT(torch.nn.Module):
    """timm's PiT path, small: patches with a position embedding, a class token, per stage the patches
    flattened beside the class tokens, an attention block, the class tokens sliced off by their count
    (``cls.shape[1]``), the patches back into a map; between stages a depthwise conv of stride 2 and a
    Linear on the class tokens; the head on the class token."""

    def __init__(self, D: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Conv2d(3, D, 4, stride=2, padding=1)  # 48 inputs a channel: nearly uncorrelated
        self.pos = torch.nn.Parameter(torch.randn(1, D, 7, 7) * 0.02)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, D) * 0.02)
        self.norm = torch.nn.ModuleList([torch.nn.LayerNorm(D), torch.nn.LayerNorm(2 * D)])
        self.attn = torch.nn.ModuleList(
            [torch.nn.MultiheadAttention(d, heads, batch_first=True) for d in (D, 2 * D)]
        )
        self.pool = torch.nn.Conv2d(D, 2 * D, 3, stride=2, padding=1, groups=D)
        self.fc = torch.nn.Linear(D, 2 * D)
        self.head = torch.nn.Linear(2 * D, 10)

    def stage(self, i, x, cls):
        n = cls.shape[1]
        B, C, H, W = x.shape
        x = torch.cat((cls, x.flatten(2).transpose(1, 2)), dim=1)
        h = self.norm[i](x)
        x = x + self.attn[i](h, h, h, need_weights=False)[0]
        return x[:, n:].transpose(1, 2).reshape(B, C, H, W), x[:, :n]

    def forward(self, x):
        x = self.embed(x) + self.pos
        x, cls = self.stage(0, x, self.cls.expand(x.shape[0], -1, -1))
        x, cls = self.stage(1, self.pool(x), self.fc(cls))
        return self.head(cls[:, 0])


def test_the_walk_follows_a_pit():
    """Every module predicted (before: the walk stopped at ``x[:, :n]``, n traced), within 20% forward and
    35% backward of 1024 noise images: the plumbing is exact, the attention's near-uniform model is not.
    At seed 0 (torch 2.13.0, CPU) the forward is 0.82–1.01 (the first attention's output 0.82, the
    Linear on the class tokens after it 0.88), the backward 0.71–1.13 (the first block's LayerNorm 0.71:
    its patches' gradient through the attention, 0.68; the class token's 0.82)."""
    torch.manual_seed(0)
    model = _PiT().double()
    x = torch.randn(1024, 3, 14, 14, generator=torch.Generator().manual_seed(1), dtype=DT)
    names = ["embed", "norm.0", "attn.0", "pool", "fc", "norm.1", "attn.1", "head"]
    assert_walk_holds(model, x, names, fwd=0.2, bwd=0.35)


def test_token_cat_backward_splits_the_lag_sums_by_the_pairs():
    """The gradient at ``torch.cat([cls, x], 1)`` of n = 17 tokens as a head leaves it: the class token's
    own part a (variance 400, its own), a part c every token shares (the attention's values' gradient,
    the tokens' mean's), each token's own s. Its state holds the variances and the lag sums exactly
    ((n − |e|) c² at e ≠ 0); the envelope's ρ(e) would give the pair (0, e) √(v_0 v_e) ρ(e), 10 times a
    pair of patches', out of the patches' share; the class token's weight capped at the patches' mean
    variance, each pair holds c². Against Monte Carlo, the patches' correlation at lags 1, 2 and
    E|Σ_p g_p|² (its lag sums' total; 0.51 of it and ρ(1) 0.27 against 0.50 with the envelope's ρ)."""
    n, B = 17, 20000
    gen = torch.Generator().manual_seed(0)
    a2, c2, s2 = 400.0, 1.0, 1.0
    g = c2**0.5 * torch.randn(B, 2, 1, 1, generator=gen, dtype=DT)  # shared by the tokens
    g = g + s2**0.5 * torch.randn(B, 2, 1, n, generator=gen, dtype=DT)
    g[..., 0] += a2**0.5 * torch.randn(B, 2, 1, generator=gen, dtype=DT)
    var = torch.full((2, 1, n), c2 + s2, dtype=DT)
    var[..., 0] += a2
    T = (n - torch.arange(-(n - 1), n).abs()).to(DT) * c2 * torch.ones((2, 1, 1), dtype=DT)
    T[..., n - 1] = var.sum(-1)
    gf = _field_from_sums(torch.zeros_like(var), var, T)
    step = cr.TokenCat()
    x = cr.Field(*(torch.ones(2, 1, k, dtype=DT) for k in (n - 1, n - 1, 2 * n - 3)))
    step.forward([torch.zeros(2, 1, 1, dtype=DT), x])  # the class token a constant
    (patches,) = step.backward(gf)
    mc = g[..., 1:]
    close(patches, mc, rel=0.03, corr=0.03, lags=(1, 2))
    total = float(mc.sum(-1).pow(2).mean())
    assert abs(float(patches.lag_sums().sum((1, 2)).mean()) / total - 1) < 0.03
