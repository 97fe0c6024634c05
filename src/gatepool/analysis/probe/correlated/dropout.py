"""Dropout of the Gaussian field: y = x · b / q, b ~ Bernoulli(q) independent per element, q = 1 − p.

forward   E[y] = E[x]; E[y²] = E[x²] / q at each position; Cov(y_p, y_q) = Cov(x_p, x_q) for p ≠ q
          (two independent masks: E[b_p b_q] / q² = 1), so only the variance map changes
backward  ∂L/∂x = g · b / q with the forward's mask: E[(∂L/∂x)²] = E[g²] / q, the lags as they are; for a
          norm before it (``Field.yy``) g_x x = g y, so the sum is the output's own
eval      the identity
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.field import Field, _field_from_sums
from gatepool.analysis.probe.correlated.registry import register_correlated_rule


class Dropout:
    """Dropout with drop probability ``p`` (``training=False``: the identity)."""

    def __init__(self, p: float, training: bool = True) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p must be in [0, 1), got {p}")
        self.keep, self.training = 1.0 - p, training

    def forward(self, x: Field) -> Field:
        if not self.training:
            return x
        e2 = (x.var + x.mean * x.mean) / self.keep
        return _field_from_sums(x.mean, e2 - x.mean * x.mean, x.lag_sums())

    def backward(self, g: Field) -> Field:
        if not self.training:
            return g
        return _field_from_sums(torch.zeros_like(g.var), g.var / self.keep, g.lag_sums(), g.yy)


register_correlated_rule(nn.Dropout, lambda m: Dropout(m.p, m.training))
