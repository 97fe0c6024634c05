"""SchNet (Schütt et al. 2017): atoms interact through filters of their distances only,

    h_i ← h_i + MLP(Σ_{j≠i} W(h_j) ⊙ filter(rbf(|x_i − x_j|))),   E = Σ_i MLP(h_i),

so the energy is invariant to rotations, reflections and translations and to the order of the atoms,
and the forces ``F = −∂E/∂x`` turn with the molecule (``Vectors()``) and follow its atoms. Baseline: an
MLP on each atom's type and raw coordinates, summed (order-invariant, not E(3)).

Test: ``E3()`` with atom types ``Invariant()`` and positions ``Positions()``; the energy ``Invariant()``,
the forces ``Vectors()``. ``Permutations(n)`` with ``Permuted(1)`` on types, positions and forces.
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
    Vectors,
    check_symmetry,
)


def mlp(d_in: int, d_out: int, width: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, width), nn.Tanh(), nn.Linear(width, d_out))


class SchNet(nn.Module):
    def __init__(self, n_types: int = 5, width: int = 16, n_rbf: int = 16, cutoff: float = 5.0,
                 interactions: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(n_types, width)
        self.register_buffer("centres", torch.linspace(0, cutoff, n_rbf))
        self.filters = nn.ModuleList([mlp(n_rbf, width) for _ in range(interactions)])
        self.lins = nn.ModuleList([nn.Linear(width, width) for _ in range(interactions)])
        self.updates = nn.ModuleList([mlp(width, width) for _ in range(interactions)])
        self.energy = mlp(width, 1)

    def energy_of(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B, N) long, (B, N, 3)
        n = z.shape[1]
        off = ~torch.eye(n, dtype=torch.bool, device=x.device)  # no self-interaction
        d2 = ((x[:, :, None] - x[:, None]) ** 2).sum(-1)  # (B, N, N)
        d = torch.where(off, d2, torch.ones_like(d2)).sqrt()  # no √0 on the diagonal (its gradient)
        rbf = torch.exp(-4.0 * (d[..., None] - self.centres) ** 2)  # (B, N, N, n_rbf)
        h = self.embed(z)  # (B, N, width)
        for filt, lin, update in zip(self.filters, self.lins, self.updates):
            w = filt(rbf) * off[..., None]  # (B, N, N, width)
            h = h + update((w * lin(h)[:, None]).sum(2))
        return self.energy(h).sum((1, 2))  # (B,)

    def forward(self, z: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():  # forces need ∂E/∂x even under no_grad
            x = x.detach().requires_grad_(True)
            energy = self.energy_of(z, x)
            (grad,) = torch.autograd.grad(energy.sum(), x)
        return energy.detach(), -grad  # (B,), (B, N, 3)


class RawCoordinates(SchNet):
    """The baseline: an MLP on (type embedding, x, y, z) per atom, summed."""

    def __init__(self, n_types: int = 5, width: int = 16) -> None:
        super().__init__(n_types, width, interactions=0)
        self.mlp = mlp(width + 3, 1)

    def energy_of(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.embed(z), x], -1)).sum((1, 2))


def reports(seed: int = 0) -> tuple[list[SymmetryReport], list[SymmetryReport]]:
    """The network's reports (they pass) and the baseline's (they fail)."""
    torch.manual_seed(seed)
    n = 6
    z, x = torch.randint(0, 5, (2, n)), 1.5 * torch.randn(2, n, 3)
    # types do not move, positions turn and move; the energy stays, the forces turn
    euclid = dict(group=E3(), in_rules=(Invariant(), Positions()), out_rules=(Invariant(), Vectors()),
                  seed=seed, parts=("energy", "forces"))
    perm = dict(group=Permutations(n), in_rules=(Permuted(1), Permuted(1)),
                out_rules=(Invariant(), Permuted(1)), seed=seed, parts=("energy", "forces"))
    model = SchNet()
    return ([check_symmetry(model, (z, x), **euclid), check_symmetry(model, (z, x), **perm)],
            [check_symmetry(RawCoordinates(), (z, x), **euclid, name="MLP on raw coordinates")])


if __name__ == "__main__":
    for report in sum(reports(), []):
        print(report)
