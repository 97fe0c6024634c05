"""DeepSets (Zaheer et al. 2017): ``f(X) = ρ(Σᵢ φ(xᵢ))`` is invariant to the order of the set, since a sum
does not see the order. Baseline: an MLP on the flattened set, which does.

Test: ``Permutations(n)`` moves the set along its element axis (``Permuted(1)``), the output does not move
(``Invariant()``). Run ``python -m gatepool.analysis.symmetry.examples.deepsets`` for the report.
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import Invariant, Permutations, Permuted, SymmetryReport, check_symmetry


class DeepSets(nn.Module):
    def __init__(self, d_in: int = 3, width: int = 32, d_out: int = 2) -> None:
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width))
        self.rho = nn.Sequential(nn.ReLU(), nn.Linear(width, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, d_in)
        return self.rho(self.phi(x).sum(dim=1))  # (B, d_out)


class FlatMLP(nn.Module):
    """The baseline: every element has its own weights."""

    def __init__(self, n: int, d_in: int = 3, width: int = 32, d_out: int = 2) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n * d_in, width), nn.ReLU(), nn.Linear(width, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, d_in)
        return self.net(x.flatten(1))  # (B, d_out)


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    n = 8
    x = torch.randn(4, n, 3)  # 4 sets of 8 points in 3-D
    test = dict(group=Permutations(n), in_rules=Permuted(1), out_rules=Invariant(), seed=seed)
    return ([check_symmetry(DeepSets(), x, **test)],
            [check_symmetry(FlatMLP(n), x, **test, name="MLP on the flattened set")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
