"""GatedPool1d/2d/3d: one pooling layer, six gates; SoftPool and AttentionGatePool name the common ones.

Every pooling is a gated sum over a window of values v_1 … v_n; the kinds differ only in who sets g:

    out = Σ_j g_j · v_j

    gate            g over a window                                       parameters
    "max"           hardmax(v): one-hot at the largest                      —
    "avg"           1/n (n as torch's ``count_include_pad``)                —
    "soft"          softmax(v / τ), τ fixed (τ = 1 is SoftPool)             —
    "soft-learned"  softmax(v / τ_c), one τ per channel, learned            log τ  (C,), starts at log τ₀
    "attention"     softmax(s / τ), s_j = x_j · w; values v_j = V x_j       score w (1×C), value V (C×C)
    "conv"          w_{c,j}: set by position j, not by content              mixing (C, 1, *kernel_size)

For the soft gates out = V · softmax(V/τ) and ∂out/∂v_j = g_j (1 + (v_j − out)/τ): every input in the
window gets a gradient, where max gives it to one input only. "attention" scores each position by a
learned 1×1 projection of its channel vector x_j (one score per position, shared by the channels) and
pools a learned 1×1 value projection, computed as V · Σ_j g_j x_j (the gates sum to 1: the projection
runs on the pooled map, see :mod:`gatepool.layers.gate_parameters`); it starts with V = I and
w ~ N(0, 1/C), so at init it is soft pooling with a random score (it is not
:class:`gatepool.layers.attention_pool`'s learned-query pooling).
"conv" is a depthwise conv with stride s and dilation d: its gates are its weights, the same for every
input; it starts at w = 1/K, i.e. as average pooling, and is free to learn any position weights.
What each gate is and has is its row in :mod:`gatepool.layers.gate_table`, which also names the method
here that pools its windows (``_max``, ``_avg``, ``_soft``, ``_attention``, ``_conv``).

The arguments are torch's, in torch's order: ``GatedPool2d(3, 2, 1)`` pools as ``nn.MaxPool2d(3, 2, 1)``
does, and the gate is a keyword. "max" and "avg" run torch's own kernels (``F.max_pool*d``,
``F.avg_pool*d``) in the input's dtype and equal ``nn.MaxPool*d`` / ``nn.AvgPool*d`` exactly; "max" takes
``return_indices`` (torch's indices, for ``nn.MaxUnpool*d``), "avg" takes ``count_include_pad`` (torch's
default True) and a ``dilation``, which torch's average pool lacks (computed here: the window sum over
the same divisor). The other gates compute in float32 (float64 stays float64; the softmax gates read
float16 / bfloat16 as they are where a fused kernel, C or Triton, runs them) and return the input dtype.

Padding: for the soft family ("soft", "soft-learned", "attention") padded taps get gate 0, always (for max
this is torch's −inf padding); for "conv" padded zeros add nothing. Non-finite inputs: see
:mod:`gatepool.layers.soft_pool` (the soft family takes max pooling's limits: +inf in a window gives +inf).

``return_weights=True``: ``forward`` also returns the mixing weights ``(N, C, *out_spatial, K)``,
K = ∏ kernel_size, window positions row-major (``(C, *out_spatial, K)`` unbatched); with
``return_indices`` too, it returns ``(out, indices, weights)``.
  "max": one-hot at torch's index;  "avg": 1/n at the counted positions;  "soft", "soft-learned":
  softmax(v/τ);  "attention": the score softmax, the same for every channel;  "conv": the weights,
  input-independent (every input in the window gets a gradient).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from gatepool.layers import fused_pool, gate_table
from gatepool.layers.c_kernels import eager_op
from gatepool.layers.gate_parameters import GATES_WITH_TEMPERATURE, GATES_WITH_WEIGHTS, GateParameters
from gatepool.layers.soft_pool import soft_pool_windows
from gatepool.layers.softmax_paths import input_dtype, softmax_path
from gatepool.layers.windows import (
    IntOrTuple,
    PoolGeometry,
    as_dtype,
    check_window_args,
    compute_dtype,
    like_input_format,
    pool_geometry,
    scale_scores,
    softmax_pool_unfold,
    temperature_tensor,
    unfold_windows,
    window_mask,
)

GATES = gate_table.names()  # ("max", "avg", "soft", "soft-learned", "attention", "conv")
TORCH_GATES = tuple(n for n in GATES if gate_table.row(n).torch)  # ("max", "avg"): torch's kernels

__all__ = [
    "GATES",
    "GATES_WITH_TEMPERATURE",
    "GATES_WITH_WEIGHTS",
    "AttentionGatePool1d",
    "AttentionGatePool2d",
    "AttentionGatePool3d",
    "AttentionGatePoolNd",
    "GatedPool1d",
    "GatedPool2d",
    "GatedPool3d",
    "GatedPoolNd",
    "SoftPool1d",
    "SoftPool2d",
    "SoftPool3d",
    "SoftPoolNd",
]

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_CONV_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class GatedPoolNd(GateParameters):
    """Gated pooling in ``dim`` spatial dimensions (use GatedPool1d / 2d / 3d).

    Args:
        kernel_size, stride, padding, dilation, ceil_mode: as torch's pools (stride None = kernel_size,
            0 ≤ padding ≤ kernel_size/2), in torch's order.
        return_indices: "max" only: also return torch's indices (for ``nn.MaxUnpool*d``).
        gate: keyword, required: one of ``"max", "avg", "soft", "soft-learned", "attention", "conv"``.
        channels: C; required by the gates with weights ("soft-learned", "attention", "conv").
        temperature: τ > 0 of the soft gates (the start value for "soft-learned"); must stay 1.0
            for "max", "avg", "conv", which have none.
        count_include_pad: "avg" only, as torch (True: the divisor counts padded positions); the soft
            family always gives padded taps gate 0.
        return_weights: forward also returns the mixing weights ``(N, C, *out_spatial, K)``.
    """

    dim: int = 2

    def __init__(
        self,
        kernel_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        padding: IntOrTuple = 0,
        dilation: IntOrTuple = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
        *,
        gate: str,
        channels: int | None = None,
        temperature: float = 1.0,
        count_include_pad: bool = True,
        return_weights: bool = False,
    ) -> None:
        super().__init__()
        if gate not in gate_table.names():
            raise ValueError(f"gate={gate!r} is unknown; choose one of {list(gate_table.names())}")
        takes = gate_table.row(gate).torch_kwargs  # torch's gates take torch's options
        if return_indices and "return_indices" not in takes:
            raise ValueError(
                f"return_indices applies to {gate_table.which('return_indices')} only; got gate={gate!r}"
            )
        if not count_include_pad and "count_include_pad" not in takes:
            raise ValueError(
                f"count_include_pad applies to {gate_table.which('count_include_pad')} only (the soft family "
                f"always gives padded taps gate 0); gate={gate!r} needs count_include_pad=True"
            )
        self.kernel_size, self.stride, self.padding, self.dilation = check_window_args(
            kernel_size, stride, padding, dilation, self.dim
        )
        self.init_gate(gate, channels, temperature, self.kernel_size)
        self.return_indices = bool(return_indices)
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        self.return_weights = bool(return_weights)

    @classmethod
    def _create(cls, gate: str, kernel_size, stride, padding, *, channels: int | None, **kwargs):
        """``create_pool``'s call of this class for ``gate`` (its row's ``layer``)."""
        return cls(kernel_size, stride, padding, gate=gate, channels=channels, **kwargs)

    def extra_repr(self) -> str:
        s = f"gate={self.gate!r}, kernel_size={self.kernel_size}, stride={self.stride}"
        s += f", padding={self.padding}"
        if max(self.dilation) > 1:
            s += f", dilation={self.dilation}"
        for flag in ("return_indices", "ceil_mode", "return_weights"):
            if getattr(self, flag):
                s += f", {flag}=True"
        if not self.count_include_pad:
            s += ", count_include_pad=False"
        return s + self.gate_repr()

    def __setattr__(self, name: str, value) -> None:
        self.__dict__.pop("_eager_route", None)  # a setting may change: the next call works its route out
        super().__setattr__(name, value)

    def forward(self, input: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """``(N, C, *spatial) -> (N, C, *out)``; then the indices and the weights, if asked for.

        A softmax gate whose call the full path would give the eager C++ operator as it is (``_route``)
        makes that call straight away: the window geometry and the path are worked out once per input
        shape and dtype, as the kernels' launch arguments (issue 44).
        """
        geo = None
        if not torch.compiler.is_compiling() and isinstance(input, torch.Tensor):  # (traced: the op)
            key = (input.shape, input.dtype)
            route = self.__dict__.get("_eager_route")
            if route is None or route.key != key:
                geo = self._geometry(input)
                route = self._route(input, key, geo)
            out = None if route is None else self._eager(input, route)
            if out is not None:
                return out
        return self._pool(input, self._geometry(input) if geo is None else geo)

    def _geometry(self, x: torch.Tensor) -> PoolGeometry:
        window = (self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        return pool_geometry(x, self.dim, *window)

    def _route(self, x: torch.Tensor, key: tuple, geo: PoolGeometry) -> _EagerRoute | None:
        """How ``forward`` takes inputs of ``x``'s shape and dtype (kept until a setting changes): straight to
        the eager operator where the full path would give it the input as it is and return its output as
        it is (a softmax gate, no weights asked for, a batched float32/float64 input on the fused path, no
        window of attention's that reads no input); else the full path (which asks the path chooser
        again, once a shape). None, and nothing kept, where this call could not take the operator."""
        if self.channels is not None and x.shape[-self.dim - 1] != self.channels:
            return None  # the full path says what is wrong
        row = gate_table.row(self.gate)
        fused = row.softmax and softmax_path(x, return_weights=self.return_weights).fused
        empty = row.scored and geo.has_empty_windows  # attention masks those outside the operator
        route = _EagerRoute(key, None, None)  # the full path
        if fused and not empty and geo.batched and x.dtype in _ROUTE_DTYPES:
            tau = temperature_tensor(self.fixed_temperature, x)
            if not fused_pool.eager(x, None, tau):
                return None
            route = _EagerRoute(key, fused_pool.encode(geo), tau)
        self.__dict__["_eager_route"] = route
        return route

    def _eager(self, x: torch.Tensor, route: _EagerRoute) -> torch.Tensor | None:
        """``forward(x)`` by ``route``: the eager operator's call the full path makes, the parameters as they
        are (it takes each in its compute dtype); None where this call must take the full path (no route
        for this shape, or a mode, a transform or a tensor subclass: ``fused_pool.eager``)."""
        if route.geometry is None or not fused_pool.usable(x):
            return None
        scores, tau, projection, log_tau = None, route.tau, None, False
        if self.gate == "attention":
            scores, projection = self.score.weight, self.value.weight
        elif self.gate == "soft-learned":
            tau, log_tau = self.log_temperature, True
        if not fused_pool.eager(x, scores, tau, projection):
            return None
        if scores is None and not log_tau:
            return eager_op()(x, None, tau, route.geometry)
        return eager_op()(x, scores, tau, route.geometry, projection, log_tau)

    def _pool(self, input: torch.Tensor, geo: PoolGeometry) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """``forward`` on the windows ``geo`` says (``PoolSame`` gives its own, with asymmetric padding)."""
        d = self.dim
        if self.channels is not None and input.shape[-d - 1] != self.channels:
            raise ValueError(
                f"input has {input.shape[-d - 1]} channels; this pool was built for channels={self.channels}"
            )
        xb = input if geo.batched else input.unsqueeze(0)  # (N, C, *spatial)
        row = gate_table.row(self.gate)
        # torch's gates in the input's dtype; the softmax gates in their path's (softmax_paths.input_dtype)
        dtype = input_dtype(xb, self.return_weights) if row.softmax else compute_dtype(input.dtype)
        x = xb if row.torch else as_dtype(xb, dtype)
        out, indices, weights = getattr(self, row.function)(x, geo)  # the gate's own function
        out = as_dtype(like_input_format(out, xb), input.dtype)
        results = [out]
        if self.return_indices:
            results.append(indices)
        if self.return_weights:
            results.append(weights.expand(*out.shape, geo.window_size).to(input.dtype))
        if not geo.batched:
            results = [r.squeeze(0) for r in results]
        return results[0] if len(results) == 1 else tuple(results)

    # Each gate's function (its row in gatepool.layers.gates names it): (N, C, *spatial) -> out (N, C, *out),
    # torch's indices or None, and the weights (broadcastable to (N, C, *out, K)) when self.return_weights,
    # else None.

    def _max(self, x: torch.Tensor, geo: PoolGeometry):
        need_indices = self.return_indices or self.return_weights
        args = (geo.kernel_size, geo.stride, geo.padding, geo.dilation)
        res = _MAX_POOL[self.dim](x, *args, ceil_mode=geo.ceil_mode, return_indices=need_indices)
        if not need_indices:
            return res, None, None
        out, indices = res  # indices: flat positions in the input plane, (N, C, *out)
        weights = None
        if self.return_weights:  # one-hot at torch's own choice (ties and NaN as torch breaks them)
            plane = torch.arange(math.prod(geo.in_size), device=x.device).view(1, 1, *geo.in_size)
            taps = unfold_windows(plane, geo, fill=-1)  # (1, 1, *out, K): the input position of each tap
            weights = (taps == indices.unsqueeze(-1)).to(x.dtype)
        return out, indices, weights

    def _avg(self, x: torch.Tensor, geo: PoolGeometry):
        counted = None
        if max(geo.dilation) == 1:
            args = (geo.kernel_size, geo.stride, geo.padding)
            out = _AVG_POOL[self.dim](
                x, *args, ceil_mode=geo.ceil_mode, count_include_pad=self.count_include_pad
            )
        else:  # torch's avg_pool has no dilation: the window sum over torch's divisor, rounded once
            counted = _counted_taps(geo, self.count_include_pad, x.device, compute_dtype(x.dtype))
            total = unfold_windows(x, geo, fill=0.0).sum(-1, dtype=counted.dtype)  # (N, C, *out)
            out = (total / counted.sum(-1)).to(x.dtype)
        if not self.return_weights:
            return out, None, None
        if counted is None:
            counted = _counted_taps(geo, self.count_include_pad, x.device, compute_dtype(x.dtype))
        return out, None, counted / counted.sum(-1, keepdim=True)  # (*out, K): 1/n at counted taps

    def _soft(self, x: torch.Tensor, geo: PoolGeometry):
        if gate_table.row(self.gate).learned_temperature:  # log τ (C,): τ_c = exp(log τ_c), on the path
            tau = as_dtype(self.log_temperature, compute_dtype(x.dtype))
            out, weights = soft_pool_windows(x, geo, tau, self.return_weights, log_temperature=True)
        else:
            out, weights = soft_pool_windows(x, geo, self.fixed_temperature, self.return_weights)
        return out, None, weights

    def _attention(self, x: torch.Tensor, geo: PoolGeometry):
        path = softmax_path(x, scored=True, return_weights=self.return_weights)
        if path.fused and not geo.has_empty_windows:  # one pass: the scores w · x_j, softmax, sum; then V ·
            w, v = self.score.weight, self.value.weight  # as they are: the eager operator projects inside
            return fused_pool.softmax_pool(x, w, self.fixed_temperature, geo, projection=v), None, None
        if path.fused:  # one pass: the scores w · x_j, softmax, sum
            pooled = fused_pool.softmax_pool(x, self.score.weight.view(-1), self.fixed_temperature, geo)
            weights = None
        else:
            scores = scale_scores(self.scores(x), self.fixed_temperature)  # (N, 1, *spatial)
            pooled, weights = softmax_pool_unfold(x, scores, geo)
        # V · Σ_j g_j x_j = Σ_j g_j V x_j (the gates sum to 1); weights (N, 1, *out, K)
        if not geo.has_empty_windows:  # decided from the sizes (only dilated windows can miss the input)
            return self.project(pooled), None, weights
        empty = ~window_mask(geo, x.device).any(-1)  # (*out): the gates sum to 0 there, out is −inf
        out = self.project(pooled.masked_fill(empty, 0.0)).masked_fill(empty, -math.inf)
        return out, None, weights

    def _conv(self, x: torch.Tensor, geo: PoolGeometry):
        pads: list[int] = []
        for p, r in zip(reversed(geo.padding), reversed(geo.pad_right)):
            pads += [p, r]
        xp = F.pad(x, pads) if any(pads) else x  # zeros: padded positions add nothing
        w = self.mixing.to(x.dtype)  # (C, 1, *kernel_size)
        out = _CONV_FN[self.dim](xp, w, stride=geo.stride, dilation=geo.dilation, groups=x.shape[1])
        if not self.return_weights:
            return out, None, None
        weights = w.reshape(1, w.shape[0], *([1] * geo.dim), geo.window_size)  # (1, C, 1…, K)
        mask = window_mask(geo, x.device)
        return out, None, (weights if mask is None else weights * mask)


_ROUTE_DTYPES = (torch.float32, torch.float64)  # computed as they are (attention's float16 output is cast)


class _EagerRoute(NamedTuple):
    """``GatedPoolNd.forward``'s way for inputs of one shape and dtype (``key``): the eager operator's call,
    its geometry (``fused_pool.encode``) and fixed τ (``temperature_tensor``) made once; geometry None:
    the full path. Setting any attribute of the pool drops it."""

    key: tuple[torch.Size, torch.dtype]
    geometry: list[int] | None
    tau: torch.Tensor | None


def _counted_taps(geo: PoolGeometry, include_pad: bool, device, dtype) -> torch.Tensor:
    """``(*out, K)``: 1 at the taps torch's average pool counts in its divisor, else 0.

    ``count_include_pad``: the taps inside the padded input ``[−p, n + p)`` (not the overhang of a
    ceil_mode window); otherwise the taps inside the input.
    """
    if include_pad:
        padded = tuple(n + 2 * p for n, p in zip(geo.in_size, geo.padding))
        geo = dataclasses.replace(geo, in_size=padded, padding=(0,) * geo.dim)
    ones = torch.ones((1, 1, *geo.in_size), dtype=dtype, device=device)
    return unfold_windows(ones, geo, fill=0.0)[0, 0]


class GatedPool1d(GatedPoolNd):
    """Gated pooling over ``(N, C, L)`` or ``(C, L)``; see :class:`GatedPoolNd`."""

    dim = 1


class GatedPool2d(GatedPoolNd):
    """Gated pooling over ``(N, C, H, W)`` or ``(C, H, W)``; see :class:`GatedPoolNd`."""

    dim = 2


class GatedPool3d(GatedPoolNd):
    """Gated pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``; see :class:`GatedPoolNd`."""

    dim = 3


class SoftPoolNd(GatedPoolNd):
    """Soft pooling, ``out = V · softmax(V/τ)`` per window (use SoftPool1d / 2d / 3d).

    ``learn_temperature=True`` learns one τ per channel (the "soft-learned" gate, log-parametrized,
    starting at ``temperature``; needs ``channels``). Padded taps get gate 0. See :class:`GatedPoolNd`.
    """

    def __init__(
        self,
        kernel_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        padding: IntOrTuple = 0,
        dilation: IntOrTuple = 1,
        ceil_mode: bool = False,
        *,
        temperature: float = 1.0,
        learn_temperature: bool = False,
        channels: int | None = None,
        return_weights: bool = False,
    ) -> None:
        if learn_temperature and channels is None:
            raise ValueError("learn_temperature=True learns one τ per channel: pass channels=C (an int ≥ 1)")
        super().__init__(
            kernel_size, stride, padding, dilation, False, ceil_mode,
            gate="soft-learned" if learn_temperature else "soft",
            channels=channels, temperature=temperature, return_weights=return_weights,
        )

    @classmethod
    def _create(cls, gate: str, kernel_size, stride, padding, *, channels: int | None, **kwargs):
        learned = gate_table.row(gate).learned_temperature
        return cls(kernel_size, stride, padding, learn_temperature=learned, channels=channels, **kwargs)


class SoftPool1d(SoftPoolNd, GatedPool1d):
    """Soft pooling over ``(N, C, L)`` or ``(C, L)``; see :class:`SoftPoolNd`."""


class SoftPool2d(SoftPoolNd, GatedPool2d):
    """Soft pooling over ``(N, C, H, W)`` or ``(C, H, W)``; see :class:`SoftPoolNd`."""


class SoftPool3d(SoftPoolNd, GatedPool3d):
    """Soft pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``; see :class:`SoftPoolNd`."""


class AttentionGatePoolNd(GatedPoolNd):
    """The window attention gate: ``out = Σ_j softmax(s/τ)_j · V x_j``, ``s_j = x_j · w`` (use 1d / 2d / 3d).

    One learned score per position (shared by the channels) and a learned 1×1 value projection; it
    starts as soft pooling of a random score (V = I). Not the learned-query attention pooling of
    :mod:`gatepool.layers.attention_pool`. Padded taps get gate 0. See :class:`GatedPoolNd`.
    """

    def __init__(
        self,
        kernel_size: IntOrTuple,
        stride: IntOrTuple | None = None,
        padding: IntOrTuple = 0,
        dilation: IntOrTuple = 1,
        ceil_mode: bool = False,
        *,
        channels: int,
        temperature: float = 1.0,
        return_weights: bool = False,
    ) -> None:
        super().__init__(
            kernel_size, stride, padding, dilation, False, ceil_mode,
            gate="attention", channels=channels, temperature=temperature, return_weights=return_weights,
        )

    @classmethod
    def _create(cls, gate: str, kernel_size, stride, padding, *, channels: int | None, **kwargs):
        return cls(kernel_size, stride, padding, channels=channels, **kwargs)


class AttentionGatePool1d(AttentionGatePoolNd, GatedPool1d):
    """The attention gate over ``(N, C, L)`` or ``(C, L)``; see :class:`AttentionGatePoolNd`."""


class AttentionGatePool2d(AttentionGatePoolNd, GatedPool2d):
    """The attention gate over ``(N, C, H, W)`` or ``(C, H, W)``; see :class:`AttentionGatePoolNd`."""


class AttentionGatePool3d(AttentionGatePoolNd, GatedPool3d):
    """The attention gate over ``(N, C, D, H, W)`` or ``(C, D, H, W)``; see :class:`AttentionGatePoolNd`."""
