"""CoaT's factorized attention with its convolutional relative position encoding, a step over draws of its
input from the state (:mod:`correlated.draws`), against Monte Carlo on Gaussian tokens of known
correlation."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import _ramp, assert_walk_holds, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.draws import Moments, draw
from gatepool.analysis.probe.correlated.registry import register_correlated_rule


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

    def __init__(self, dim: int, heads: int, window: dict, crpe: nn.Module | None = None) -> None:
        super().__init__()
        self.num_heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.0)
        self.crpe = crpe or _ConvRelPosEnc(dim // heads, window)

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


def _coat_ratios(std: float, ell: float, H: int = 4, W: int = 4, C: int = 8, batch: int = 4000) -> dict:
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


class _TinyCoaT(nn.Module):
    """A patch embedding into 4 × 4 tokens, a class token, one factorized attention whose crpe is the
    model's own module (CoaT's is its stage's, named ``crpe1``), the class token and the patches cut out
    (``x[:, 1:, :]``, CoaT's ``remove_cls``) into two heads."""

    def __init__(self) -> None:
        super().__init__()
        self.crpe = _ConvRelPosEnc(8, {3: 1, 5: 1})
        self.embed = nn.Conv2d(3, 16, 2, stride=2)
        self.cls = nn.Parameter(torch.linspace(-1, 1, 16).reshape(1, 1, 16))
        self.attn = _FactorAttn(16, 2, {}, crpe=self.crpe)
        self.head, self.head2 = nn.Linear(16, 256), nn.Linear(16, 256)  # the gradient's channels ~independent

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), 1)
        x = x + self.attn(x, (4, 4))
        return self.head(x[:, 0]) + self.head2(x[:, 1:, :].mean(1))


def test_the_walk_takes_the_factor_attention_and_its_inner_rows():
    """The walk through :class:`_TinyCoaT` (the rule registered for its attention) against 2048 N(0, 1)
    images of 3 × 8 × 8: the attention's row, its crpe's and the crpe's convs' (modules it calls inside,
    rows of their own) and the heads' within 10% forward and 15% backward (seed 0, torch 2.13.0: 0.96–1.01
    and 0.96–1.02). Without the walk's rows of a step's inner modules the crpe has no row; without
    ``x[:, 1:, :]`` as a slice of the tokens the second head has no prediction. With heads of 10 logits
    (the gradient's 16 channels correlated, which the state leaves out) the convs' gradients are 1.26
    and 0.79."""
    register_correlated_rule(_FactorAttn, cr.FactorAttention)
    torch.manual_seed(0)
    model = _TinyCoaT().double()
    x = torch.randn(2048, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert_walk_holds(model, x, ["attn", "crpe", "crpe.conv_list.0", "crpe.conv_list.1", "head", "head2"])
