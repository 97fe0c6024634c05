"""Shifts in time: the symmetry a recurrent net has roughly.

An RNN applies one cell at every step, so delaying its input by s steps delays its output by s steps,
except for what the state does while the delay's padding goes in: with ``h₀ = 0``, a zero input and no
biases the state stays 0 and the equivariance is exact; with biases it holds only after a transient. So the
tester reports the error for each shift in a set (:class:`TimeShifts`) and one reads it as a function of
the shift. :class:`Delayed` is the rule: ``x'_t = x_{t−s}`` for t ≥ s, ``fill`` before. On an output, give
``fill=float("nan")``: the tester does not compare entries its expectation marks NaN, so the first s
outputs (the net's answer to the padding, which f(x) has no counterpart of) are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .group import Group, expect_element


@dataclass(frozen=True)
class Shift:
    """A delay by ``steps`` steps."""

    steps: int

    def __repr__(self) -> str:
        return f"shift {self.steps}"


class TimeShifts(Group):
    """The delays to try, each once (the tester reports one row per shift: the error as a function of
    the shift). A delay is not invertible on a finite sequence, so this is a set, not a group."""

    def __init__(self, shifts: Sequence[int] = (1, 2, 4, 8)) -> None:
        shifts = tuple(shifts)
        if not shifts or not all(isinstance(s, int) and s >= 1 for s in shifts):
            raise ValueError(f"shifts must be ints >= 1, got {shifts!r}")
        self.shifts = shifts

    def elements(self) -> list:
        return [Shift(0), *(Shift(s) for s in self.shifts)]

    def __repr__(self) -> str:
        return f"TimeShifts({self.shifts})"


class Delayed:
    """Delay along ``dim`` (the time axis): ``x'_t = x_{t−s}`` for t ≥ s and ``fill`` for t < s; the length
    stays. ``fill=float("nan")`` on an output leaves the first s steps out of the comparison."""

    def __init__(self, dim: int = 1, fill: float = 0.0) -> None:
        self.dim, self.fill = dim, fill

    def __call__(self, g: Shift, x: torch.Tensor) -> torch.Tensor:
        expect_element(self, g, Shift, "TimeShifts")
        n = x.shape[self.dim]
        if g.steps >= n:
            raise ValueError(f"shift {g.steps} must be shorter than the sequence ({n} steps along "
                             f"dim {self.dim})")
        pad_shape = list(x.shape)
        pad_shape[self.dim] = g.steps
        pad = torch.full(pad_shape, self.fill, dtype=x.dtype, device=x.device)
        return torch.cat([pad, x.narrow(self.dim, 0, n - g.steps)], dim=self.dim)

    def __repr__(self) -> str:
        return f"Delayed(dim={self.dim}, fill={self.fill})"
