"""GlobalGatedPool1d/2d/3d: a gate over the whole map, the gated form of the global average pool.

A global pool is one window that holds every position of a channel's map, v_1 … v_L (L = H·W):

    out_c = Σ_j g_j · v_{c,j}

    gate            g over the map                                        parameters
    "max"           hardmax(v): one-hot at the largest                      —
    "avg"           1/L: ``nn.AdaptiveAvgPool2d(1)``                        —
    "soft"          softmax(v / τ), τ fixed (τ = 1 is SoftPool)             —
    "soft-learned"  softmax(v / τ_c), one τ per channel, learned            log τ  (C,), starts at log τ₀
    "attention"     softmax(s / τ), s_j = x_j · w; values v_j = V x_j       score w (1×C), value V (C×C)

These are :mod:`gatepool.layers.gated_pool`'s gates with the window grown to the input's spatial size,
whatever it is at each call (so the "conv" gate, whose weights are set by position in a fixed window,
has no global form). The parameters have the names, shapes and start values of ``GatedPool{dim}d``'s:
"attention" starts as soft pooling of a random score (V = I, w ~ N(0, 1/C)). It is not
:class:`gatepool.layers.attention_pool.AttentionPoolLatent`, whose learned query attends over the tokens
and returns ``(B, D)``; this layer is a drop-in for ``nn.AdaptiveAvgPool{dim}d(1)``: ``(N, C, *spatial)
-> (N, C, 1, …, 1)``, or ``(N, C)`` with ``flatten=True`` (timm's ``FastAdaptiveAvgPool(flatten=True)``).

The soft family runs the library's paths (the fused kernel where it can be built: float16 / bfloat16 go
into it as they are, "attention" scores and projects inside it) over one window of L taps; "max" and "avg"
are torch's ``F.adaptive_max_pool{dim}d`` / ``F.adaptive_avg_pool{dim}d(x, 1)``,
in the input's dtype (so "avg" equals the global average pool it replaces, bit for bit).
"""

from __future__ import annotations

import torch

from gatepool.layers import fused_pool, gate_table
from gatepool.layers.gate_parameters import GateParameters
from gatepool.layers.gated_pool import GatedPoolNd
from gatepool.layers.softmax_paths import softmax_path
from gatepool.layers.windows import (
    compute_dtype,
    pool_geometry,
    scale_scores,
    softmax_pool_unfold,
)

GLOBAL_GATES = gate_table.names(global_form=True)  # not "conv": it sets its gates by position in a window

__all__ = ["GLOBAL_GATES", "GlobalGatedPool1d", "GlobalGatedPool2d", "GlobalGatedPool3d", "GlobalGatedPoolNd"]


class GlobalGatedPoolNd(GateParameters):
    """A gate over the whole spatial extent in ``dim`` dimensions (use GlobalGatedPool1d / 2d / 3d).

    Args:
        gate: one of ``"max", "avg", "soft", "soft-learned", "attention"``.
        channels: C; required by the gates with weights ("soft-learned", "attention").
        temperature: τ > 0 of the soft gates (the start value for "soft-learned"); 1.0 for "max", "avg".
        flatten: return ``(N, C)`` instead of ``(N, C, 1, …, 1)``.
    """

    dim: int = 2
    return_weights = False  # read by the windowed gate functions: a global pool returns its output only

    def __init__(
        self,
        gate: str,
        *,
        channels: int | None = None,
        temperature: float = 1.0,
        flatten: bool = False,
    ) -> None:
        super().__init__()
        if gate not in gate_table.names(global_form=True):
            known = gate in gate_table.names()
            hint = gate_table.row(gate).no_form_hint("a global window has none") if known else ""
            raise ValueError(f"gate={gate!r} has no global form{hint}; choose one of "
                             f"{list(gate_table.names(global_form=True))}")
        self.init_gate(gate, channels, temperature)
        self.flatten = bool(flatten)

    def extra_repr(self) -> str:
        s = f"gate={self.gate!r}" + self.gate_repr()
        if self.flatten:
            s += ", flatten=True"
        return s

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """``(N, C, *spatial) -> (N, C, 1, …, 1)`` (``(N, C)`` with flatten); unbatched ``(C, *spatial)``."""
        d = self.dim
        if not isinstance(input, torch.Tensor) or input.dim() not in (d + 1, d + 2):
            shape = tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            raise ValueError(f"input must be {d + 2}-D (N, C, *spatial) or {d + 1}-D (C, *spatial), got "
                             f"{shape}")
        batched = input.dim() == d + 2
        xb = input if batched else input.unsqueeze(0)  # (N, C, *spatial)
        n, c = xb.shape[:2]
        if self.channels is not None and c != self.channels:
            raise ValueError(f"input has {c} channels; this pool was built for channels={self.channels}")
        row = gate_table.row(self.gate)
        if row.torch:  # torch's own, in the input's dtype: (N, C, 1, …, 1)
            out = row.torch_function(d, adaptive=True)(xb, 1)
            out = out.view(n, c) if self.flatten else out
            return out if batched else out.squeeze(0)
        path = softmax_path(xb, scored=row.scored, windows="global")
        # one window of every position: the fused kernels read float16 / bfloat16 as they are (float32 inside,
        # nothing full-size copied); the other paths compute in float32
        x = xb if path.fused else xb.to(compute_dtype(xb.dtype))
        values = x.flatten(2)  # (N, C, L): the whole map is one window
        geo = pool_geometry(values, 1, values.shape[-1])  # one window of L taps, out (N, C, 1)
        if path.name == "one-window":
            # Off the CPU, one softmax over the L taps: the windowed GPU kernel unrolls its taps at compile
            # time and gathers over them in the backward, which a window of thousands of taps must not do.
            scores = self.scores(x).flatten(2) if row.scored else None  # (N, 1, L)
            tau = self.fixed_temperature if row.scored else self.temperature  # float or (C,)
            tau = tau.to(values.dtype) if isinstance(tau, torch.Tensor) else tau
            out = one_window(values, scores, tau)
            out = self.project(out) if row.scored else out  # V · Σ_j g_j x_j: C×C once, not at every position
        elif row.scored and path.fused:  # the scores w · x_j in the kernel, V after it (inside, where eager)
            w, v = self.score.weight, self.value.weight
            out = fused_pool.softmax_pool(values, w, self.fixed_temperature, geo, projection=v)
        elif row.scored:
            scores = scale_scores(self.scores(x).flatten(2), self.fixed_temperature)  # (N, 1, L)
            out = self.project(softmax_pool_unfold(values, scores, geo)[0])
        else:  # the gate's windowed function over the one window ("soft": soft_pool_windows)
            out = getattr(GatedPoolNd, row.function)(self, values, geo)[0]
        # (N, C, 1); a copy: the fused op's output may be a view made inside its autograd Function, and a
        # block that changes our output in place (EfficientNet's head: an in-place dropout) must be able to
        out = out.to(input.dtype, copy=True)
        out = out.view(n, c) if self.flatten else out.view(n, c, *([1] * d))
        return out if batched else out.squeeze(0)


def one_window(values: torch.Tensor, scores: torch.Tensor | None, tau: float | torch.Tensor) -> torch.Tensor:
    """``Σ_j softmax(s/τ)_j v_j`` over the last axis, by autograd: ``(N, C, L) -> (N, C, 1)``.

    ``scores`` None (s = v) or ``(N, 1, L)``; ``tau`` a float or ``(C,)``.
    """
    t = tau.view(1, -1, 1) if isinstance(tau, torch.Tensor) else tau
    gate = torch.softmax((values if scores is None else scores) / t, dim=-1)  # (N, C or 1, L)
    return (gate * values).sum(-1, keepdim=True)


class GlobalGatedPool1d(GlobalGatedPoolNd):
    """A gate over the whole of ``(N, C, L)`` or ``(C, L)``; see :class:`GlobalGatedPoolNd`."""

    dim = 1


class GlobalGatedPool2d(GlobalGatedPoolNd):
    """A gate over the whole of ``(N, C, H, W)`` or ``(C, H, W)``; see :class:`GlobalGatedPoolNd`."""

    dim = 2


class GlobalGatedPool3d(GlobalGatedPoolNd):
    """A gate over the whole of ``(N, C, D, H, W)`` or ``(C, D, H, W)``; see :class:`GlobalGatedPoolNd`."""

    dim = 3
