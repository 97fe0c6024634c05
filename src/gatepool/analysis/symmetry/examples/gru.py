"""A GRU is roughly equivariant to a shift in time: one cell is applied at every step, so delaying the
input by s steps delays the output by s steps, except for what the state does while the delay's padding
goes in. Without biases a zero input keeps the zero state at zero, and the equivariance is exact; with
biases (``nn.GRU``'s default) the state drifts during the padding and the outputs after it carry a transient
(the error per shift is in the report: ``report.errors()``). Baseline: a GRU that also reads the time
index t/T, a clock that the delay moves.

Test: ``TimeShifts((1, 2, 4, 8))`` with ``Delayed(1)`` on the input (zeros in front) and
``Delayed(1, fill=nan)`` on the output (the first s steps are not compared).
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import Delayed, SymmetryReport, TimeShifts, check_symmetry


class Recurrent(nn.Module):
    def __init__(self, d_in: int = 3, width: int = 16, d_out: int = 2, bias: bool = False,
                 clock: bool = False) -> None:
        super().__init__()
        self.clock = clock  # the baseline: t / T as one more input feature
        self.gru = nn.GRU(d_in + clock, width, batch_first=True, bias=bias)
        self.readout = nn.Linear(width, d_out)  # the same at every step

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, d_in)
        if self.clock:
            t = torch.linspace(0, 1, x.shape[1]).to(x)
            x = torch.cat([x, t[None, :, None].expand(len(x), -1, 1)], -1)
        return self.readout(self.gru(x)[0])  # (B, T, d_out)


def shift_test(model: nn.Module, x: torch.Tensor, name: str, seed: int = 0) -> SymmetryReport:
    return check_symmetry(model, x, TimeShifts((1, 2, 4, 8)), Delayed(1), Delayed(1, fill=float("nan")),
                          seed=seed, name=name)


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    x = torch.randn(4, 20, 3)
    return ([shift_test(Recurrent(), x, "GRU without biases", seed)],
            [shift_test(Recurrent(clock=True), x, "GRU reading the time index", seed)])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
    torch.manual_seed(0)
    roughly = shift_test(Recurrent(bias=True), torch.randn(4, 20, 3), "GRU with biases")
    print(roughly, "\n  error by shift (float64):", roughly.errors("float64"))
