"""The rules that unblock timm's families where the correlated walk stopped, against Monte Carlo on
Gaussian fields of known correlation: a stride-1 avg pool without ``count_include_pad`` and
``pool(x) − x`` as a stencil with border-dependent weights (EfficientFormer's token mixer on a 56 × 56
map, too large for a dense matrix of the positions)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import DT, assert_walk_holds
from test_probe_zoo_rules import _map_against_monte_carlo

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.adaptive import avg_windows


def _pool(H, k, p, include, minus):
    A = [avg_windows(H, k, 1, p, False, include)] * 2
    return cr.pool_stencil(2, *A, (k, k), (p, p), minus_identity=minus)


@pytest.mark.parametrize("k, p, include, minus", [(3, 1, False, False), (3, 1, False, True),
                                                  (3, 1, True, True), (5, 1, False, False)])  # fmt: skip
def test_a_stride_one_pool_as_a_stencil_matches_monte_carlo(k, p, include, minus):
    """``avg_pool2d(x, k, 1, p, count_include_pad=...)`` and ``pool(x) − x``: mean, variance map and
    correlation forward, the gradient's backward (the border windows divided by their own taps)."""

    def fn(x):
        y = F.avg_pool2d(x, k, 1, p, count_include_pad=include)
        return y - x if minus else y

    _map_against_monte_carlo(_pool(9, k, p, include, minus), fn, 9)


class _TokenMixer(nn.Module):
    """EfficientFormer's and PoolFormer's token mixer ``pool(x) − x`` after a conv, then a pool and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.pool2 = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        x = self.conv(x)
        x = self.pool(x) - x
        return self.head(self.pool2(x).mean((2, 3)))


def test_the_walk_takes_a_stride_one_pool_and_its_difference_as_stencils():
    """The walk through the module and ``pool(x) − x`` against the measurement on 16 × 16 maps. The
    stencil is exact (above); the state after it keeps one stationary correlation per channel, which the
    border windows' own weights break: on 8 × 8 maps (most positions at the border) pool2's variance is
    12% high."""
    torch.manual_seed(0)
    model = _TokenMixer().double()
    x = torch.randn(1024, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=DT)
    assert_walk_holds(model, x, ["conv", "pool", "pool2", "head"])
