"""The one-tensor tester: is f equivariant or invariant to a transform T?

    equivariant:  f(T x) = T' f(x)     (T' = T unless given: the output moves with the input)
    invariant:    f(T x) = f(x)

The error functions run ``fn`` under ``torch.no_grad()`` and return the largest absolute difference (a
float); models should be in eval mode (dropout would make f random). When ``fn`` returns a tuple, a list or
a dict, ``output=`` picks the part to compare (an index, a key, or a callable applied to the whole output);
a tensor result takes no index or key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

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
