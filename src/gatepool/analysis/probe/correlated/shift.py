"""A sum with a constant: y = x + c, c fixed and broadcast to the field's (C, H, W) (a position
embedding, a bias added as a tensor).

forward   E[y] = E[x] + c; the variance and the correlation as they are
backward  ∂L/∂x = g
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field


class Shift:
    """y = x + c with c a number or a tensor that broadcasts to the field's (C, H, W)."""

    def __init__(self, c: float | torch.Tensor) -> None:
        c = torch.as_tensor(c).detach().to("cpu", _DT)
        if not bool(torch.isfinite(c).all()):
            raise ValueError("c must be finite")
        self.c = c

    def forward(self, x: Field) -> Field:
        try:
            mean = x.mean + self.c
        except RuntimeError:
            mean = None
        if mean is None or mean.shape != x.mean.shape:
            raise ValueError(f"c must broadcast to the field's shape {x.shape}, got {tuple(self.c.shape)}")
        return Field(mean, x.var, x.corr)

    def backward(self, g: Field) -> Field:
        return g
