"""Concatenation along channels (``torch.cat(xs, dim=1)``: DenseNet, Inception, ShuffleNet).

forward   the fields' channels stacked: each channel keeps its mean map, variance map and correlation
          (channels are uncorrelated in the state, so nothing is added between them)
backward  ∂L/∂x_i = g[channels of x_i]: the output gradient's channels split back in the same order
          (``Field.yy``, per channel, split with them; ``pre_relu``, the gradient at the ReLUs' inputs
          where every x_i is a ReLU's output and the step after knew it, a max pool: split the same)
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import Field


class Cat:
    """``torch.cat`` of fields along channels; :meth:`backward` gives each input its slice of the gradient."""

    def forward(self, xs: list[Field]) -> Field:
        if not xs:
            raise ValueError("xs must hold at least one field, got none")
        hw = {x.shape[1:] for x in xs}
        if len(hw) != 1:
            raise ValueError(f"xs must share one map size (H, W), got {sorted(hw)}")
        self.sizes = [x.shape[0] for x in xs]
        return Field(*(torch.cat([getattr(x, k) for x in xs]) for k in ("mean", "var", "corr")))

    def backward(self, g: Field) -> list[Field]:
        """One gradient field per input, in the inputs' order."""
        if g.shape[0] != sum(self.sizes):
            raise ValueError(
                f"g must have {sum(self.sizes)} channels (the inputs' {self.sizes}), got {g.shape[0]}"
            )
        parts = [t.split(self.sizes) for t in (g.mean, g.var, g.corr)]
        yys = g.yy.split(self.sizes) if g.yy is not None else [None] * len(self.sizes)
        pres = self.backward(g.pre_relu) if g.pre_relu is not None else [None] * len(self.sizes)
        return [Field(m, v, c, yy, pre_relu=pre) for m, v, c, yy, pre in zip(*parts, yys, pres)]
