"""Argument checks written once: an int in a range (not a bool), a finite number in a range.

Each returns the value as a plain Python ``int`` / ``float`` (numpy scalars accepted) or raises a
``ValueError`` that names the argument and the allowed range, so a user can act on it::

    check_int(3, "stride")                  -> 3
    check_int(True, "stride")               ValueError: stride must be an integer >= 1, got True
    check_int(None, "seed", optional=True)  -> None
    check_number(0.5, "p", 0, 1, high_open=True)  -> 0.5
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_int", "check_number"]


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"> {low}" if low_open else f">= {low}"
    if low is None:
        return f"< {high}" if high_open else f"<= {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def check_int(
    value: Any, name: str, low: int | None = 1, high: int | None = None, *, optional: bool = False
) -> int | None:
    """``value`` as an ``int`` if it is an integer (not a bool) in ``[low, high]``; ``None`` passes when
    ``optional``. Otherwise a ``ValueError`` naming ``name``: "stride must be an integer >= 1, got 0"."""
    if value is None and optional:
        return None
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be an integer {_range(low, high, False, False)}{none}, got {value!r}")
    return int(value)


def check_number(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> float | None:
    """``value`` as a ``float`` if it is a finite real number (not a bool) within the bounds (closed unless
    ``low_open`` / ``high_open``); ``None`` passes when ``optional``. Otherwise a ``ValueError`` naming
    ``name`` and the range: "confidence must be a number in (0, 1), got 1.5"."""
    if value is None and optional:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        bounds = "" if low is None and high is None else " " + _range(low, high, low_open, high_open)
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be a finite number{bounds}{none}, got {value!r}")
    return float(value)
