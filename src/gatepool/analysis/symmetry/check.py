"""The tester for models with several inputs and outputs: ``check_symmetry`` tries elements g of a group
and compares, part by part,

    f(g·x₁, g·x₂, …)ₖ   with   g·f(x₁, x₂, …)ₖ

where each input and output part has its own rule for g (see ``group.py``: a node permutation moves node
features along one axis and an adjacency along both; a rotation turns positions and leaves scalar features
alone). Each element is tried in float32 and float64 (a module is copied and cast, floating inputs cast;
integer inputs such as atom types or an ``edge_index`` stay), so the report shows both the error and what
rounding alone gives. Per row: the largest absolute error, the relative one (over the largest |g·f(x)|),
and the tolerance ``default_tolerance``: ``rtol(dtype) · max(1, max|g·f(x)|)`` with rtol 1e-5 in float32
and 1e-10 in float64. A part passes when its error is within it for every element tried. Entries of the
expectation that a rule marks NaN (a delayed output's first steps) are not compared.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .group import Group
from .tester import default_tolerance

Rule = Callable[[Any, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Row:
    """One comparison: one dtype, one group element, one output part."""

    dtype: str
    element: str
    part: str
    max_abs: float
    rel: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.tol  # False for NaN


@dataclass(frozen=True)
class SymmetryReport:
    """Every comparison of a :func:`check_symmetry` run; ``str(report)`` is the table to hand in."""

    name: str
    group: str
    rows: tuple[Row, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def _pick(self, dtype: str | torch.dtype | None, part: str | None) -> list[Row]:
        dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
        rows = [r for r in self.rows
                if (dtype is None or r.dtype == dtype) and (part is None or r.part == part)]
        if not rows:
            dtypes, parts = sorted({r.dtype for r in self.rows}), sorted({r.part for r in self.rows})
            raise ValueError(f"no rows for dtype={dtype!r}, part={part!r}; the report has dtypes {dtypes}, "
                             f"parts {parts}")
        return rows

    def max_abs(self, dtype: str | torch.dtype | None = None, part: str | None = None) -> float:
        """The largest absolute error over the rows of ``dtype`` and ``part`` (None: all)."""
        return max(r.max_abs for r in self._pick(dtype, part))

    def max_rel(self, dtype: str | torch.dtype | None = None, part: str | None = None) -> float:
        return max(r.rel for r in self._pick(dtype, part))

    def errors(self, dtype: str | torch.dtype | None = None, part: str | None = None) -> dict[str, float]:
        """{element: largest absolute error}: for time shifts, the error as a function of the shift."""
        out: dict[str, float] = {}
        for r in self._pick(dtype, part):
            out[r.element] = max(out.get(r.element, 0.0), r.max_abs)
        return out

    def summary(self) -> list[str]:
        """One line per (dtype, part): the worst element's errors and the verdict."""
        lines = []
        for dtype in dict.fromkeys(r.dtype for r in self.rows):
            for part in dict.fromkeys(r.part for r in self.rows):
                rows = self._pick(dtype, part)
                worst = max(rows, key=lambda r: (r.max_abs != r.max_abs, r.max_abs))
                verdict = "pass" if all(r.ok for r in rows) else "FAIL"
                lines.append(f"{dtype:8} {part:18} max abs {worst.max_abs:9.2e}  rel {worst.rel:9.2e}  "
                             f"tol {worst.tol:8.1e}  {verdict}  ({len(rows)} elements, worst: "
                             f"{worst.element})")
        return lines

    def __str__(self) -> str:
        head = f"{self.name}: {self.group}: {'pass' if self.ok else 'FAIL'}"
        return "\n".join([head, *("  " + line for line in self.summary())])

    def table(self) -> str:
        """Every row (a Markdown table)."""
        lines = ["| dtype | element | part | max abs | rel | tol | |", "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r.dtype} | {r.element} | {r.part} | {r.max_abs:.2e} | {r.rel:.2e} | "
                         f"{r.tol:.1e} | {'pass' if r.ok else 'FAIL'} |")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        """Raise AssertionError naming every failing row."""
        bad = [r for r in self.rows if not r.ok]
        if bad:
            rows = "\n".join(f"  {r.dtype} {r.part} under {r.element}: max abs {r.max_abs:.3g} > "
                             f"tol {r.tol:.3g}" for r in bad[:12])
            raise AssertionError(f"{self.name} is not symmetric under {self.group}:\n{rows}")


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _parts(y: Any, out_rules: Any, names: Sequence[str] | None) -> list[tuple[str, torch.Tensor, Rule]]:
    """[(name, tensor, rule)] for every output part that has a rule."""
    if isinstance(out_rules, Mapping):
        if not isinstance(y, Mapping):
            raise TypeError(f"out_rules is a dict but fn returned a {type(y).__name__}")
        missing = set(out_rules) - set(y)
        if missing:
            raise ValueError(f"out_rules names {sorted(missing)}, fn returned the keys {sorted(y)}")
        items = [(str(k), y[k], rule) for k, rule in out_rules.items()]
    else:
        ys, rules = _as_tuple(y), _as_tuple(out_rules)
        if len(ys) != len(rules):
            raise ValueError(f"fn returned {len(ys)} parts, out_rules has {len(rules)} (None skips a part)")
        if names is None:
            names = [f"output {k}" if len(ys) > 1 else "output" for k in range(len(ys))]
        elif len(names) != len(ys):
            raise ValueError(f"parts names {len(names)} parts, fn returned {len(ys)}")
        items = list(zip(names, ys, rules))
    for name, t, rule in items:
        if rule is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} is a {type(t).__name__}, not a tensor")
        if rule is not None and not callable(rule):
            raise TypeError(f"the rule of {name} must be callable (g, x) -> tensor, "
                            f"got {type(rule).__name__}")
    kept = [(n, t, r) for n, t, r in items if r is not None]
    if not kept:
        raise ValueError("every out_rule is None: nothing would be compared (Invariant() for a part that "
                         "does not move)")
    return kept


def _name(fn: Callable) -> str:
    """A module's class name, a function's own name."""
    return type(fn).__name__ if isinstance(fn, nn.Module) else getattr(fn, "__name__", type(fn).__name__)


def _cast(fn: Callable, dtype: torch.dtype | None) -> Callable:
    """A module: a copy in eval mode, cast to ``dtype`` (None: as it is); a function: itself."""
    if not isinstance(fn, nn.Module):
        return fn
    copied = copy.deepcopy(fn).eval()
    return copied if dtype is None else copied.to(dtype)


def _cast_input(x: Any, dtype: torch.dtype | None) -> Any:
    if dtype is not None and isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(dtype)
    return x


def _call(f: Callable, x: list, dtype: torch.dtype | None) -> Any:
    try:
        with torch.no_grad():
            return f(*x)
    except RuntimeError as e:
        if dtype is None or isinstance(f, nn.Module):
            raise
        raise RuntimeError(f"fn failed on {dtype} inputs ({e}); a function that closes over a module "
                           "cannot be cast: pass the module itself, or dtypes=None") from e


def _compare(moved: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    if moved.shape != expected.shape:
        raise ValueError(f"f(g·x) has shape {tuple(moved.shape)}, g·f(x) {tuple(expected.shape)}")
    keep = ~torch.isnan(expected) if expected.is_floating_point() else torch.ones_like(expected, bool)
    if not keep.any():
        return 0.0, 0.0
    diff = (moved.double() - expected.double())[keep].abs().max().item()
    scale = expected.double()[keep].abs().max().item()
    return diff, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def check_symmetry(
    fn: Callable,
    inputs: torch.Tensor | Sequence[Any],
    group: Group,
    in_rules: Rule | Sequence[Rule],
    out_rules: Rule | Sequence[Rule | None] | Mapping[str, Rule | None],
    *,
    trials: int = 4,
    seed: int = 0,
    dtypes: Sequence[torch.dtype] | None = (torch.float32, torch.float64),
    atol: float | Mapping[torch.dtype, float] | None = None,
    name: str | None = None,
    parts: Sequence[str] | None = None,
) -> SymmetryReport:
    """Compare ``f(g·x)`` with ``g·f(x)`` for elements g of ``group``, part by part, in every dtype.

    Args:
        fn: the model (an ``nn.Module`` is copied, cast to each dtype and put in eval mode) or a function;
            called as ``fn(*inputs)`` under ``torch.no_grad()`` (a model that needs gradients, e.g. forces
            as −∇E, enables them itself).
        inputs: one tensor or a tuple of the positional arguments.
        group: e.g. ``Permutations(n)``, ``E3()``, ``P4M()``, ``Octahedral()``, ``TimeShifts()``.
        in_rules: one rule per input, ``rule(g, x) → g·x`` (``Invariant()`` for a part that does not move).
        out_rules: one rule per output part (a tuple, or a dict for a dict output); ``Invariant()`` for an
            invariant part, None to leave a part out.
        trials: how many random elements of an infinite group (a finite group: every element but the
            identity).
        seed: seeds the elements drawn; the same seed gives the same elements in every dtype.
        dtypes: the dtypes to run in; None keeps the inputs' and ``fn``'s own.
        atol: the tolerance instead of ``default_tolerance`` (one float, or one per dtype).
        name: the report's title (default: a module's class name, a function's name).
        parts: names for the parts of a tuple output, for the report (default "output 0", "output 1", ...).

    Returns:
        A :class:`SymmetryReport`; ``report.ok``, ``print(report)``, ``report.assert_ok()``.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(group, Group):
        raise TypeError(f"group must be a Group (Permutations, E3, P4M, ...), got {type(group).__name__}")
    xs, rules = _as_tuple(inputs), _as_tuple(in_rules)
    if len(xs) != len(rules):
        raise ValueError(f"{len(xs)} inputs but {len(rules)} in_rules (one rule per input)")
    for k, rule in enumerate(rules):
        if not callable(rule):
            raise TypeError(f"in_rules[{k}] must be callable (g, x) -> tensor (Invariant() for a part that "
                            f"does not move), got {type(rule).__name__}")
    elements = group.draw(trials, torch.Generator().manual_seed(seed))
    rows = []
    for dtype in (None,) if dtypes is None else tuple(dtypes):
        f = _cast(fn, dtype)
        x = [_cast_input(t, dtype) for t in xs]
        y = _call(f, x, dtype)
        compared = _parts(y, out_rules, parts)
        for g in elements:
            moved_in = [rule(g, t) for rule, t in zip(rules, x)]
            moved = {n: t for n, t, _ in _parts(_call(f, moved_in, dtype), out_rules, parts)}
            for part, t, rule in compared:
                expected = rule(g, t)
                err, rel = _compare(moved[part], expected)
                if atol is None:
                    finite = expected.nan_to_num(0.0) if expected.is_floating_point() else expected
                    tol = default_tolerance(finite)
                elif isinstance(atol, Mapping):
                    if (dtype or expected.dtype) not in atol:
                        raise ValueError(f"atol has no tolerance for {dtype or expected.dtype}: {dict(atol)}")
                    tol = float(atol[dtype or expected.dtype])
                else:
                    tol = float(atol)
                dname = str(dtype or expected.dtype).removeprefix("torch.")
                rows.append(Row(dname, repr(g), part, err, rel, tol))
    return SymmetryReport(name or _name(fn), repr(group), tuple(rows))
