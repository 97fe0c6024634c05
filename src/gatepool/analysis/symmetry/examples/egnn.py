"""EGNN (Satorras et al. 2021): messages read only invariants (features and squared distances), and
positions move along differences of positions,

    m_ij = φ_e(h_i, h_j, |x_i − x_j|²),   x_i' = x_i + Σ_j (x_i − x_j) φ_x(m_ij) / (N − 1),
    h_i' = φ_h(h_i, Σ_j m_ij),

so h' is invariant and x' equivariant to rotations, reflections and translations, and both to
relabeling the nodes. Baseline: the same layer with its edge MLP reading the raw coordinates x_i, x_j
instead of the distance (still permutation-equivariant, no longer E(3)).

Test: ``E3()`` (Haar rotations, every second one reflected, Gaussian translations): features
``Invariant()``, positions ``Positions()``, in and out; and ``Permutations(n)`` with ``Permuted(1)``.
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import (
    E3,
    Invariant,
    Permutations,
    Permuted,
    Positions,
    SymmetryReport,
    check_symmetry,
)


class EGCL(nn.Module):
    def __init__(self, width: int, raw_coordinates: bool = False) -> None:
        super().__init__()
        self.raw = raw_coordinates  # the baseline
        edge_in = 2 * width + (6 if raw_coordinates else 1)
        self.phi_e = nn.Sequential(nn.Linear(edge_in, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU())
        self.phi_x = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, 1))
        self.phi_h = nn.Sequential(nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = h.shape[1]  # h (B, N, width), x (B, N, 3)
        diff = x[:, :, None] - x[:, None, :]  # (B, N, N, 3): x_i − x_j
        geometry = (torch.cat([x[:, :, None].expand_as(diff), x[:, None].expand_as(diff)], -1) if self.raw
                    else (diff**2).sum(-1, keepdim=True))
        h_i, h_j = h[:, :, None].expand(-1, -1, n, -1), h[:, None].expand(-1, n, -1, -1)
        pairs = torch.cat([h_i, h_j, geometry], -1)
        m = self.phi_e(pairs)  # (B, N, N, width)
        x = x + (diff * self.phi_x(m)).sum(2) / (n - 1)
        h = h + self.phi_h(torch.cat([h, m.sum(2)], -1))
        return h, x


class EGNN(nn.Module):
    def __init__(self, d_in: int = 4, width: int = 16, depth: int = 2, raw_coordinates: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.layers = nn.ModuleList([EGCL(width, raw_coordinates) for _ in range(depth)])

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(h)
        for layer in self.layers:
            h, x = layer(h, x)
        return h, x  # (B, N, width) invariant, (B, N, 3) equivariant


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    n = 6
    h, x = torch.randn(2, n, 4), torch.randn(2, n, 3)
    both = (Invariant(), Positions())  # features do not move, positions turn and move
    euclid = dict(group=E3(), in_rules=both, out_rules=both, seed=seed, parts=("h", "x"))
    nodes = (Permuted(1), Permuted(1))
    perm = dict(group=Permutations(n), in_rules=nodes, out_rules=nodes, seed=seed, parts=("h", "x"))
    model = EGNN()
    return ([check_symmetry(model, (h, x), **euclid), check_symmetry(model, (h, x), **perm)],
            [check_symmetry(EGNN(raw_coordinates=True), (h, x), **euclid, name="edges read raw coordinates")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
