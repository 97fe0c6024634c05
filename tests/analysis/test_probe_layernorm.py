"""LayerNorm over the channels at each position and stochastic depth against Monte Carlo, as the other
correlated rules (``gaussian_field``: Gaussian fields of known correlation through torch's own ops); and
the walk through ConvNeXt's channels-last round trip (permute → LayerNorm → Linear → GELU → Linear →
permute back → layer scale → stochastic depth → add)."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import DT, _ramp, assert_walk_holds, close, gaussian_field

from gatepool.analysis.probe import correlated as cr

C = 32  # LayerNorm's statistics over 32 channels: its divisor fluctuates by √(2/C) = 25%


def _channels(lo, hi):
    """A map that differs by channel (lo … hi) and along the map: a rule that mixes channels up shows."""
    return torch.linspace(lo, hi, C, dtype=DT)[:, None, None] * _ramp(C, 10, 10, 0.5, 1.5)


def test_layernorm_over_channels_matches_monte_carlo():
    x, field = gaussian_field(C=C, mean=_channels(-1.0, 1.0), var=_channels(0.5, 2.0), ell=1.5, batch=2000)
    ln = torch.nn.LayerNorm(C).double()
    with torch.no_grad():
        ln.weight.copy_(torch.linspace(0.5, 2.0, C))
        ln.bias.copy_(torch.linspace(-1.0, 1.0, C))
    rule = cr.LayerNorm(ln.weight, ln.bias, ln.eps)
    xr = x.clone().requires_grad_()
    y = ln(xr.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # channels last and back, as ConvNeXt
    close(rule.forward(field), y.detach(), rel=0.15, corr=0.02)
    g, gf = gaussian_field(C=C, var=_ramp(C, 10, 10, 0.3, 3.0), ell=1.2, seed=2, batch=2000)
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.25, corr=0.02)


def test_layernorm_pooled_variance_within_two_percent():
    """Pooled over channels and positions the forward is exact but for eps (Σ_c x̂_c² = C) and the
    backward within E[1/σ²]'s second order."""
    x, field = gaussian_field(C=C, mean=_channels(-1.0, 1.0), var=_channels(0.5, 2.0), ell=1.5, batch=2000)
    rule = cr.LayerNorm(None, None, 1e-6)
    xr = x.clone().requires_grad_()
    y = torch.nn.functional.layer_norm(xr.permute(0, 2, 3, 1), (C,), eps=1e-6).permute(0, 3, 1, 2)
    p = rule.forward(field)
    assert abs(float((p.var + p.mean**2).mean()) - float(y.detach().pow(2).mean())) < 0.01
    g, gf = gaussian_field(C=C, seed=2, batch=2000)
    (y * g).sum().backward()
    assert abs(float(rule.backward(gf).var.mean()) / float(xr.grad.pow(2).mean()) - 1) < 0.02


def test_layernorm_refuses_another_width():
    with pytest.raises(ValueError, match="weight and bias must have the field's 2 channels"):
        cr.LayerNorm(torch.ones(3), None, 1e-5).forward(gaussian_field(C=2, batch=1)[1])
    with pytest.raises(ValueError, match="eps must be"):
        cr.LayerNorm(None, None, -1.0)


@pytest.mark.parametrize("training", [True, False])
def test_stochastic_depth_matches_monte_carlo(training):
    """A sample's whole input dropped (mean map non-zero: its lags change too), train and eval."""
    x, field = gaussian_field(mean=_ramp(2, 10, 10, -1.0, 2.0), var=_ramp(2, 10, 10, 0.5, 2.0), ell=1.5)
    p = 0.3
    keep = (torch.rand(x.shape[0], 1, 1, 1, generator=torch.Generator().manual_seed(5), dtype=DT) >= p)
    mask = keep.to(DT) / (1 - p) if training else torch.ones_like(keep, dtype=DT)
    rule = cr.StochasticDepth(p, training)
    xr = x.clone().requires_grad_()
    y = xr * mask  # torchvision's stochastic_depth(x, p, "row", training), its mask drawn here
    close(rule.forward(field), y.detach(), rel=0.03, corr=0.01)
    g, gf = gaussian_field(seed=2, ell=1.2, var=_ramp(2, 10, 10, 0.3, 3.0))
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.03, corr=0.01)
    with pytest.raises(ValueError, match="p must be in"):
        cr.StochasticDepth(1.0)


class _Permute(torch.nn.Module):
    """torchvision's ``Permute`` (``ops.misc``)."""

    def __init__(self, dims) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class _ConvNeXtBlock(torch.nn.Module):
    """A stem, then ConvNeXt's block as torchvision writes it (depthwise conv, the channels-last round trip
    through LayerNorm and the two Linears around a GELU, layer scale, the residual add), the global pool,
    a LayerNorm on the pooled features and the classifier."""

    def __init__(self, C: int = 48) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, C, 2, stride=2)
        self.block = torch.nn.Sequential(
            torch.nn.Conv2d(C, C, 3, padding=1, groups=C),
            _Permute([0, 2, 3, 1]),
            torch.nn.LayerNorm(C, eps=1e-6),
            torch.nn.Linear(C, 4 * C),
            torch.nn.GELU(),
            torch.nn.Linear(4 * C, C),
            _Permute([0, 3, 1, 2]),
        )
        self.layer_scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, C)[:, None, None])
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.norm = torch.nn.LayerNorm(C)
        self.fc = torch.nn.Linear(C, 10)

    def forward(self, x):
        x = self.stem(x)
        y = self.layer_scale * self.block(x)
        y += x
        return self.fc(self.norm(torch.flatten(self.pool(y), 1)))


@pytest.mark.slow
def test_the_walk_carries_the_channels_last_round_trip():
    """Every module of :class:`_ConvNeXtBlock` predicted, forward within 10% and backward within 15% of its
    measurement (512 noise images, ∂L/∂logits ~ N(0, 1)). At seed 0 (torch 2.13.0, CPU) the ratios are
    0.98–1.00 forward and 0.97–1.05 backward; at width 16 the LayerNorm's input gradient is 1.21 (the
    two Linears' fixed weights correlate the 16 channels' gradients, which the state takes as independent)."""

    torch.manual_seed(0)
    model = _ConvNeXtBlock().double()
    x = torch.randn(512, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=DT)
    names = ["stem", "block.0", "block.2", "block.3", "block.4", "block.5", "block", "pool", "norm", "fc"]
    assert_walk_holds(model, x, names, fwd=0.10, bwd=0.15)
