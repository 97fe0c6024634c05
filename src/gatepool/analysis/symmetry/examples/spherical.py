"""Spherical CNN: a convolution on the sphere whose filter depends only on the angle between two points,
``f'(p) = Σ_q k(p·q) f(q) / N``, is equivariant to every 3-D rotation (``Rp · Rq = p · q``), and a mean
over the sphere is then invariant (an isotropic filter, as DeepSphere's; Cohen et al.'s S²-CNN lifts to
SO(3) instead). On a grid closed under the cube's 24 rotations (``octahedral_grid()``) these rotations
permute the samples, and the test is exact. Baseline: an MLP per point that also reads the point's
coordinates, which tie each feature to a place.

Test: ``Octahedral()`` with ``SphereSignal(points)`` on the signal (B, C, N); the class scores
``Invariant()``, the last feature map ``SphereSignal(points)``.
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import (
    Invariant,
    Octahedral,
    SphereSignal,
    SymmetryReport,
    check_symmetry,
    octahedral_grid,
)


class SphereConv(nn.Module):
    def __init__(self, points: torch.Tensor, c_in: int, c_out: int, hidden: int = 16) -> None:
        super().__init__()
        self.register_buffer("cos", (points @ points.T).float())  # (N, N): p_i · p_j
        self.k = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, c_out * c_in))
        self.c_in, self.c_out = c_in, c_out

    def forward(self, f: torch.Tensor) -> torch.Tensor:  # (B, C_in, N)
        n = self.cos.shape[0]
        kernel = self.k(self.cos[..., None]).view(n, n, self.c_out, self.c_in)  # k(p_i · p_j)
        return torch.einsum("ijoc,bcj->boi", kernel, f) / n  # (B, C_out, N)


class SphericalCNN(nn.Module):
    def __init__(self, points: torch.Tensor, c_in: int = 1, width: int = 8, n_classes: int = 3) -> None:
        super().__init__()
        self.conv1, self.conv2 = SphereConv(points, c_in, width), SphereConv(points, width, width)
        self.head = nn.Linear(width, n_classes)

    def forward(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.conv2(torch.relu(self.conv1(f)))  # (B, width, N)
        return self.head(torch.relu(h).mean(-1)), h


class PointMLP(nn.Module):
    """The baseline: h(p) = MLP(f(p), p), then the same mean and head."""

    def __init__(self, points: torch.Tensor, c_in: int = 1, width: int = 8, n_classes: int = 3) -> None:
        super().__init__()
        self.register_buffer("points", points.float())
        self.mlp = nn.Sequential(nn.Linear(c_in + 3, width), nn.Tanh(), nn.Linear(width, width))
        self.head = nn.Linear(width, n_classes)

    def forward(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (B, C_in, N)
        where = self.points.T.to(f).expand(len(f), -1, -1)  # (B, 3, N)
        h = self.mlp(torch.cat([f, where], 1).transpose(1, 2)).transpose(1, 2)  # (B, width, N)
        return self.head(torch.relu(h).mean(-1)), h


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    points = octahedral_grid()  # 74 points
    f = torch.randn(2, 1, len(points))
    test = dict(group=Octahedral(), in_rules=SphereSignal(points),
                out_rules=(Invariant(), SphereSignal(points)), seed=seed, parts=("scores", "feature map"))
    return ([check_symmetry(SphericalCNN(points), f, **test)],
            [check_symmetry(PointMLP(points), f, **test, name="MLP reading the coordinates")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
