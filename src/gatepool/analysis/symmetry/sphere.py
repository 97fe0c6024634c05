"""3-D rotations of signals on a sphere, on a grid where they are exact.

A signal sampled at points ``p_i`` of the sphere turns as ``(g·f)(p) = f(g⁻¹p)``. For a rotation that maps
the point set onto itself this is a permutation of the samples and the test is exact to rounding; for any
other rotation the signal would have to be interpolated, and the interpolation's error would be mixed
into the model's. So the group here is the rotation group of the cube/octahedron (24 signed permutation
matrices of det +1; 48 with ``reflections``), and the grid a union of its orbits
(:func:`octahedral_grid`), closed under it. An isotropic spherical convolution (a filter that depends on
the angle between two points only) is equivariant to every rotation; the grid tests 24 of them exactly.
:class:`SphereSignal` refuses a rotation that does not map the grid onto itself, rather than interpolate.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from .euclidean import EuclideanElement
from .group import Group, expect_element


class Octahedral(Group):
    """The rotations of the cube (24; with ``reflections`` the full octahedral group, 48), as elements of
    E(3) without translation: the tester tries each."""

    def __init__(self, reflections: bool = False) -> None:
        self.reflections = reflections

    def elements(self) -> list[EuclideanElement]:
        out = []
        for perm in itertools.permutations(range(3)):
            for signs in itertools.product((1.0, -1.0), repeat=3):
                R = torch.zeros(3, 3, dtype=torch.float64)
                R[range(3), perm] = torch.tensor(signs, dtype=torch.float64)
                if self.reflections or torch.linalg.det(R) > 0:
                    out.append(EuclideanElement(R, torch.zeros(3, dtype=torch.float64)))
        return out  # perm (0, 1, 2) with signs (1, 1, 1) first: the identity

    def __repr__(self) -> str:
        return f"Octahedral(reflections={self.reflections})"


def octahedral_grid(
    seeds: Sequence[Sequence[float]] = ((1, 0, 0), (1, 1, 1), (1, 1, 0), (1, 2, 3)),
) -> torch.Tensor:
    """Unit vectors (N, 3) float64: the orbits of ``seeds`` under the 48 signed permutations, normalized,
    without repeats (the defaults: 6 face centres, 8 corners, 12 edge midpoints and 48 generic points)."""
    points = []
    for seed in seeds:
        s = torch.as_tensor(seed, dtype=torch.float64)
        if s.shape != (3,) or s.norm() == 0:
            raise ValueError(f"every seed must be a nonzero 3-vector, got {seed!r}")
        for g in Octahedral(reflections=True).elements():
            points.append(g.R @ s / s.norm())
    points = torch.stack(points)  # (48 · seeds, 3), with repeats
    same = torch.cdist(points, points) < 1e-9
    first = same.float().argmax(dim=1)  # the first copy of each point
    return points[first == torch.arange(len(points))]


class SphereSignal:
    """Samples on ``points`` (N, 3) along ``dim`` turn by permutation: ``f'(p_i) = f(Rᵀ p_i)``. Raises
    ValueError when R does not map the points onto themselves (use :class:`Octahedral` and
    :func:`octahedral_grid`)."""

    def __init__(self, points: torch.Tensor, dim: int = -1, tol: float = 1e-6) -> None:
        points = torch.as_tensor(points, dtype=torch.float64)
        if points.ndim != 2 or points.shape[1] != 3:
            raise ValueError(f"points must be (N, 3), got {tuple(points.shape)}")
        self.points, self.dim, self.tol = points, dim, tol
        self._found: dict[bytes, torch.Tensor] = {}  # R → permutation: each element is applied many times

    def permutation(self, g: EuclideanElement) -> torch.Tensor:
        """Index j(i) with ``p_j = Rᵀ p_i``: the sample that lands on point i."""
        key = g.R.double().numpy().tobytes()
        if key not in self._found:
            self._found[key] = self._match(g)
        return self._found[key]

    def _match(self, g: EuclideanElement) -> torch.Tensor:
        back = self.points @ g.R.double()  # row i: Rᵀ p_i
        dist, j = torch.cdist(back, self.points).min(dim=1)
        if dist.max() > self.tol or len(set(j.tolist())) != len(j):
            raise ValueError(f"{g!r} does not map the grid onto itself (off by {dist.max():.2g}): test with "
                             "Octahedral() on octahedral_grid(), or interpolate and state the error")
        return j

    def __call__(self, g: EuclideanElement, x: torch.Tensor) -> torch.Tensor:
        expect_element(self, g, EuclideanElement, "Octahedral")
        if x.shape[self.dim] != len(self.points):
            raise ValueError(f"{self!r}: axis {self.dim} has {x.shape[self.dim]} samples, the grid "
                             f"{len(self.points)} points")
        return x.index_select(self.dim, self.permutation(g).to(x.device))

    def __repr__(self) -> str:
        return f"SphereSignal({len(self.points)} points, dim={self.dim})"
