"""CoaT's factorized attention with its convolutional relative position encoding, a step over draws of its
input from the state (:mod:`correlated.draws`), against Monte Carlo on Gaussian tokens of known
correlation."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import _ramp, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.draws import Moments, draw


class _ConvRelPosEnc(nn.Module):
    """timm's ``coat.ConvRelPosEnc`` in plain torch."""

    def __init__(self, head_chs: int, window: dict) -> None:
        super().__init__()
        self.conv_list = nn.ModuleList(
            nn.Conv2d(s * head_chs, s * head_chs, w, padding=w // 2, groups=s * head_chs)
            for w, s in window.items()
        )
        self.channel_splits = [s * head_chs for s in window.values()]

    def forward(self, q, v, size):
        B, h, N, C = q.shape
        H, W = size
        v_img = v[:, :, 1:, :].transpose(-1, -2).reshape(B, h * C, H, W)
        conv_v = torch.cat(
            [c(p) for c, p in zip(self.conv_list, torch.split(v_img, self.channel_splits, 1))], 1
        )
        conv_v = conv_v.reshape(B, h, C, H * W).transpose(-1, -2)
        return F.pad(q[:, :, 1:, :] * conv_v, (0, 0, 1, 0, 0, 0))


class _FactorAttn(nn.Module):
    """timm's ``coat.FactorAttnConvRelPosEnc`` in plain torch."""

    def __init__(self, dim: int, heads: int, window: dict) -> None:
        super().__init__()
        self.num_heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.0)
        self.crpe = _ConvRelPosEnc(dim // heads, window)

    def forward(self, x, size):
        B, N, C = x.shape
        q, k, v = (
            self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        )
        factor = q @ (k.softmax(dim=2).transpose(-1, -2) @ v)
        x = (self.scale * factor + self.crpe(q, v, size)).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


def test_draws_carry_the_state():
    """8 channels of a 6 × 7 map (a mean ramp, a variance ramp, correlation length 1.2), 4000 draws by
    circulant embedding (seed 0, torch 2.13.0): the state of the draws, each variance within 5 of its
    standard errors (√(2/4000)) and the pooled one within 4%, the correlation at lags (1, 0), (0, 1),
    (1, 1) within 0.03, the mean within 0.05 on average. Broken (the draws independent: the eigenvalues
    flat) the correlation at (1, 0) is 0.00 against 0.83."""
    _, f = gaussian_field(C=8, H=6, W=7, ell=1.2, mean=_ramp(8, 6, 7, -1, 1), var=_ramp(8, 6, 7, 0.5, 2.0))
    m = Moments()
    m.add(draw(f, 4000, 0))
    got = m.field()
    assert torch.allclose(got.var, f.var, rtol=5 * (2 / 4000) ** 0.5, atol=0)
    assert abs(float(got.var.mean() / f.var.mean()) - 1) < 0.04
    assert float((got.mean - f.mean).abs().max()) < 0.1 and float((got.mean - f.mean).abs().mean()) < 0.05
    for dh, dw in ((1, 0), (0, 1), (1, 1)):
        a, b = got.corr[:, 5 + dh, 6 + dw], f.corr[:, 5 + dh, 6 + dw]
        assert float((a - b).abs().max()) < 0.03, (dh, dw, a, b)


def _coat_ratios(
    std: float, ell: float, H: int = 4, W: int = 4, C: int = 8, batch: int = 4000
) -> dict:
    """The rule's pooled variances and E[g²] over Monte Carlo's: the output, its class token, the crpe and
    each conv (forward); x, the crpe and the convs (backward, from a correlated Gaussian ∂L/∂y). The map's
    tokens a Gaussian sequence stationary along it (the state of tokens exact: :mod:`tokens`), a class
    token of fixed values before them."""
    torch.manual_seed(0)
    m = _FactorAttn(C, 2, {3: 1, 5: 1}).double()
    nn.init.trunc_normal_(m.qkv.weight, std=std)
    nn.init.trunc_normal_(m.proj.weight, std=std)
    N = 1 + H * W
    xs, f = gaussian_field(C=C, H=1, W=H * W, ell=ell, mean=_ramp(C, 1, H * W, -0.5, 0.5), batch=batch)
    cls = torch.linspace(-1, 1, C, dtype=torch.float64)
    tokens = cr.TokenCat().forward([cls[:, None, None], f])
    x = torch.cat((cls.expand(batch, 1, C), xs[:, :, 0].mT), 1).requires_grad_()
    seen = {}
    hooks = [mod.register_forward_hook(lambda mod, a, out, k=k: seen.__setitem__(k, out))
             for k, mod in enumerate([m.crpe, *m.crpe.conv_list])]  # fmt: skip
    y = m(x, (H, W))
    for t in hooks:
        t.remove()
    for t in seen.values():
        t.retain_grad()
    rule = cr.FactorAttention(m)
    rule.bind((H, W))
    pred = rule.forward(tokens)
    g, gf = gaussian_field(C=C, H=1, W=N, seed=2, ell=1.0, var=_ramp(C, 1, N, 0.3, 3.0), batch=batch)
    (y * g[:, :, 0].mT).sum().backward()
    gx = rule.backward(gf)
    out = {"out": float(pred.var.mean()) / float(y.detach().var(0).mean()),
           "cls": float(pred.var[..., 0].mean()) / float(y.detach()[:, 0].var(0).mean()),
           "x": float(gx.var.mean()) / float(x.grad.pow(2).mean())}  # fmt: skip
    for k, (_, fr, gr) in enumerate(rule.rows()):
        t = seen[k]
        out[f"row{k}"] = float((fr.var + fr.mean**2).mean()) / float(t.detach().pow(2).mean())
        out[f"grad{k}"] = float(gr.var.mean()) / float(t.grad.pow(2).mean())
    return out


@pytest.mark.parametrize("std", [0.02, 0.3], ids=["timm-init", "strong"])
def test_factor_attention_matches_monte_carlo(std):
    """16 channels in 2 heads, a 6 × 6 map and a class token, convs of windows 3 and 5; the qkv and proj
    weights of std 0.02 (timm's init) or 0.3 (the keys' softmax far from uniform); 2000 draws of Monte
    Carlo, 2048 of the rule (seed 0, torch 2.13.0): every ratio within 3% (the output's, its class
    token's, x's gradient's, the crpe's and its two convs' values and gradients). Broken, the rule's draws
    independent over the tokens: the class token 0.31 and 0.70, x's gradient 0.90 and 0.70."""
    r = _coat_ratios(std, 1.0)
    assert all(abs(v - 1) < 0.06 for v in r.values()), r
