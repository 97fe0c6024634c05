"""The Euclidean group E(3) and its subgroups: rotations, reflections, translations of 3-D space (EGNN is
equivariant to all of them, SchNet's energy invariant).

An element is ``x ↦ R x + t`` with R orthogonal (det +1: a rotation, −1: a rotation and a reflection).
Rotations are drawn uniformly (the Haar measure on SO(3)): a quaternion with four independent normal
entries, normalized, is uniform on the unit sphere S³, and S³ covers SO(3) twice evenly
(:func:`rand_matrix`, as ``e3nn.o3.rand_matrix``). A reflection is the inversion ``−I`` composed with a
uniform rotation, which is uniform over the det = −1 half of O(3). Rules: :class:`Positions` turn and move
(``x' = R x + t``), :class:`Vectors` (velocities, forces, displacements) only turn (``v' = R v``),
:class:`~gatepool.analysis.symmetry.group.Invariant` parts (scalar features, an energy) do not move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .group import Group, expect_element


def quaternion_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """The rotation of unit quaternions ``q = (w, x, y, z)`` (..., 4) as matrices (..., 3, 3)."""
    q = q / q.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, dim=-1).unflatten(-1, (3, 3))


def rand_matrix(
    *shape: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Rotation matrices (*shape, 3, 3) drawn uniformly from SO(3) (Haar), from normalized Gaussian
    quaternions."""
    q = torch.randn(*shape, 4, generator=generator, dtype=torch.float64)
    return quaternion_to_matrix(q).to(dtype)


@dataclass(frozen=True, eq=False)
class EuclideanElement:
    """``x ↦ R x + t``: ``R`` (3, 3) orthogonal, ``t`` (3,), both float64 (cast to the data's dtype when
    applied)."""

    R: torch.Tensor
    t: torch.Tensor

    def __repr__(self) -> str:
        det = torch.linalg.det(self.R).item()
        rot = self.R * (1 if det > 0 else -1)  # the rotation part
        angle = math.degrees(math.acos(max(-1.0, min(1.0, (rot.trace().item() - 1) / 2))))
        parts = [f"rotation {angle:.0f}°"] + (["reflected"] if det < 0 else [])
        if self.t.abs().max() > 0:
            parts.append(f"|t| = {self.t.norm().item():.2f}")
        return ", ".join(parts)


class E3(Group):
    """E(3) or a subgroup: ``E3()`` everything, ``E3(reflection=False)`` SE(3), ``E3(translation=False)``
    O(3), ``E3(reflection=False, translation=False)`` SO(3), ``E3(rotation=False, reflection=False)`` the
    translations. With ``reflection`` every second element drawn has det −1 (``sample`` flips a coin);
    translations are Gaussian with standard deviation ``translation_scale`` along each axis."""

    def __init__(
        self, rotation: bool = True, reflection: bool = True, translation: bool = True,
        translation_scale: float = 1.0,
    ) -> None:
        if not (rotation or translation):
            raise ValueError("E3 needs rotation or translation (reflections alone: the inversion −I)")
        if not translation_scale > 0:
            raise ValueError(f"translation_scale must be > 0, got {translation_scale}")
        self.rotation, self.reflection, self.translation = rotation, reflection, translation
        self.translation_scale = translation_scale

    def draw(self, trials: int, generator: torch.Generator) -> list:
        if not isinstance(trials, int) or trials < 1:
            raise ValueError(f"trials must be an int >= 1, got {trials!r}")
        return [self._element(generator, self.reflection and i % 2 == 1) for i in range(trials)]

    def sample(self, generator: torch.Generator) -> EuclideanElement:
        coin = torch.rand((), generator=generator, dtype=torch.float64).item() < 0.5
        return self._element(generator, self.reflection and coin)

    def _element(self, generator: torch.Generator, reflect: bool) -> EuclideanElement:
        R = rand_matrix(generator=generator) if self.rotation else torch.eye(3, dtype=torch.float64)
        t = torch.zeros(3, dtype=torch.float64)
        if self.translation:
            t = self.translation_scale * torch.randn(3, generator=generator, dtype=torch.float64)
        return EuclideanElement(-R if reflect else R, t)

    def __repr__(self) -> str:
        return (f"E3(rotation={self.rotation}, reflection={self.reflection}, "
                f"translation={self.translation})")


def _apply(R: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.shape[dim] != 3:
        raise ValueError(f"axis {dim} must hold the 3 coordinates, it has {x.shape[dim]}")
    x = x.movedim(dim, -1)  # (..., 3)
    return (x @ R.to(x).T).movedim(-1, dim)


class Positions:
    """Points turn and move: ``x' = R x + t``, coordinates along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        self.dim = dim

    def __call__(self, g: EuclideanElement, x: torch.Tensor) -> torch.Tensor:
        expect_element(self, g, EuclideanElement, "E3 or Octahedral")
        shape = [1] * x.ndim
        shape[self.dim] = 3
        return _apply(g.R, x, self.dim) + g.t.to(x).reshape(shape)

    def __repr__(self) -> str:
        return f"Positions(dim={self.dim})"


class Vectors:
    """Vectors (velocities, forces, differences of positions) turn and do not move: ``v' = R v``,
    coordinates along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        self.dim = dim

    def __call__(self, g: EuclideanElement, x: torch.Tensor) -> torch.Tensor:
        expect_element(self, g, EuclideanElement, "E3 or Octahedral")
        return _apply(g.R, x, self.dim)

    def __repr__(self) -> str:
        return f"Vectors(dim={self.dim})"
