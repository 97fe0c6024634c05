"""The learned parts of a gate: one definition for the windowed, global and adaptive pools.

    gate            parameters                       start value
    "soft-learned"  log τ          (C,)              log(temperature):  τ_c = exp(log τ_c) > 0
    "attention"     score w        (1, C, 1…)        N(0, 1/C):         Var(s) = Var(x)
                    value V        (C, C, 1…)        the identity:      soft pooling of a random score
    "conv"          mixing         (C, 1, *kernel)   1/K:               average pooling

The attention gate scores each position, ``s_j = x_j · w``, and mixes the values ``V x_j``. Its gates
sum to 1 over every window (a padded tap has gate 0), so the projection commutes with the pool:

    Σ_j g_j · (V x_j) = V · (Σ_j g_j x_j)

and :meth:`GateParameters.project` runs the C×C projection on the pooled map (stride² times fewer
positions than the input), forward and backward, exactly up to rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers import gate_table
from gatepool.layers.windows import check_temperature, project
from gatepool.utils.checks import check_int

__all__ = ["GATES_WITH_TEMPERATURE", "GATES_WITH_WEIGHTS", "GateParameters"]

GATES_WITH_WEIGHTS = gate_table.names(weights=True)  # ("soft-learned", "attention", "conv")
GATES_WITH_TEMPERATURE = gate_table.names(temperature=True)  # ("soft", "soft-learned", "attention")
_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_CONV_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class GateParameters(nn.Module):
    """Base of the gated pools: ``gate``, ``channels``, τ and the gate's parameters, by the table above."""

    dim: int = 2

    def init_gate(
        self, gate: str, channels: int | None, temperature: float, kernel_size: tuple[int, ...] = ()
    ) -> None:
        """Check ``channels`` and ``temperature`` for ``gate``, then make its parameters."""
        row = gate_table.row(gate)
        check_int(channels, "channels", optional=True)  # None: the gates without weights need none
        if row.weights and channels is None:
            raise ValueError(f"gate={gate!r} has weights: pass channels=C (an int ≥ 1)")
        check_temperature(temperature)
        if not row.temperature and temperature != 1.0:
            raise ValueError(
                f"temperature applies to the gates {list(gate_table.names(temperature=True))} only; "
                f"gate={gate!r} has no temperature: it needs temperature=1.0, got {temperature}"
            )
        d = self.dim
        self.gate = gate
        self.channels = channels
        self.fixed_temperature = float(temperature)
        if row.learned_temperature:
            self.log_temperature = nn.Parameter(torch.full((channels,), math.log(temperature)))  # log τ_c
        elif row.scored:
            self.score = _CONV[d](channels, 1, 1, bias=False)  # s_j = x_j · w
            self.value = _CONV[d](channels, channels, 1, bias=False)  # v_j = V x_j
            nn.init.normal_(self.score.weight, 0.0, channels**-0.5)  # w ~ N(0, 1/C): Var(s) = Var(x)
            with torch.no_grad():
                self.value.weight.copy_(torch.eye(channels).view(channels, channels, *([1] * d)))  # V = I
        elif row.positional:
            k = math.prod(kernel_size)
            self.mixing = nn.Parameter(torch.full((channels, 1, *kernel_size), 1.0 / k))  # avg at init

    @property
    def temperature(self) -> torch.Tensor | float:
        """τ: the per-channel tensor ``exp(log τ)`` of shape (C,) for "soft-learned", else the float."""
        if gate_table.row(self.gate).learned_temperature:
            return self.log_temperature.exp()
        return self.fixed_temperature

    def gate_repr(self) -> str:
        """``", channels=C"`` and a τ other than 1 of the fixed-τ gates, for ``extra_repr``."""
        s = f", channels={self.channels}" if self.channels is not None else ""
        row = gate_table.row(self.gate)
        if row.temperature and not row.learned_temperature and self.fixed_temperature != 1.0:
            s += f", temperature={self.fixed_temperature}"
        return s

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The attention gate's scores ``s_j = x_j · w``: ``(N, C, *spatial) -> (N, 1, *spatial)``."""
        return _CONV_FN[self.dim](x, self.score.weight.to(x.dtype))

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """The attention gate's values after the pool: ``V · (Σ_j g_j x_j)``, ``(N, C, *out)`` either side."""
        return project(pooled, self.value.weight)
