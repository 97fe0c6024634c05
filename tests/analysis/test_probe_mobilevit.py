"""MobileViT's patches: a map's positions regrouped into (B·p, n, C) tokens (``correlated.Regrouped``), the
attention within each in-patch offset's sub-lattice (``correlated.CellAttention``) against Monte Carlo,
and the walk through a small MobileViT block."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from test_probe_correlated import DT, _ramp, assert_walk_holds, gaussian_field
from test_probe_window_attention import _holds

from gatepool.analysis.probe import correlated as cr


def unfold(x: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
    """timm's ``MobileVitBlock`` (1.0.31, as written there): (B, C, H, W) into (B·ph·pw, n, C) tokens."""
    B, C, H, W = x.shape
    nh, nw = H // ph, W // pw
    x = x.reshape(B * C * nh, ph, nw, pw).transpose(1, 2)
    return x.reshape(B, C, nh * nw, ph * pw).transpose(1, 3).reshape(B * ph * pw, nh * nw, -1)


def fold(x: torch.Tensor, B: int, C: int, H: int, W: int, ph: int, pw: int) -> torch.Tensor:
    """Its fold: the tokens back into the (B, C, H, W) map."""
    nh, nw = H // ph, W // pw
    x = x.contiguous().view(B, ph * pw, nh * nw, -1)
    x = x.transpose(1, 3).reshape(B * C * nh, nw, ph, pw)
    return x.transpose(1, 2).reshape(B, C, nh * ph, nw * pw)


def _offsets(H: int, W: int, ph: int, pw: int) -> torch.Tensor:
    """(H·W,): each position's in-patch offset (i, j), MobileViT's cells."""
    return ((torch.arange(H)[:, None] % ph) * pw + torch.arange(W)[None, :] % pw).flatten()


def _windows(H: int, W: int, ph: int, pw: int) -> torch.Tensor:
    """(H·W,): each position's patch: the cells taken wrong (contiguous windows)."""
    return ((torch.arange(H)[:, None] // ph) * (W // pw) + torch.arange(W)[None, :] // pw).flatten()


def test_the_unfolds_index_is_the_sub_lattices_and_the_fold_the_map():
    """The unfold's reshapes and transposes on the map's index: rows the in-patch offsets, the channels
    last (a Linear there is the map's 1 × 1 conv); the fold's bring back the map's own layout; a Linear's
    width changes the index's channels alone."""
    C, H, W, ph, pw = 3, 4, 6, 2, 2
    t = unfold(cr.map_index((C, H, W)), ph, pw)
    lay = cr.regrouped(t, (C, H, W))
    assert isinstance(lay, cr.Regrouped) and lay[-1] == "C" and lay.where.shape == (4, 6, 3)
    assert torch.equal(lay.cells(), _offsets(H, W, ph, pw))
    assert cr.regrouped(fold(t, 1, C, H, W, ph, pw), (C, H, W)) == ("C", "H", "W")
    wide = lay.with_channels(5)
    pos = (lay.where % (H * W))[..., :1].expand(4, 6, 5)
    assert wide.chw == (5, H, W) and torch.equal(wide.where % (H * W), pos)
    assert lay != wide and lay == cr.regrouped(t.clone(), (C, H, W))


def _attention(D: int, heads: int, scale: float) -> nn.MultiheadAttention:
    g = torch.Generator().manual_seed(0)
    att = nn.MultiheadAttention(D, heads, batch_first=True).double()
    with torch.no_grad():
        att.in_proj_weight.copy_(torch.randn(3 * D, D, generator=g, dtype=DT) * scale)
        att.in_proj_bias.copy_(torch.randn(3 * D, generator=g, dtype=DT) * 0.1)
        att.out_proj.weight.copy_(torch.linalg.qr(torch.randn(D, D, generator=g, dtype=DT))[0])
    return att


def _run(scale: float, cells):
    """The rule with these cells and Monte Carlo on a 6 × 8 map of 8 channels in 2 × 2 patches (12 tokens
    to a row), two heads: (forward pred, draws, backward pred, x's gradient)."""
    D, heads, H, W, ph, pw = 8, 2, 6, 8, 2, 2
    att = _attention(D, heads, scale)
    mean, var = _ramp(D, H, W, -0.5, 0.5), _ramp(D, H, W, 0.5, 2.0)
    x, f = gaussian_field(C=D, H=H, W=W, ell=0.8, mean=mean, var=var, batch=1000)
    xr = x.clone().requires_grad_()
    t = unfold(xr, ph, pw)
    y = fold(att(t, t, t, need_weights=False)[0], x.shape[0], D, H, W, ph, pw)
    rule = cr.CellAttention(cr.Attention(att.in_proj_weight, att.in_proj_bias, att.out_proj.weight,
                                         att.out_proj.bias, heads), cells(H, W, ph, pw))  # fmt: skip
    pred = rule.forward(f)
    g, gf = gaussian_field(C=D, H=H, W=W, seed=2, ell=1.0, var=_ramp(D, H, W, 0.3, 3.0), batch=1000)
    (y * g).sum().backward()
    return pred, y.detach(), rule.backward(gf), xr.grad


def test_attention_within_the_patches_offsets_matches_monte_carlo():
    """Near-uniform weights (qkv of std 0.05): each output the mean value of its offset's sub-lattice, a
    strided average, exact but for the value channels' covariance (each position's variance pooled over
    the channels, which the orthogonal projection keeps); back the same sums transposed. Attending
    within contiguous 2 × 2 windows instead (the patches themselves) misses both by far."""
    pred, y, back, grad = _run(0.05, _offsets)
    _holds(pred, y, 0.02)
    _holds(back, grad, 0.02)
    wrong, _, wrong_back, _ = _run(0.05, _windows)
    with pytest.raises(AssertionError):
        _holds(wrong, y, 0.02)
    with pytest.raises(AssertionError):
        _holds(wrong_back, grad, 0.02)


class _Block(nn.Module):
    """timm's ``MobileVitBlock`` small, at timm's init (its Linears of std 0.01, its convs of
    √(2/fan_out)): a 1 × 1 conv, unfold into 2 × 2 patches' tokens, a transformer block (LayerNorm,
    attention, MLP), a LayerNorm, fold, a 1 × 1 conv, the cat with its input, a fusion conv, the global
    pool and a head; beside it the input in one 8 × 8 patch (each token its row's alone: the attention
    is its values), pooled into a second head. Its input conv has 9 taps of 16 channels a channel, its
    second attention reads the input's own channels: the channels nearly uncorrelated, as the state
    takes them (a 1 × 1 conv of 8 channels into 16 gives 16 of rank 8: LayerNorm's divisor then has
    half the degrees of freedom the rule gives it, its backward 0.76 of the measured; 48 channels keep
    the random weights' own channel covariance small)."""

    def __init__(self, C: int = 48, D: int = 48, heads: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(C, D, 3, padding=1, bias=False)
        self.norm1, self.norm2, self.norm = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, heads, batch_first=True)
        self.fc1, self.act, self.fc2 = nn.Linear(D, 2 * D), nn.SiLU(), nn.Linear(2 * D, D)
        self.proj = nn.Conv2d(D, D, 1)
        self.fusion = nn.Conv2d(C + D, 8, 3, padding=1)
        self.attn2 = nn.MultiheadAttention(C, heads, batch_first=True)
        self.head, self.head2 = nn.Linear(8, 10), nn.Linear(C, 10)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0, (2 / fan_out) ** 0.5)
            elif isinstance(m, (nn.Linear, nn.MultiheadAttention)):
                for name, w in m.named_parameters():
                    nn.init.normal_(w, 0, 0.01) if "weight" in name else nn.init.zeros_(w)

    def forward(self, x):
        y = self.conv(x)
        B, C, H, W = y.shape
        t = unfold(y, 2, 2)
        h = self.norm1(t)
        t = t + self.attn(h, h, h, need_weights=False)[0]
        t = t + self.fc2(self.act(self.fc1(self.norm2(t))))
        y = self.proj(fold(self.norm(t), B, C, math.ceil(H / 2) * 2, math.ceil(W / 2) * 2, 2, 2))
        z = self.fusion(torch.cat((x, y), dim=1))
        B, C, H, W = x.shape
        t = unfold(x, H, W)
        u = x + fold(self.attn2(t, t, t, need_weights=False)[0], B, C, H, W, H, W)
        return self.head(z.mean((2, 3))) + self.head2(u.mean((2, 3)))


def test_the_walk_follows_a_mobilevit_block():
    """Every module predicted (before: the walk stopped at the unfold's first reshape), within 10%
    forward and 15% backward of 512 noise images. At seed 0 (torch 2.13.0, CPU) 0.95–1.04 forward (the
    one-patch attention 0.955, the head after the fusion 0.950) and 0.97–1.03 backward; the rows' cells
    taken as the tokens' (each patch a cell: contiguous 2 × 2 windows, the one patch all 64 positions)
    give the attention's output 4.0 and the one-patch attention's 0.015."""
    torch.manual_seed(0)
    model = _Block().double()
    x = torch.randn(512, 48, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT)
    names = "conv norm1 attn fc1 act fc2 norm2 norm proj fusion attn2 head head2".split()
    assert_walk_holds(model, x, names)
