"""PointNet (Qi et al. 2017): one MLP shared by every point, then a max over the points, is invariant to
the order in which the points are listed. Baseline: an MLP on the flattened coordinates.

Test: ``Permutations(n)`` on the point axis (``Permuted(1)``), the class scores ``Invariant()``. PointNet
is not rotation-invariant (its MLP reads raw coordinates): ``E3()`` with ``Positions()`` fails it, as
EGNN's baseline shows.
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import Invariant, Permutations, Permuted, SymmetryReport, check_symmetry


class PointNet(nn.Module):
    def __init__(self, width: int = 32, n_classes: int = 4) -> None:
        super().__init__()
        self.point_mlp = nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, n_classes))

    def forward(self, points: torch.Tensor) -> torch.Tensor:  # (B, N, 3)
        features = self.point_mlp(points)  # (B, N, width): the same MLP for every point
        return self.head(features.max(dim=1).values)  # (B, n_classes)


class FlatMLP(nn.Module):
    """The baseline: weights per point slot."""

    def __init__(self, n: int, width: int = 32, n_classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3 * n, width), nn.ReLU(), nn.Linear(width, n_classes))

    def forward(self, points: torch.Tensor) -> torch.Tensor:  # (B, N, 3)
        return self.net(points.flatten(1))


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    n = 16
    points = torch.randn(4, n, 3)
    test = dict(group=Permutations(n), in_rules=Permuted(1), out_rules=Invariant(), seed=seed)
    return ([check_symmetry(PointNet(), points, **test)],
            [check_symmetry(FlatMLP(n), points, **test, name="MLP on the flattened coordinates")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
