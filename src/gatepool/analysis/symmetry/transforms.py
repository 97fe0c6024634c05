"""Transforms of one tensor, each a callable with ``.inverse()``: a permutation of tokens, a cyclic shift, a
90° rotation, a flip, and their compositions. The tester (``tester.py``) applies one to the input of f and
one (the same unless given) to its output."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class Transform:
    """A tensor → tensor map with an inverse."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def inverse(self) -> Transform:
        raise NotImplementedError


def _dims(dims: int | Sequence[int]) -> tuple[int, ...]:
    return (dims,) if isinstance(dims, int) else tuple(dims)


class PermuteTokens(Transform):
    """Reorder along ``dim``: ``y.select(dim, i) = x.select(dim, perm[i])``.

    Give ``perm`` (a permutation of 0..n−1), or leave it None for a random one drawn from ``seed`` for
    whatever length the input has (the same seed and length always give the same permutation, so the
    input and the output of f are permuted alike).
    """

    def __init__(
        self, perm: torch.Tensor | Sequence[int] | None = None, *, dim: int = 1, seed: int = 0
    ) -> None:
        if perm is not None:
            perm = torch.as_tensor(perm, dtype=torch.long)
            if perm.ndim != 1 or not torch.equal(perm.sort().values, torch.arange(len(perm))):
                raise ValueError(f"perm must be a permutation of 0..n-1, got {perm.tolist()}")
        self.perm, self.dim, self.seed = perm, dim, seed

    def permutation(self, n: int) -> torch.Tensor:
        """The permutation used for length n."""
        if self.perm is None:
            return torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        if len(self.perm) != n:
            raise ValueError(f"perm has length {len(self.perm)} but the input has {n} along dim={self.dim}")
        return self.perm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        perm = self.permutation(x.shape[self.dim]).to(x.device)
        return x.index_select(self.dim, perm)

    def inverse(self) -> PermuteTokens:
        if self.perm is None:
            return _InversePermutation(self)
        return PermuteTokens(torch.argsort(self.perm), dim=self.dim)

    def __repr__(self) -> str:
        what = f"seed={self.seed}" if self.perm is None else f"perm={self.perm.tolist()}"
        return f"PermuteTokens({what}, dim={self.dim})"


class _InversePermutation(PermuteTokens):
    """The inverse of a seeded random permutation (the permutation is drawn when the length is known)."""

    def __init__(self, forward: PermuteTokens) -> None:
        super().__init__(None, dim=forward.dim, seed=forward.seed)
        self.forward = forward

    def permutation(self, n: int) -> torch.Tensor:
        return torch.argsort(self.forward.permutation(n))

    def inverse(self) -> PermuteTokens:
        return self.forward

    def __repr__(self) -> str:
        return f"{self.forward!r}.inverse()"


class CyclicShift(Transform):
    """``torch.roll(x, shifts, dims)``: a cyclic translation (what circular padding is equivariant to).

    An int ``shifts`` moves every one of ``dims`` by that much: ``CyclicShift(1)`` rolls H and W by 1.
    """

    def __init__(self, shifts: int | Sequence[int], dims: int | Sequence[int] = (-2, -1)) -> None:
        self.dims = _dims(dims)
        self.shifts = (shifts,) * len(self.dims) if isinstance(shifts, int) else tuple(shifts)
        if len(self.shifts) != len(self.dims):
            raise ValueError(f"shifts {self.shifts} and dims {self.dims} must have the same length")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.roll(x, self.shifts, self.dims)

    def inverse(self) -> CyclicShift:
        return CyclicShift(tuple(-s for s in self.shifts), self.dims)

    def __repr__(self) -> str:
        return f"CyclicShift(shifts={self.shifts}, dims={self.dims})"


class Rotate90(Transform):
    """``torch.rot90(x, k, dims)``: k quarter turns (counter-clockwise in the (dims[0], dims[1]) plane)."""

    def __init__(self, k: int = 1, dims: Sequence[int] = (-2, -1)) -> None:
        self.k, self.dims = k, tuple(dims)
        if len(self.dims) != 2:
            raise ValueError(f"dims must name 2 dims, got {self.dims}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rot90(x, self.k, self.dims)

    def inverse(self) -> Rotate90:
        return Rotate90(-self.k, self.dims)

    def __repr__(self) -> str:
        return f"Rotate90(k={self.k}, dims={self.dims})"


class Flip(Transform):
    """``torch.flip(x, dims)``; its own inverse."""

    def __init__(self, dims: int | Sequence[int] = -1) -> None:
        self.dims = _dims(dims)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, self.dims)

    def inverse(self) -> Flip:
        return self

    def __repr__(self) -> str:
        return f"Flip(dims={self.dims})"


class Compose(Transform):
    """Apply ``transforms`` left to right; the inverse undoes them right to left."""

    def __init__(self, *transforms: Transform) -> None:
        self.transforms = transforms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for t in self.transforms:
            x = t(x)
        return x

    def inverse(self) -> Compose:
        return Compose(*(t.inverse() for t in reversed(self.transforms)))

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.transforms))})"
