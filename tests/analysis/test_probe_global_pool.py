"""The global average pool in closed form (:mod:`correlated.global_pool`): against Monte Carlo on a field of
known statistics, and the same numbers as the box filter of the whole map it replaces (1e-10)."""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.adaptive import AdaptiveAvgPool2dStep
from gatepool.analysis.probe.correlated.conv import box_conv
from gatepool.analysis.probe.correlated.global_pool import GlobalAvgPool

DT = torch.float64


def _field(C: int, H: int, W: int, seed: int = 0) -> tuple[cr.Field, torch.Tensor]:
    """A field x = m + s·(0.8 z + 0.6 z shifted by one row) (ρ = 0.48 at lag (±1, 0), 0 at every other
    lag; uneven variance and mean per position), and 10⁵ draws of it."""
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn((C, H, W), dtype=DT, generator=gen)
    s = 0.5 + torch.rand((C, H, W), dtype=DT, generator=gen)
    z = torch.randn((100_000, C, H + 1, W), dtype=DT, generator=gen)
    x = m + s * (0.8 * z[:, :, 1:] + 0.6 * z[:, :, :-1])
    corr = torch.zeros((C, 2 * H - 1, 2 * W - 1), dtype=DT)
    corr[:, H - 1, W - 1] = 1.0
    corr[:, H - 2, W - 1] = corr[:, H, W - 1] = 0.48
    return cr.Field(m, s * s, corr), x


def test_forward_and_backward_against_monte_carlo():
    """Var of the pooled channels within 2% of 10⁵ draws; the input gradient of a unit-noise output
    E[g²] = 1/n², its lag sums those of a constant map."""
    C, H, W = 3, 6, 5
    f, x = _field(C, H, W)
    step = AdaptiveAvgPool2dStep(nn.AdaptiveAvgPool2d(1))
    out = step.forward(f)
    y = x.mean((2, 3))  # (B, C)
    assert torch.allclose(out.mean.flatten(), y.mean(0), atol=0.01)
    assert torch.allclose(out.var.flatten(), y.var(0), rtol=0.02), (out.var.flatten(), y.var(0))
    ones = torch.ones((C, 1, 1), dtype=DT)
    g = step.backward(cr.Field(0 * ones, ones, ones.clone()))
    xs = torch.zeros((4000, C, H, W), dtype=DT, requires_grad=True)
    u = torch.randn((4000, C, 1, 1), dtype=DT, generator=torch.Generator().manual_seed(2))
    (nn.AdaptiveAvgPool2d(1)(xs) * u).sum().backward()
    want = cr.measure_field(xs.grad)
    assert torch.allclose(g.var, xs.grad.pow(2).mean(0), rtol=0.1)
    assert torch.allclose(g.lag_sums(), want.lag_sums(), rtol=0.1, atol=1e-6)
    assert float(g.corr.min()) > 0.999  # every pair of positions: one gradient


def test_the_same_numbers_as_the_box_filter():
    """Mean, variance, ρ, skewness, excess kurtosis forward, and the gradient's variance and ρ, as
    :func:`conv.box_conv` of the whole map gives them."""
    C, H, W = 4, 5, 7
    f, _ = _field(C, H, W, seed=3)
    gen = torch.Generator().manual_seed(4)
    f.skew = torch.randn((C, H, W), dtype=DT, generator=gen)
    f.kurt = torch.rand((C, H, W), dtype=DT, generator=gen)
    box, closed = box_conv(C, (H, W), (H, W), (0, 0)), GlobalAvgPool()
    a, b = box.forward(f), closed.forward(f)
    for key in ("mean", "var", "corr", "skew", "kurt"):
        assert torch.allclose(getattr(a, key), getattr(b, key), rtol=1e-10, atol=1e-14), key
    assert a.joint == b.joint == {}
    g = cr.Field(torch.zeros((C, 1, 1), dtype=DT), 0.5 + torch.rand((C, 1, 1), dtype=DT, generator=gen),
                 torch.ones((C, 1, 1), dtype=DT))  # fmt: skip
    ga, gb = box.backward(g), closed.backward(g)
    for key in ("mean", "var", "corr"):
        assert torch.allclose(getattr(ga, key), getattr(gb, key), rtol=1e-10, atol=1e-14), key
