"""CaiT's two attentions against Monte Carlo: talking heads (the heads' scores mixed by a Linear before the
softmax, the weights by another after it) and class attention (the class token alone queries every token),
as timm writes them, in plain torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import DT, _ramp, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.class_attention import class_attention_rule, cross_attention_rule
from gatepool.analysis.probe.correlated.talking_heads import talking_heads_rule

D, HEADS, T, DRAWS = 32, 4, 16, 2000


class _TalkingHeads(nn.Module):
    """timm's ``TalkingHeadAttn``; ``values_detached``: v computed from x.detach() (the gradient through the
    queries and keys alone)."""

    def __init__(self, values_detached: bool = False) -> None:
        super().__init__()
        self.num_heads, self.scale, self.values_detached = HEADS, (D // HEADS) ** -0.5, values_detached
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.proj_l, self.proj_w = nn.Linear(HEADS, HEADS), nn.Linear(HEADS, HEADS)
        self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.0)

    def forward(self, x):  # (B, N, C)
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        if self.values_detached:
            v = self.qkv(x.detach()).reshape(B, N, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)[2]
        a = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, N, N)
        a = self.proj_l(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).softmax(-1)
        a = self.proj_w(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.proj((a @ v).transpose(1, 2).reshape(B, N, C))


class _ClassAttn(nn.Module):
    """timm's ``ClassAttn``: the class token's query over every token's key; one token out."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.scale = HEADS, (D // HEADS) ** -0.5
        self.q, self.k, self.v, self.proj = (nn.Linear(D, D) for _ in range(4))
        self.attn_drop, self.proj_drop = nn.Dropout(0.0), nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        q = self.q(x[:, 0]).reshape(B, 1, HEADS, C // HEADS).permute(0, 2, 1, 3)
        k, v = (p(x).reshape(B, N, HEADS, C // HEADS).permute(0, 2, 1, 3) for p in (self.k, self.v))
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, 1, C))


class _CrossAttention(_ClassAttn):
    """timm's CrossViT ``CrossAttention``: the same with its Linears named ``wq``, ``wk``, ``wv``."""

    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv = self.q, self.k, self.v
        del self.q, self.k, self.v

    def forward(self, x):
        B, N, C = x.shape
        q = self.wq(x[:, 0:1, ...]).reshape(B, 1, HEADS, C // HEADS).permute(0, 2, 1, 3)
        k, v = (p(x).reshape(B, N, HEADS, C // HEADS).permute(0, 2, 1, 3) for p in (self.wk, self.wv))
        a = ((q @ k.transpose(-2, -1)) * self.scale).softmax(-1)
        return self.proj((a @ v).transpose(1, 2).reshape(B, 1, C))


def _ratios(model, rule, ell: float, class_token: bool = False):
    """(forward, backward, the first token's backward): the rule's pooled variance over the Monte Carlo's,
    of the output and of x's gradient (∂L/∂y a correlated Gaussian field)."""
    n = T + class_token
    x, f = gaussian_field(C=D, H=1, W=n, ell=ell, mean=_ramp(D, 1, n, -0.5, 0.5), batch=DRAWS)
    if class_token:  # a fixed token before the others
        c = torch.randn(D, dtype=DT, generator=torch.Generator().manual_seed(3))
        x[:, :, 0, 0], f.mean[:, 0, 0], f.var[:, 0, 0] = c, c, 0.0
    xr = x.clone().requires_grad_()
    y = model(xr[:, :, 0].mT)  # (B, T', D)
    pred, mc = rule.forward(f), cr.measure_field(y.detach().mT[:, :, None])
    m = y.shape[1]
    var = None if m == 1 else _ramp(D, 1, m, 0.3, 3.0)
    g, gf = gaussian_field(C=D, H=1, W=m, seed=2, ell=1.0, var=var, batch=DRAWS)
    (y * g[:, :, 0].mT).sum().backward()
    gx, mg = rule.backward(gf).var, xr.grad[:, :, 0].pow(2).mean(0)
    return (float(pred.var.mean() / mc.var.mean()), float(gx.mean() / mg.mean()),
            float(gx[:, 0, 0].mean() / mg[:, 0].mean()))  # fmt: skip


@pytest.mark.parametrize("ell", [0.1, 0.8], ids=["independent-tokens", "correlated-tokens"])
def test_talking_heads_match_monte_carlo(ell):
    """torch's own init of the two head-mixing Linears (weights up to ±1/√heads: the heads mix as much as
    they can at init): within the issue's 10% forward and 15% backward, as the attention rule's test (at
    seed 0, torch 2.13.0: 0.98 forward, 0.975 backward; the mixes left out, the plain attention's weights,
    0.04 and 0.05)."""
    torch.manual_seed(0)
    model = _TalkingHeads().double()
    fwd, bwd, _ = _ratios(model, talking_heads_rule(model), ell)
    assert abs(fwd - 1) < 0.10 and abs(bwd - 1) < 0.15, (fwd, bwd)


@pytest.mark.parametrize("ell", [0.1, 0.8], ids=["independent-tokens", "correlated-tokens"])
def test_talking_heads_query_and_key_gradient(ell):
    """The gradient through the queries and keys alone (the values detached in the Monte Carlo, their
    gradient zero in the rule): every head's gradient reaches each head's scores through both mixes
    (P_q, P). Within 15% (at seed 0: 1.02 and 0.97; with P_q and P diagonal, each head's own only, 7.0 and
    6.0)."""
    torch.manual_seed(0)
    model = _TalkingHeads(values_detached=True).double()
    rule = talking_heads_rule(model)
    values = rule.v.backward
    rule.v.backward = lambda g: (lambda r: cr.Field(0 * r.mean, 0 * r.var, r.corr))(values(g))
    _, bwd, _ = _ratios(model, rule, ell)
    assert abs(bwd - 1) < 0.15, bwd


def test_talking_heads_without_mixing_are_attention():
    """L = W = I, no bias: the attention rule's numbers exactly."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, HEADS, batch_first=True).double()
    args = (mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias, HEADS)
    eye = torch.eye(HEADS, dtype=DT)
    _, f = gaussian_field(C=D, H=1, W=T, ell=0.8, mean=_ramp(D, 1, T, -1, 1), batch=2)
    _, g = gaussian_field(C=D, H=1, W=T, seed=2, ell=0.5, var=_ramp(D, 1, T, 0.3, 3.0), batch=2)
    a, b = cr.Attention(*args), cr.TalkingHeads(*args, eye, eye)
    for p, q in ((a.forward(f), b.forward(f)), (a.backward(g), b.backward(g))):
        for t in ("mean", "var", "corr"):
            torch.testing.assert_close(getattr(p, t), getattr(q, t), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="L and W must be"):
        cr.TalkingHeads(*args, eye[:2], eye)


@pytest.mark.parametrize("ell", [0.1, 0.8], ids=["independent-tokens", "correlated-tokens"])
def test_class_attention_matches_monte_carlo(ell):
    """A fixed class token before 16 Gaussian tokens, its query over all 17 keys: the one token out within
    10% forward, x's gradient and the class token's own within 15% (the issue's bars, as the attention
    rule's test; at seed 0, torch 2.13.0: 1.05 and 1.02 forward, 1.04 and 1.03 backward, the class
    token's 1.00 and 0.95)."""
    torch.manual_seed(0)
    model = _ClassAttn().double()
    fwd, bwd, cls = _ratios(model, class_attention_rule(model), ell, class_token=True)
    assert abs(fwd - 1) < 0.10 and abs(bwd - 1) < 0.15 and abs(cls - 1) < 0.15, (fwd, bwd, cls)


@pytest.mark.parametrize("ell", [0.1, 0.8], ids=["independent-tokens", "correlated-tokens"])
def test_cross_attention_matches_monte_carlo(ell):
    """CrossViT's cross attention (its softmax written out): the class attention's bars and numbers."""
    torch.manual_seed(0)
    model = _CrossAttention().double()
    fwd, bwd, cls = _ratios(model, cross_attention_rule(model), ell, class_token=True)
    assert abs(fwd - 1) < 0.10 and abs(bwd - 1) < 0.15 and abs(cls - 1) < 0.15, (fwd, bwd, cls)


@pytest.mark.parametrize("mixed", [False, True], ids=["attention", "talking-heads"])
def test_first_order_is_the_weights_spread_at_small_scores(mixed):
    """``first_order(t)``, what the rule scales where neighbouring keys move together, is its own K to first
    order in the heads' score spreads t (at many keys): the heads' mix (W L)² for talking heads."""
    from gatepool.analysis.probe.correlated.talking_heads import TalkingHeads

    torch.manual_seed(0)
    h, D = 4, 16
    w = torch.randn(3 * D, D, dtype=DT)
    if mixed:
        rule = TalkingHeads(w, None, torch.randn(D, D, dtype=DT), None, h, torch.randn(h, h, dtype=DT),
                            torch.randn(h, h, dtype=DT))  # fmt: skip
    else:
        rule = cr.Attention(w, None, torch.randn(D, D, dtype=DT), None, h)
    t = torch.rand(h, dtype=DT) * 1e-5
    K = rule.weights(t, 0 * t, 10**6)[1]
    torch.testing.assert_close(K, rule.first_order(t), rtol=1e-3, atol=0)
