"""ResNeSt's split attention (timm's ``SplitAttn``) whole, against Monte Carlo on a Gaussian field of known
correlation: the gated sum a X₀ + (1 − a) X₁ of a conv's two halves, its gate from their pooled sum."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import _ramp, gaussian_field

from gatepool.analysis.probe import correlated as cr


class _RadixSoftmax(nn.Module):
    """timm's ``RadixSoftmax``: a softmax over the radix of each (cardinality, channel) logit."""

    def __init__(self, radix: int, cardinality: int) -> None:
        super().__init__()
        self.radix, self.cardinality = radix, cardinality

    def forward(self, x):
        B = x.size(0)
        if self.radix > 1:
            x = F.softmax(x.view(B, self.cardinality, self.radix, -1).transpose(1, 2), dim=1)
            return x.reshape(B, -1)
        return torch.sigmoid(x)


class _SplitAttn(nn.Module):
    """timm 1.0's ``SplitAttn`` forward, its attributes as timm's (the rule reads them)."""

    def __init__(self, cin: int, cout: int, radix: int = 2, groups: int = 1, attn: int = 8) -> None:
        super().__init__()
        self.radix = radix
        self.conv = nn.Conv2d(cin, cout * radix, 3, padding=1, groups=groups * radix, bias=False)
        self.bn0, self.drop, self.act0 = nn.BatchNorm2d(cout * radix), nn.Identity(), nn.ReLU()
        self.fc1 = nn.Conv2d(cout, attn, 1, groups=groups)
        self.bn1, self.act1 = nn.BatchNorm2d(attn), nn.ReLU()
        self.fc2 = nn.Conv2d(attn, cout * radix, 1, groups=groups)
        self.rsoftmax = _RadixSoftmax(radix, groups)

    def forward(self, x):
        x = self.act0(self.drop(self.bn0(self.conv(x))))  # (B, R·C, H, W)
        B, RC, H, W = x.shape
        if self.radix > 1:
            x = x.reshape((B, self.radix, RC // self.radix, H, W))
            x_gap = x.sum(dim=1)
        else:
            x_gap = x
        x_gap = self.act1(self.bn1(self.fc1(x_gap.mean((2, 3), keepdim=True))))
        x_attn = self.rsoftmax(self.fc2(x_gap)).view(B, -1, 1, 1)
        if self.radix > 1:
            return (x * x_attn.reshape((B, self.radix, RC // self.radix, 1, 1))).sum(dim=1)
        return x * x_attn


def _close(pred: cr.Field, draws: torch.Tensor, rel: float = 0.03, corr: float = 0.02) -> None:
    """Pooled over channels and positions: the mean (of the rms) and the variance within ``rel``, the
    correlation at lags 1 and 2 within ``corr``. (Channel by channel the gate's moments are off by the
    correlation of fc1's outputs, ±0.03 in E[a]: the state's channels are uncorrelated.)"""
    mc = cr.measure_field(draws.detach())
    scale = float((mc.var + mc.mean**2).mean()) ** 0.5  # a gradient's mean is 0: within rel of its rms
    assert abs(float(pred.mean.mean() - mc.mean.mean())) <= rel * scale
    ratio = float(pred.var.mean() / mc.var.mean())
    assert abs(ratio - 1) <= rel, ratio
    for lag in (1, 2):
        p, m = cr.neighbour_corr(pred, lag), cr.neighbour_corr(mc, lag)
        assert abs(p - m) <= corr, (lag, p, m)


@pytest.mark.parametrize("radix, groups", [(2, 1), (2, 2), (1, 1)])
def test_split_attention_matches_monte_carlo(radix, groups):
    """Forward (mean and variance maps, correlation) and the gradient at the input; the norm's β spread
    (the halves' means apart) and fc2 scaled up (the gate's spread), so that the Var(a) (m₀ − m₁)² term
    of the gated sum matters. ResNeSt-14d's widths (64 channels in, 2 × 64 out, fc1 to 32): with 8
    inputs the pooled map's channels are nearly 8 functions of 8 means, fc1's outputs correlated 0.22
    (0.12 here), which the state's channels are not."""
    torch.manual_seed(0)
    H, B, C = 6, 3000, 64
    m = _SplitAttn(C, C, radix, groups, attn=32).double()
    with torch.no_grad():
        m.bn0.bias.normal_(0.0, 0.8)
        m.fc2.weight.mul_(3.0)
    mean, var = _ramp(C, H, H, -0.4, 0.6), _ramp(C, H, H, 0.6, 1.6)
    x, f = gaussian_field(C=C, H=H, W=H, mean=mean, var=var, ell=1.2, batch=B)
    rule = cr.SplitAttn(m)
    for part in rule.steps:
        if isinstance(part, cr.BatchNorm):
            part.batch = B
    xr = x.clone().requires_grad_(True)
    y = m(xr)
    _close(rule.forward(f), y)
    g, gf = gaussian_field(C=C, H=H, W=H, var=_ramp(C, H, H, 0.5, 2.0), seed=3, ell=1.0, batch=B)
    (y * g).sum().backward()
    _close(rule.backward(gf), xr.grad)


def test_a_radix_above_two_has_no_rule():
    with pytest.raises(NotImplementedError, match="radix 4"):
        cr.SplitAttn(_SplitAttn(8, 8, radix=4))
