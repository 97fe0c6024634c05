"""Cross-covariance attention (XCiT's ``XCA``, EdgeNeXt's ``CrossCovarianceAttn``: softmax over a head's
channels of the tokens' cosines between q and k channels) against Monte Carlo on Gaussian tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import _ramp, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.cross_covariance import channel_attention_rule


class _XCA(nn.Module):
    """timm's ``XCA`` in plain torch (its non-fused path)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.temperature = nn.Parameter(torch.ones(heads, 1, 1))

    def forward(self, x):  # (B, T, C)
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 4, 1).unbind(0)
        a = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) * self.temperature
        return self.proj((a.softmax(-1) @ v).permute(0, 3, 1, 2).reshape(B, N, C))


def _ratios(ell: float, edge: float, C: int = 32, heads: int = 2, T: int = 16) -> tuple[float, float, float]:
    """(forward, backward, mean): the rule's pooled variance over Monte Carlo's for T Gaussian tokens (their
    mean a ramp from −edge to edge), x's E[g²] from a correlated Gaussian ∂L/∂y over Monte Carlo's, and
    the mean's mean absolute error in units of the output's standard deviation."""
    torch.manual_seed(0)
    m = _XCA(C, heads).double()
    x, f = gaussian_field(C=C, H=1, W=T, ell=ell, mean=_ramp(C, 1, T, -edge, edge), batch=4000)
    rule = cr.CrossCovarianceAttention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, m.temperature)
    xr = x.clone().requires_grad_()
    y = m(xr[:, :, 0].mT)
    pred, mc = rule.forward(f), cr.measure_field(y.detach().mT[:, :, None])
    g, gf = gaussian_field(C=C, H=1, W=T, seed=2, ell=1.0, var=_ramp(C, 1, T, 0.3, 3.0), batch=4000)
    (y * g[:, :, 0].mT).sum().backward()
    fwd = float(pred.var.mean()) / float(mc.var.mean())
    bwd = float(rule.backward(gf).var.mean()) / float(xr.grad.pow(2).mean())
    return fwd, bwd, float((pred.mean - mc.mean).abs().mean() / mc.var.mean().sqrt())


@pytest.mark.parametrize(
    "ell, edge",
    [(0.8, 0.5), (0.1, 0.5), (0.8, 2.0)],
    ids=["correlated-tokens", "independent-tokens", "large-mean"],
)
def test_cross_covariance_attention_matches_monte_carlo(ell, edge):
    """16 tokens, 32 channels in 2 heads, 4000 draws (at seed 0, torch 2.13.0: forward 1.03, 1.01, 1.08;
    backward 1.00, 1.00, 1.03; the mean within 0.015 of the output's standard deviation). Broken: the
    weights at their mean alone (κ = 0) 0.91 forward and backward; without the queries' and keys'
    gradients 0.82, 0.89, 0.81 backward; uniform weights 1/d a mean 0.048 and 0.17 off, 0.93 forward at
    the large mean."""
    fwd, bwd, mean = _ratios(ell, edge)
    assert abs(fwd - 1) < 0.10 and abs(bwd - 1) < 0.06 and mean < 0.03, (fwd, bwd, mean)
    if ell == 0.8 and edge == 0.5:
        assert abs(fwd - 1) < 0.05, fwd


class _ChannelAttention(nn.Module):
    """timm's DaViT ``ChannelAttention`` in plain torch: softmax over a head's channels of k_a · v_b/√d,
    the queries' channels mixed."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):  # (B, T, C)
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        a = ((k * self.scale).transpose(-1, -2) @ v).softmax(-1)
        return self.proj((a @ q.transpose(-1, -2)).transpose(-1, -2).transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize("ell", [0.8, 0.1], ids=["correlated-tokens", "independent-tokens"])
def test_davit_channel_attention_matches_monte_carlo(ell):
    """DaViT's channel attention (no norms; its k, v, q in the XCA's q, k, v roles): 16 tokens of a mean ramp
    ±0.5, 32 channels in 2 heads, torch's Linear init, 4000 draws (at seed 0, torch 2.13.0: forward 1.02,
    1.01; backward 0.95, 0.99; the mean within 0.016). Broken, it fails: qkv read in XCA's order 0.84,
    0.82 forward, the mean 0.17 off; the norms kept 0.78, 0.88 forward, 0.55, 0.72 backward; uniform
    weights 0.78, 0.88 and 0.55, 0.71. A mean ramp of ±2 (scores of mean up to ±2: weights up to 0.63,
    their fluctuation's variance past their mean's square) is beyond the first-order fluctuation: 3.59
    forward, 2.00 backward."""
    edge = 0.5
    torch.manual_seed(0)
    m = _ChannelAttention(32, 2).double()
    x, f = gaussian_field(C=32, H=1, W=16, ell=ell, mean=_ramp(32, 1, 16, -edge, edge), batch=4000)
    rule = channel_attention_rule(m)
    xr = x.clone().requires_grad_()
    y = m(xr[:, :, 0].mT)
    pred, mc = rule.forward(f), cr.measure_field(y.detach().mT[:, :, None])
    g, gf = gaussian_field(C=32, H=1, W=16, seed=2, ell=1.0, var=_ramp(32, 1, 16, 0.3, 3.0), batch=4000)
    (y * g[:, :, 0].mT).sum().backward()
    fwd = float(pred.var.mean()) / float(mc.var.mean())
    bwd = float(rule.backward(gf).var.mean()) / float(xr.grad.pow(2).mean())
    mean = float((pred.mean - mc.mean).abs().mean() / mc.var.mean().sqrt())
    assert abs(fwd - 1) < 0.10 and abs(bwd - 1) < 0.06 and mean < 0.03, (fwd, bwd, mean)
