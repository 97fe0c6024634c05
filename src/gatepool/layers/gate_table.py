"""The gate table: one frozen record per gate, the one place that says what each gate is and has.

    gate            weights  τ        softmax  global  adaptive  torch's  SAME fill  create_pool builds
    "max"           —        —        —        ✓       ✓         max      −inf       nn.MaxPool{d}d
    "avg"           —        —        —        ✓       ✓         avg      0          nn.AvgPool{d}d
    "soft"          —        fixed    v / τ    ✓       ✓         —        own rule   SoftPool{d}d
    "soft-learned"  log τ    learned  v / τ_c  ✓       ✓         —        own rule   SoftPool{d}d
    "attention"     w, V     fixed    s / τ    ✓       ✓         —        own rule   AttentionGatePool{d}d
    "conv"          mixing   —        —        —       —         —        own rule   GatedPool{d}d

Every pool reads it: :class:`~gatepool.layers.gated_pool.GatedPoolNd` pools a window with the method the
row names (``function``), :class:`~gatepool.layers.gate_parameters.GateParameters` makes the learned
parts the row asks for, the global and adaptive pools offer the gates that have those forms,
``create_pool``, ``convert`` and ``gatepool convert-check --gates`` take the names in the table.
``GATES`` and the other gate sets (``GLOBAL_GATES``, ``ADAPTIVE_GATES``, ``SAME_FILL``, …) are views of it.

Adding a gate is one row here and its gate function: a method of ``GatedPoolNd``,
``(x (N, C, *spatial), geo) -> (out (N, C, *out), torch's indices or None, weights or None)``. Its global
form is that function over one window of every position; an adaptive form is offered to torch's gates and
to the softmax gates, whose windows the adaptive pool gathers itself. A gate with new kinds of learned
parts adds them in ``gate_parameters`` too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

__all__ = ["TABLE", "Gate", "names", "row", "taking", "which"]


@dataclass(frozen=True)
class Gate:
    """One gate: what it takes, what it learns, which pools have it and how they compute it."""

    name: str
    function: str  # the GatedPoolNd method that pools the windows: "_soft" -> GatedPoolNd._soft
    weights: bool = False  # learned parts per channel: the pools need channels=C
    temperature: bool = False  # takes τ > 0 (the start value when learned)
    learned_temperature: bool = False  # one τ per channel, learned as log τ
    softmax: bool = False  # g = softmax(s / τ) over the window, s the values or the scores
    scored: bool = False  # s_j = x_j · w and values V x_j: the score and value projections
    positional: bool = False  # g set by the position in a fixed window: the mixing weights
    global_form: bool = True  # a gate over the whole map (GlobalGatedPool{d}d)
    adaptive_form: bool = True  # a gate over torch's adaptive windows (AdaptiveGatedPool{d}d)
    torch: str | None = None  # "max" / "avg": torch's own pool computes it (nn.MaxPool{d}d, …)
    torch_kwargs: frozenset[str] = frozenset()  # what torch's module takes beyond kernel, stride, padding
    same_fill: float | None = None  # "SAME" padding: the fill torch's pool pads with; None: the gate's rule
    layer: str = "GatedPool"  # the class create_pool builds: GatedPool, SoftPool or AttentionGatePool {d}d

    def __post_init__(self) -> None:
        parts = self.learned_temperature or self.scored or self.positional
        checks = (
            (self.weights == parts, "weights: the learned parts are log τ, score and value, or the mixing"),
            (not self.learned_temperature or self.temperature, "learned_temperature needs temperature"),
            (not self.scored or self.softmax, "scored needs softmax (the scores' softmax)"),
            (not self.positional or not (self.global_form or self.adaptive_form),
             "positional gates have no global or adaptive form (those windows have no fixed positions)"),
            (not self.adaptive_form or self.torch is not None or self.softmax,
             "adaptive_form needs torch's pool or a softmax gate (the adaptive pool's two ways)"),
            (self.torch is not None or not (self.torch_kwargs or self.same_fill is not None),
             "torch_kwargs and same_fill are for the gates torch's pools compute"),
        )  # fmt: skip
        for ok, why in checks:
            if not ok:
                raise ValueError(f"gate row {self.name!r}: {why}")

    def torch_module(self, dim: int, adaptive: bool = False) -> type[nn.Module]:
        """torch's module for this gate: ``nn.MaxPool{dim}d``, or ``nn.AdaptiveMaxPool{dim}d``."""
        return getattr(nn, f"{'Adaptive' * adaptive}{self.torch.capitalize()}Pool{dim}d")

    def torch_function(self, dim: int, adaptive: bool = False):
        """torch's function for this gate: ``F.max_pool{dim}d``, or ``F.adaptive_max_pool{dim}d``."""
        return getattr(F, f"{'adaptive_' * adaptive}{self.torch}_pool{dim}d")

    def no_form_hint(self, where: str) -> str:
        """Why a positional gate has no global / adaptive form, for a message ("" for the others)."""
        return f" ({self.name!r} weighs fixed window positions; {where})" if self.positional else ""


TABLE: dict[str, Gate] = {
    g.name: g
    for g in (
        Gate("max", "_max", torch="max", torch_kwargs=frozenset({"dilation", "return_indices", "ceil_mode"}),
             same_fill=float("-inf")),
        Gate("avg", "_avg", torch="avg", torch_kwargs=frozenset({"ceil_mode", "count_include_pad",
                                                                 "divisor_override"}), same_fill=0.0),
        Gate("soft", "_soft", temperature=True, softmax=True, layer="SoftPool"),
        Gate("soft-learned", "_soft", weights=True, temperature=True, learned_temperature=True, softmax=True,
             layer="SoftPool"),
        Gate("attention", "_attention", weights=True, temperature=True, softmax=True, scored=True,
             layer="AttentionGatePool"),
        Gate("conv", "_conv", weights=True, positional=True, global_form=False, adaptive_form=False),
    )
}  # fmt: skip


def row(name: str) -> Gate:
    """The row of the gate ``name`` (a KeyError for a name not in the table: check with :func:`names`)."""
    return TABLE[name]


def names(**having) -> tuple[str, ...]:
    """The gates in table order, those whose fields equal ``having``: ``names(global_form=True)``."""
    return tuple(n for n, g in TABLE.items() if all(getattr(g, k) == v for k, v in having.items()))


def taking(option: str) -> tuple[str, ...]:
    """The gates whose pool takes the torch argument ``option`` (``"count_include_pad"``: ``("avg",)``)."""
    return tuple(n for n, g in TABLE.items() if option in g.torch_kwargs)


def which(option: str) -> str:
    """``"gate='avg'"``: the gates that take ``option``, as a message names them."""
    return " or ".join(f"gate={n!r}" for n in taking(option))
