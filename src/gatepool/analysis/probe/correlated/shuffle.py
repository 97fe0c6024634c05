"""A channel shuffle (ShuffleNet's ``x.view(N, g, C/g, H, W).transpose(1, 2).reshape(N, C, H, W)``,
``nn.ChannelShuffle``): a permutation of the channels.

forward   output channel i·g + j is input channel j·(C/g) + i: each channel's state moves with it
backward  the inverse permutation of the gradient's channels (``Field.yy`` with them)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.registry import register_correlated_rule


class ChannelShuffle:
    """``nn.ChannelShuffle(groups)`` of the field."""

    def __init__(self, groups: int) -> None:
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ValueError(f"groups must be an int ≥ 1, got {groups!r}")
        self.groups = groups

    def forward(self, x: Field) -> Field:
        C = x.shape[0]
        if C % self.groups:
            raise ValueError(f"the field's {C} channels must divide into groups={self.groups}")
        self.perm = torch.arange(C).reshape(self.groups, C // self.groups).T.flatten()
        return Field(x.mean[self.perm], x.var[self.perm], x.corr[self.perm])

    def backward(self, g: Field) -> Field:
        inv = torch.argsort(self.perm)
        return Field(g.mean[inv], g.var[inv], g.corr[inv], None if g.yy is None else g.yy[inv])


register_correlated_rule(nn.ChannelShuffle, lambda m: ChannelShuffle(m.groups))
