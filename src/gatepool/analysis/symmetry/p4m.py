"""The wallpaper group p4m on square images: the 8 symmetries of the square (4 quarter turns, each with or
without a mirror), about the image's centre. A G-CNN (Cohen & Welling 2016) is equivariant to it.

An element is ``h = Rʳ Fᵐ`` (r = 0..3 quarter turns counter-clockwise, ``torch.rot90``; m = 1: the mirror
``torch.flip`` along the width first). Since ``F R F = R⁻¹`` the product is
``(r₁, m₁)(r₂, m₂) = (r₁ + (−1)^m₁ r₂, m₁ + m₂)``. On an image, :class:`Image` applies ``T_g``. A G-CNN's
feature map also has a *group axis* (one channel per element, index ``j = 4m + r``: 8 for p4m, 4 for p4),
and g moves it too: ``(g·f)(h) = T_g f(g⁻¹h)`` (:class:`GroupImage`). Zero padding and an odd kernel keep
a convolution exact under these maps (the padding is symmetric); a stride or an even size breaks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .group import Group, expect_element


@dataclass(frozen=True)
class P4MElement:
    """``Rʳ Fᵐ``: ``rotation`` quarter turns after ``flip`` mirrors (0 or 1)."""

    rotation: int = 0
    flip: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rotation", self.rotation % 4)
        if self.flip not in (0, 1):
            raise ValueError(f"flip must be 0 or 1, got {self.flip!r}")

    @property
    def index(self) -> int:
        """Its place on a G-CNN's group axis: ``4·flip + rotation``."""
        return 4 * self.flip + self.rotation

    def __mul__(self, other: P4MElement) -> P4MElement:
        sign = -1 if self.flip else 1
        return P4MElement(self.rotation + sign * other.rotation, (self.flip + other.flip) % 2)

    def inverse(self) -> P4MElement:
        return self if self.flip else P4MElement(-self.rotation, 0)

    def image(self, x: torch.Tensor, dims: Sequence[int] = (-2, -1)) -> torch.Tensor:
        """``T_g x``: mirror along ``dims[1]``, then turn in the (dims[0], dims[1]) plane."""
        if self.flip:
            x = torch.flip(x, (dims[1],))
        return torch.rot90(x, self.rotation, tuple(dims))

    def __repr__(self) -> str:
        return f"rot {90 * self.rotation}°" + (" + flip" if self.flip else "")


class P4M(Group):
    """p4m (``reflections=True``, 8 elements) or its rotation subgroup p4 (4): the tester tries each."""

    def __init__(self, reflections: bool = True) -> None:
        self.reflections = reflections

    def elements(self) -> list[P4MElement]:
        return [P4MElement(r, m) for m in range(1 + self.reflections) for r in range(4)]

    def __repr__(self) -> str:
        return "P4M()" if self.reflections else "P4M(reflections=False)"


class Image:
    """An image (or any map on the square grid) turns and mirrors: ``x' = T_g x`` on ``dims`` (H, W)."""

    def __init__(self, dims: Sequence[int] = (-2, -1)) -> None:
        self.dims = tuple(dims)
        if len(self.dims) != 2:
            raise ValueError(f"dims must name 2 axes (H, W), got {self.dims}")

    def __call__(self, g: P4MElement, x: torch.Tensor) -> torch.Tensor:
        expect_element(self, g, P4MElement, "P4M")
        if x.shape[self.dims[0]] != x.shape[self.dims[1]]:
            raise ValueError(f"{self!r}: the image must be square, got {tuple(x.shape)}")
        return g.image(x, self.dims)

    def __repr__(self) -> str:
        return f"Image(dims={self.dims})"


class GroupImage(Image):
    """A G-CNN feature map (..., |G|, H, W): ``(g·f)(h) = T_g f(g⁻¹h)``, the group axis ``group_dim``
    of size 8 (p4m) or 4 (p4: rotations only)."""

    def __init__(self, group_dim: int = -3, dims: Sequence[int] = (-2, -1)) -> None:
        super().__init__(dims)
        self.group_dim = group_dim

    def __call__(self, g: P4MElement, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[self.group_dim]
        if size not in (4, 8) or (size == 4 and g.flip):
            raise ValueError(f"{self!r}: the group axis has {size} entries; p4m needs 8, p4 4 (no flips)")
        elements = [P4MElement(j % 4, j // 4) for j in range(size)]
        source = torch.tensor([(g.inverse() * h).index for h in elements], device=x.device)
        return super().__call__(g, x.index_select(self.group_dim, source))

    def __repr__(self) -> str:
        return f"GroupImage(group_dim={self.group_dim}, dims={self.dims})"
