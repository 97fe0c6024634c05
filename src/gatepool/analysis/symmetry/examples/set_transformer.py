"""Set Transformer (Lee et al. 2019): self-attention blocks without positions (SAB) are permutation-
equivariant, and pooling by attention to learned seeds (PMA) is then invariant: every score ``q · k``
depends on contents only. Baseline: the same network with a learned positional embedding, which gives
each place in the input its own vector and so breaks both.

Test: ``Permutations(n)`` on the element axis; the pooled output is ``Invariant()``, the encoded set moves
with the input (``Permuted(1)``).
"""

from __future__ import annotations

import torch
from torch import nn

from gatepool.analysis.symmetry import Invariant, Permutations, Permuted, SymmetryReport, check_symmetry


class SAB(nn.Module):
    """Set attention block: ``H = X + MHA(X, X, X)``, ``out = H + FF(H)`` (post-norm)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, width)
        x = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.ff(x))


class SetTransformer(nn.Module):
    def __init__(self, d_in: int = 3, width: int = 16, heads: int = 2, d_out: int = 2,
                 n_positions: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.pos = nn.Parameter(torch.randn(n_positions, width)) if n_positions else None
        self.encoder = nn.Sequential(SAB(width, heads), SAB(width, heads))
        self.seed = nn.Parameter(torch.randn(1, 1, width))  # PMA with one seed
        self.pool = nn.MultiheadAttention(width, heads, batch_first=True)
        self.head = nn.Linear(width, d_out)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (B, N, d_in)
        h = self.embed(x)
        if self.pos is not None:
            h = h + self.pos  # the baseline: a vector per position
        h = self.encoder(h)  # (B, N, width): equivariant
        seed = self.seed.expand(len(x), -1, -1)
        pooled = self.pool(seed, h, h, need_weights=False)[0][:, 0]  # (B, width): invariant
        return self.head(pooled), h


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    n = 10
    x = torch.randn(4, n, 3)
    test = dict(group=Permutations(n), in_rules=Permuted(1), out_rules=(Invariant(), Permuted(1)), seed=seed,
                parts=("pooled", "encoded set"))
    return ([check_symmetry(SetTransformer(), x, **test)],
            [check_symmetry(SetTransformer(n_positions=n), x, **test, name="with positional embedding")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
