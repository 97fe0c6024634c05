"""Symmetry tester: is f equivariant or invariant to a transform T?

    equivariant:  f(T x) = T' f(x)     (T' = T unless given: the output moves with the input)
    invariant:    f(T x) = f(x)

Examples from the lecture: self-attention without positions is permutation-equivariant
(``attn(π X) = π attn(X)``: every score ``q_i · k_j`` depends on contents only), a mean over tokens then
makes it invariant, and a positional encoding breaks both; a convolution with circular padding is
equivariant to cyclic shifts of the image.

Transforms (each is a callable with ``.inverse()``): :class:`PermuteTokens`, :class:`CyclicShift`,
:class:`Rotate90`, :class:`Flip`, and :class:`Compose` to chain them. The error functions run ``fn``
under ``torch.no_grad()`` and return the largest absolute difference (a float); models should be in eval
mode (dropout would make f random). When ``fn`` returns a tuple, a list or a dict, ``output=`` picks the
part to compare (an index, a key, or a callable applied to the whole output); a tensor result takes
no index or key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "Compose",
    "CyclicShift",
    "Flip",
    "PermuteTokens",
    "Rotate90",
    "Transform",
    "assert_equivariant",
    "assert_invariant",
    "default_tolerance",
    "equivariance_error",
    "invariance_error",
]


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


_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def default_tolerance(y: torch.Tensor) -> float:
    """Absolute tolerance for comparing f's outputs of y's dtype: ``rtol(dtype) · max(1, max|y|)``,
    rtol = 1e-10 (float64), 1e-5 (float32), 2e-3 (float16), 2e-2 (bfloat16), 0 for exact dtypes."""
    if not y.is_floating_point() and not y.is_complex():
        return 0.0
    rtol = _RTOL.get(y.dtype, 1e-5)
    return rtol * max(1.0, y.detach().abs().max().item() if y.numel() else 0.0)


def _select(y: Any, output: int | str | Callable[[Any], torch.Tensor] | None) -> torch.Tensor:
    if isinstance(y, torch.Tensor) and output is not None and not callable(output):
        raise TypeError(
            f"output={output!r} indexes a tuple, list or dict, but fn returned a tensor; "
            "drop output= (or pass a callable)"
        )  # y[output] would silently pick one row of the batch
    if output is not None:
        y = output(y) if callable(output) else y[output]
    if not isinstance(y, torch.Tensor):
        raise TypeError(
            f"fn returned a {type(y).__name__}; choose the tensor to compare with output= "
            "(an index, a key, or a callable)"
        )
    return y


def _check_transform(name: str, t: Any) -> None:
    if not callable(t):
        raise TypeError(f"{name} must be callable (a Transform), got {type(t).__name__}")


def _pair(fn, x, transform, out_transform, output, invariant: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _check_transform("transform", transform)
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not invariant and out_transform is not None:
        _check_transform("out_transform", out_transform)
    with torch.no_grad():
        moved = _select(fn(transform(x)), output)  # f(T x)
        y = _select(fn(x), output)  # f(x)
        expected = y if invariant else (out_transform or transform)(y)
    if moved.shape != expected.shape:
        raise ValueError(f"f(T x) has shape {tuple(moved.shape)}, the expected one {tuple(expected.shape)}")
    return moved, expected


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def equivariance_error(
    fn: Callable,
    x: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor],
    out_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    output: int | str | Callable | None = None,
) -> float:
    """``max |f(T x) − T' f(x)|`` with ``T' = out_transform or transform``."""
    moved, expected = _pair(fn, x, transform, out_transform, output, invariant=False)
    return _max_abs(moved, expected)


def invariance_error(
    fn: Callable,
    x: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor],
    *,
    output: int | str | Callable | None = None,
) -> float:
    """``max |f(T x) − f(x)|``."""
    moved, expected = _pair(fn, x, transform, None, output, invariant=True)
    return _max_abs(moved, expected)


def assert_equivariant(
    fn: Callable,
    x: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor],
    out_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    atol: float | None = None,
    output: int | str | Callable | None = None,
) -> float:
    """Raise AssertionError unless ``equivariance_error <= atol`` (default: :func:`default_tolerance`).
    Returns the error."""
    moved, expected = _pair(fn, x, transform, out_transform, output, invariant=False)
    err, tol = _max_abs(moved, expected), default_tolerance(expected) if atol is None else atol
    if not err <= tol:
        msg = f"max |f(T x) - T' f(x)| = {err:.3g} > {tol:.3g}"
        raise AssertionError(f"not equivariant to {transform!r}: {msg}")
    return err


def assert_invariant(
    fn: Callable,
    x: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor],
    *,
    atol: float | None = None,
    output: int | str | Callable | None = None,
) -> float:
    """Raise AssertionError unless ``invariance_error <= atol`` (default: :func:`default_tolerance`).
    Returns the error."""
    moved, expected = _pair(fn, x, transform, None, output, invariant=True)
    err, tol = _max_abs(moved, expected), default_tolerance(expected) if atol is None else atol
    if not err <= tol:
        raise AssertionError(f"not invariant to {transform!r}: max |f(T x) - f(x)| = {err:.3g} > {tol:.3g}")
    return err
