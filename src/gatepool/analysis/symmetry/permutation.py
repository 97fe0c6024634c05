"""Permutations of n things: the symmetry of a set (DeepSets, Set Transformer), of a point cloud's order
(PointNet) and of a graph's node labels (GIN, and with a rotation EGNN and SchNet).

An element π relabels: new item i is old item ``π[i]``. Its rules: :class:`Permuted` reorders a tensor
along one or several axes (node features along the node axis, an adjacency along both:
``A' = P A Pᵀ``), :class:`Relabeled` maps the values of an index tensor (an ``edge_index``): old node j is
new node ``π⁻¹[j]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .group import Group, expect_element


@dataclass(frozen=True, eq=False)
class Permutation:
    """One relabeling: new item i is old item ``perm[i]``."""

    perm: torch.Tensor  # (n,) long

    def inverse(self) -> Permutation:
        return Permutation(torch.argsort(self.perm))

    def __repr__(self) -> str:
        p = self.perm.tolist()
        return f"perm {p[:6]}{'…' if len(p) > 6 else ''}"


class Permutations(Group):
    """The symmetric group S_n, drawn uniformly (``torch.randperm``); a drawn permutation is never the
    identity (n ≥ 2)."""

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 2:
            raise ValueError(f"n must be an int >= 2 (the number of items permuted), got {n!r}")
        self.n = n

    def sample(self, generator: torch.Generator) -> Permutation:
        while True:
            perm = torch.randperm(self.n, generator=generator)
            if not torch.equal(perm, torch.arange(self.n)):
                return Permutation(perm)

    def __repr__(self) -> str:
        return f"Permutations({self.n})"


class Permuted:
    """Reorder along every axis in ``dims``: ``x' = x.index_select(d, π)`` for each d (node features:
    ``dims=1``; a dense adjacency (B, N, N): ``dims=(1, 2)``)."""

    def __init__(self, dims: int | Sequence[int] = 1) -> None:
        self.dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if not self.dims:
            raise ValueError("dims must name at least one axis")

    def __call__(self, g: Permutation, x: torch.Tensor) -> torch.Tensor:
        expect_element(self, g, Permutation, "Permutations")
        for d in self.dims:
            if x.shape[d] != len(g.perm):
                raise ValueError(f"{self!r}: axis {d} has {x.shape[d]} items, the permutation {len(g.perm)}")
            x = x.index_select(d, g.perm.to(x.device))
        return x

    def __repr__(self) -> str:
        return f"Permuted(dims={self.dims if len(self.dims) > 1 else self.dims[0]})"


class Relabeled:
    """Map the values of an index tensor (an ``edge_index`` (2, E) of node numbers): ``j ↦ π⁻¹[j]``, the
    new label of old node j. The order of the edges stays."""

    def __call__(self, g: Permutation, x: torch.Tensor) -> torch.Tensor:
        expect_element(self, g, Permutation, "Permutations")
        if x.is_floating_point() or x.is_complex():
            raise TypeError(f"Relabeled maps node numbers: x must be an integer tensor, got {x.dtype}")
        return g.inverse().perm.to(x.device)[x]

    def __repr__(self) -> str:
        return "Relabeled()"
