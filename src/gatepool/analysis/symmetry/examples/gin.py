"""GIN (Xu et al. 2019): ``h_i ← MLP((1 + ε) h_i + Σ_{j ∈ N(i)} h_j)``, then a sum over the nodes. Node
outputs are equivariant to relabeling the nodes and the graph output invariant: a relabeling permutes
the node features and both axes of the adjacency together (``A' = P A Pᵀ``), and a sum over neighbours
does not see labels. Baseline: the same GIN fed each node's index as a feature (one-hot), which
identifies nodes by their label.

Test: ``Permutations(n)`` with ``Permuted(1)`` on the features and ``Permuted((1, 2))`` on the adjacency;
the graph output ``Invariant()``, the node features ``Permuted(1)``.
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import Invariant, Permutations, Permuted, SymmetryReport, check_symmetry


class GINLayer(nn.Module):
    def __init__(self, d_in: int, width: int) -> None:
        super().__init__()
        self.eps = nn.Parameter(torch.tensor(0.1))
        self.mlp = nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:  # (B, N, d), (B, N, N)
        return self.mlp((1 + self.eps) * h + adj @ h)


class GIN(nn.Module):
    def __init__(self, d_in: int = 4, width: int = 16, d_out: int = 2, n_ids: int = 0) -> None:
        super().__init__()
        self.n_ids = n_ids  # the baseline: one-hot node indices appended to the features
        self.layers = nn.ModuleList([GINLayer(d_in + n_ids, width), GINLayer(width, width)])
        self.readout = nn.Linear(2 * width, d_out)

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.n_ids:
            h = torch.cat([h, torch.eye(self.n_ids).to(h).expand(len(h), -1, -1)], -1)
        sums = []
        for layer in self.layers:
            h = layer(h, adj)
            sums.append(h.sum(dim=1))  # (B, width): a sum over nodes per layer (GIN's readout)
        return self.readout(torch.cat(sums, -1)), h  # (B, d_out), (B, N, width)


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    n = 9
    h = torch.randn(3, n, 4)
    upper = (torch.rand(3, n, n) < 0.3).float().triu(1)
    adj = upper + upper.transpose(1, 2)  # undirected, no self-loops
    test = dict(group=Permutations(n), in_rules=(Permuted(1), Permuted((1, 2))),
                out_rules=(Invariant(), Permuted(1)), seed=seed, parts=("graph", "nodes"))
    return ([check_symmetry(GIN(), (h, adj), **test)],
            [check_symmetry(GIN(n_ids=n), (h, adj), **test, name="GIN with node-index features")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
