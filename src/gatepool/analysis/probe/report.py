"""The probe's result: per module the measured moments beside the ideal, as a table and a dict/JSON.

    ratio = measured / ideal     (1 where the lecture's rules hold; "—" where there is no prediction)

A :class:`ProbeReport` holds one :class:`Row` per measured tensor (a module's output, ``name[i]`` for the
i-th tensor of a tuple output, ``name:in`` for a module input, ``(input)`` and ``(output)`` for the
model's), in the order the forward pass produced them, and one :class:`ParamRow` per parameter.
``report["block1.conv1"].forward.var`` reads one figure; ``report.error`` says what failed, if anything,
and the rows are then the ones measured before the failure. ``save_figures(report, directory)``
(``figures.py``) draws it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from gatepool.analysis.probe.predict import Ideal, Prediction


@dataclass
class TensorStats:
    """Moments of one tensor's elements (of the gradient, for ``Row.backward``), over all calls.

    ``var`` pools every element (population variance, E[x²] − mean²); ``var_batch`` is the mean over
    elements of the variance across the batch (unbiased), NaN for a batch of 1. Non-finite values are
    counted in ``nonfinite`` and left out of the moments.
    """

    numel: int
    mean: float
    var: float
    e2: float
    zero_share: float
    nonfinite: int = 0
    var_batch: float = math.nan

    @property
    def rms(self) -> float:
        return math.sqrt(self.e2) if self.e2 >= 0 else math.nan

    def to_dict(self) -> dict:
        return {
            k: _num(getattr(self, k))
            for k in ("numel", "mean", "var", "e2", "zero_share", "nonfinite", "var_batch")
        }


@dataclass
class Row:
    """One measured tensor: forward moments, gradient moments, the ideal and optional detail."""

    name: str
    kind: str
    shape: tuple[int, ...] | None = None
    calls: int = 0
    forward: TensorStats | None = None
    backward: TensorStats | None = None  # of ∂L/∂(this tensor)
    ideal: Ideal | None = None
    per_channel: dict[str, torch.Tensor] | None = None  # mean, var, e2, zero_share, grad_e2: (C,)
    maps: dict[str, torch.Tensor] | None = None  # mean, var, e2, grad_e2: (H, W), over batch and channels
    samples: torch.Tensor | None = None  # a random subset of the values, for histograms
    grad_samples: torch.Tensor | None = None  # and of the gradient's
    meta: dict[str, Any] = field(default_factory=dict)  # conv geometry, input shape
    notes: list[str] = field(default_factory=list)
    predicted: Any = None  # correlated_predict.CorrelatedRow: the correlation-aware prediction
    measured_field: Any = None  # correlated.Field of the output, measured: its correlation stencil

    def ratio(self, what: str = "var") -> float | None:
        """measured / ideal for ``what`` in "mean", "var", "e2", "grad_e2"; None without both."""
        if what not in ("mean", "var", "e2", "grad_e2"):
            raise ValueError(f"what must be 'mean', 'var', 'e2' or 'grad_e2', got {what!r}")
        ideal = None if self.ideal is None else getattr(self.ideal, what)
        stats = self.backward if what == "grad_e2" else self.forward
        measured = None if stats is None else getattr(stats, "e2" if what == "grad_e2" else what)
        if ideal is None or measured is None or ideal == 0 or not math.isfinite(measured):
            return None
        return measured / ideal

    def to_dict(self, detail: bool = True) -> dict:
        d = {
            "name": self.name,
            "kind": self.kind,
            "shape": list(self.shape) if self.shape else None,
            "calls": self.calls,
            "forward": self.forward.to_dict() if self.forward else None,
            "backward": self.backward.to_dict() if self.backward else None,
            "ideal": self.ideal.to_dict() if self.ideal else None,
            "ratio": {w: self.ratio(w) for w in ("var", "e2", "grad_e2")},
            "notes": list(self.notes),
        }
        if self.predicted is not None:
            d["predicted"] = self.predicted.to_dict()
        if self.measured_field is not None:
            from gatepool.analysis.probe.correlated import neighbour_corr

            d["measured_corr"] = {str(k): _num(neighbour_corr(self.measured_field, k)) for k in (1, 2)}
        if self.meta:
            d["meta"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.meta.items()}
        if detail and self.per_channel:
            d["per_channel"] = {k: _nums(v) for k, v in self.per_channel.items()}
        if detail and self.maps:
            d["maps"] = {k: _nums(v) for k, v in self.maps.items()}
        return d


@dataclass
class ParamRow:
    """One parameter W: rms W, rms ∂L/∂W, ‖∂L/∂W‖, ‖W‖ and ‖∂L/∂W‖/‖W‖ (NaN without a gradient)."""

    name: str
    shape: tuple[int, ...]
    rms: float
    norm: float
    grad_rms: float = math.nan
    grad_norm: float = math.nan

    @property
    def ratio(self) -> float:
        return self.grad_norm / self.norm if self.norm > 0 else math.nan

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "rms": _num(self.rms),
            "norm": _num(self.norm),
            "grad_rms": _num(self.grad_rms),
            "grad_norm": _num(self.grad_norm),
            "ratio": _num(self.ratio),
        }


@dataclass
class ProbeReport:
    rows: dict[str, Row]
    params: list[ParamRow]
    backward: str | None  # "loss", "unit-noise" or None
    loss_reduction: str | None = None
    loss: float | None = None
    error: str | None = None  # what failed; the rows are those measured before
    warnings: list[str] = field(default_factory=list)
    prediction: Prediction | None = None
    setup: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Row:
        if name not in self.rows:
            few = ", ".join(list(self.rows)[:8])
            raise KeyError(f"no measured tensor {name!r}; names include: {few}")
        return self.rows[name]

    def __contains__(self, name: object) -> bool:
        return name in self.rows

    def __iter__(self):
        return iter(self.rows.values())

    @property
    def complete(self) -> bool:
        return self.error is None

    def param(self, name: str) -> ParamRow:
        """The parameter row of ``name`` (as in ``model.named_parameters()``)."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"no parameter {name!r}; names include: {', '.join(p.name for p in self.params[:8])}")

    def table(self) -> str:
        """Plain text: per tensor, forward Var ideal | measured | ratio, then E[g²] the same way."""
        pred = any(r.predicted is not None for r in self.rows.values())  # the correlated prediction
        hp = f" {'predicted':>9}" if pred else ""
        hdr = (
            f"{'tensor':<22} {'type':<13} {'shape':<16}│{'mean':>7} {'zeros':>6} │ {'Var ideal':>9} "
            f"{'measured':>9} {'ratio':>6}{hp} │ {'E[g²] ideal':>11} {'measured':>10} {'ratio':>6}"
            f"{hp} {'g=0':>5}"
        )
        lines = [hdr, "─" * len(hdr)]
        for r in self.rows.values():
            f, b, i, p = r.forward, r.backward, r.ideal, r.predicted
            shape = "×".join(map(str, r.shape)) if r.shape else "?"
            pv = f" {_fmt(p and p.var, 9)}" if pred else ""
            pg = f" {_fmt(p and p.grad_e2, 9)}" if pred else ""
            lines.append(
                f"{r.name:<22.22} {r.kind:<13.13} {shape:<16.16}│{_fmt(f and f.mean, 7, '.3f')} "
                f"{_fmt(f and f.zero_share, 6, '.1%')} │ {_fmt(i and i.var, 9)} {_fmt(f and f.var, 9)} "
                f"{_fmt(r.ratio('var'), 6, '.2f')}{pv} │ {_fmt(i and i.grad_e2, 11)} {_fmt(b and b.e2, 10)} "
                f"{_fmt(r.ratio('grad_e2'), 6, '.2f')}{pg} {_fmt(b and b.zero_share, 5, '.0%')}"
                + (f"  {i.note}" if i is not None and i.note else "")
            )
        if self.params:
            ph = (
                f"{'parameter':<28} {'shape':<16} {'rms W':>9} {'rms ∂L/∂W':>10} {'‖∂L/∂W‖':>10} "
                f"{'‖W‖':>9} {'‖∂L/∂W‖/‖W‖':>12}"
            )
            lines += ["", ph, "─" * len(ph)]
            for p in self.params:
                lines.append(
                    f"{p.name:<28.28} {'×'.join(map(str, p.shape)):<16.16} {_fmt(p.rms, 9)} "
                    f"{_fmt(p.grad_rms, 10)} {_fmt(p.grad_norm, 10)} {_fmt(p.norm, 9)} {_fmt(p.ratio, 12)}"
                )
        seed = {
            "unit-noise": "backward seeded with unit-variance noise at the output",
            "loss": f"backward from the cross-entropy ({self.loss_reduction} over the batch)",
        }
        if self.backward:
            lines += ["", seed[self.backward] + (f", loss {self.loss:.4g}" if self.loss is not None else "")]
        lines += [f"warning: {w}" for w in self.warnings]
        if self.error:
            lines.append(f"INCOMPLETE — {self.error}; the rows above are the ones measured before it")
        return "\n".join(lines)

    def to_dict(self, detail: bool = True) -> dict:
        """Everything but the value samples; ``detail=False`` also leaves out per-channel values and maps."""
        return {
            "setup": dict(self.setup),
            "backward": self.backward,
            "loss_reduction": self.loss_reduction,
            "loss": _num(self.loss),
            "complete": self.complete,
            "error": self.error,
            "warnings": list(self.warnings),
            "modules": [r.to_dict(detail) for r in self.rows.values()],
            "params": [p.to_dict() for p in self.params],
            "prediction": {k: v for k, v in self.prediction.to_dict().items() if k != "modules"}
            if self.prediction
            else None,
        }

    def to_json(self, detail: bool = True) -> str:
        return json.dumps(self.to_dict(detail), indent=1, allow_nan=False)


def _fmt(v: float | None, width: int, fmt: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return f"{'—':>{width}}"
    return f"{v:>{width}{fmt}}"


def _num(v):
    """JSON-safe number: NaN and inf become None."""
    if v is None:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _nums(t: torch.Tensor) -> list:
    return (
        [None if not math.isfinite(x) else x for x in t.double().flatten().tolist()]
        if t.dim() <= 1
        else [_nums(r) for r in t]
    )
