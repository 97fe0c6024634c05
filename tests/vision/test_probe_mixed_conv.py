"""timm's ``MixedConv2d`` (MixNet) as one conv (``make test-vision``): each piece's kernel zero-padded into
the largest at its padding's offset, exact against the module; and the walk through a MixNet-like block (a
mixed depthwise conv of three kernel sizes, its norm and SiLU, a squeeze-and-excitation) against the
measurement."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_timm_blocks import _walk_holds

from gatepool.analysis.probe.correlated.conv import mixed_conv_rule

pytest.importorskip("timm")


@pytest.mark.parametrize("depthwise,stride", [(True, 1), (True, 2), (False, 1)])
def test_a_mixed_conv_is_one_conv(depthwise, stride):
    """The rule's one conv (its weight, padding, stride and groups) computes what the module does."""
    from timm.layers.mixed_conv2d import MixedConv2d

    torch.manual_seed(0)
    m = MixedConv2d(12, 12, [3, 5, 7], stride=stride, depthwise=depthwise).double()
    x = torch.randn(2, 12, 9, 9, dtype=torch.float64)
    conv = mixed_conv_rule(m)
    got = F.conv2d(x, conv.weight, conv.b, conv.stride, conv.padding, 1, conv.groups)
    torch.testing.assert_close(got, m(x))


class _MixBlock(nn.Module):
    """conv 3 → 24, BN, ReLU, a mixed depthwise conv (3, 5, 7), BN, SiLU, a squeeze-and-excitation, a head."""

    def __init__(self) -> None:
        from timm.layers.mixed_conv2d import MixedConv2d

        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU())
        self.dw = MixedConv2d(24, 24, [3, 5, 7], depthwise=True)
        self.bn, self.act = nn.BatchNorm2d(24), nn.SiLU()
        self.pool, self.reduce = nn.AdaptiveAvgPool2d(1), nn.Conv2d(24, 6, 1)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        y = self.act(self.bn(self.dw(self.stem(x))))  # (B, 24, H/2, W/2)
        return self.head(self.reduce(self.pool(y)).flatten(1))  # (B, 5)


def test_the_walk_through_a_mixed_conv_block():
    """Every row within 10% forward and 15% backward (the block traced whole through the rule: its pieces'
    split and stack as before give the SiLU 0.967 of the measured here, and this block is too shallow
    for the channels' correlation to move its rows: what the rule is for is MixNet's, docs/probe.md)."""
    torch.manual_seed(0)
    net = _MixBlock().double()
    x = torch.randn(2048, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    _walk_holds(net, x, ["dw", "act", "reduce", "head"])
