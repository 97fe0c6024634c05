"""Some of the channels: one piece of ``x.chunk(2, dim=1)``, ``x.split(s, 1)``, ``x.tensor_split(n, 1)``
(ShuffleNetV2's channel split, a concatenation undone), or a slice ``x[:, a:b]`` (GhostNet's).

forward   channels a … b − 1, each with its own state (channels are uncorrelated in the state: nothing
          else is carried)
backward  the gradient at those channels, zero at the others (variance 0); the pieces of one split
          reach the split tensor as gradients of disjoint channels, which add (:func:`add.add_grads`)
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.channels import sliced_channels
from gatepool.analysis.probe.correlated.field import Field


class ChannelSlice:
    """``x[:, start:stop]`` of the field's channels."""

    def __init__(self, start: int, stop: int) -> None:
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop):
            raise ValueError(f"start and stop must be ints with 0 ≤ start ≤ stop, got {start!r}, {stop!r}")
        self.start, self.stop = start, stop

    def forward(self, x: Field) -> Field:
        if self.stop > x.shape[0]:
            raise ValueError(f"stop must be at most the field's {x.shape[0]} channels, got {self.stop}")
        self.channels = x.shape[0]
        a, b = self.start, self.stop
        return Field(x.mean[a:b], x.var[a:b], x.corr[a:b], **sliced_channels(x, a, b))

    def backward(self, g: Field) -> Field:
        a, b = self.start, self.stop
        if g.shape[0] != b - a:
            raise ValueError(f"g must have {b - a} channels, got {g.shape[0]}")

        def padded(t: torch.Tensor) -> torch.Tensor:
            out = torch.zeros((self.channels, *t.shape[1:]), dtype=t.dtype)
            out[a:b] = t
            return out

        corr = padded(g.corr)
        H, W = (corr.shape[1] + 1) // 2, (corr.shape[2] + 1) // 2
        corr[:, H - 1, W - 1] = 1.0  # ρ(0) = 1 (the other channels' variance is 0)
        return Field(padded(g.mean), padded(g.var), corr, None if g.yy is None else padded(g.yy))
