"""Concatenation along channels (``torch.cat(xs, dim=1)``: DenseNet, Inception, ShuffleNet).

forward   the fields' channels stacked: each channel keeps its mean map, variance map and correlation
          (channels are uncorrelated in the state, so nothing is added between them); where one of
          them carries its law (``Field.law``: a max pool's output), the cat carries the laws of all,
          the others' as normals of their moments (:func:`law.normal_law`), and the max pools' joint
          laws of neighbouring positions (``Field.copula``: :func:`copula.stacked`)
backward  ∂L/∂x_i = g[channels of x_i]: the output gradient's channels split back in the same order
          (``Field.yy``, per channel, split with them; ``pre_relu``, the gradient at the ReLUs' inputs
          where every x_i is a ReLU's output and the step after knew it, a max pool: split the same)
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gatepool.analysis.probe.correlated.channels import made_channels, stacked_made
from gatepool.analysis.probe.correlated.copula import stacked
from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.law import ATOMS, levels, normal_law, rebin
from gatepool.analysis.probe.correlated.normal import Law


def _on_bins(x: Field) -> Law:
    """``x``'s law as :data:`law.ATOMS` atoms on the bins of :func:`law.levels` (a normal's where it has
    none): one atom count for the channels of every input."""
    if x.law is None:
        return normal_law(x.mean, x.var)
    mass = levels(ATOMS).diff().to(x.law.w.dtype)
    if x.law.x.shape[-1] == ATOMS and torch.allclose(x.law.w, mass.expand_as(x.law.w), rtol=0, atol=1e-12):
        return x.law
    return rebin(x.law.x, x.law.w, ATOMS)


class Cat:
    """``torch.cat`` of fields along channels; :meth:`backward` gives each input its slice of the gradient."""

    def forward(self, xs: list[Field]) -> Field:
        if not xs:
            raise ValueError("xs must hold at least one field, got none")
        hw = {x.shape[1:] for x in xs}
        if len(hw) != 1:
            raise ValueError(f"xs must share one map size (H, W), got {sorted(hw)}")
        self.sizes = [x.shape[0] for x in xs]
        out = Field(*(torch.cat([getattr(x, k) for x in xs]) for k in ("mean", "var", "corr")))
        if any(x.law is not None for x in xs):
            laws = [_on_bins(x) for x in xs]
            out.law = Law(torch.cat([a.x for a in laws]), torch.cat([a.w for a in laws]))
            out.copula = stacked([x.copula for x in xs], self.sizes)
        made = stacked_made(xs)  # branches of one source: their channels' cross-blocks
        if made is not None:
            out.chan, out.chan_dc = made_channels(made, out)
            out.made = replace(made, var=out.var)
        return out

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
