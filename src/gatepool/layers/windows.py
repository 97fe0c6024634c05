"""Pooling windows as torch's pools define them, and the plain softmax pool over them.

The geometry (``pool_geometry``: kernel, stride, padding, dilation, ceil_mode checked and the output size
computed as torch does), the window operations (unfold to ``(N, C, *out, K)``, the padding mask, a
softmax that takes max pooling's limits, the weighted sum) and the plain path built from them,
``softmax_pool_unfold`` / ``soft_pool_unfold``: the reference every faster path is tested against; and the
attention gate's value projection after the pool, ``project``.
See :mod:`gatepool.layers.soft_pool` for the equations and the limits.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IntOrTuple = int | tuple[int, ...]

_CONV_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

__all__ = [
    "IntOrTuple",
    "PoolGeometry",
    "channel_view",
    "check_temperature",
    "check_window_args",
    "compute_dtype",
    "inverse_temperature",
    "like_input_format",
    "pool_geometry",
    "project",
    "scale_scores",
    "soft_pool_unfold",
    "softmax_pool_unfold",
    "temperature_tensor",
    "unfold_windows",
    "weighted_sum",
    "window_mask",
    "window_softmax",
]


# --------------------------------------------------------------------------------------------------
# Arguments and window geometry


def to_tuple(value: IntOrTuple, dim: int, name: str) -> tuple[int, ...]:
    """``2 -> (2, 2)``; a tuple has ``dim`` ints, or one (repeated, as torch). Raises naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a tuple of {dim} ints, got {value!r}")
    if isinstance(value, int):
        return (value,) * dim
    if isinstance(value, (tuple, list)) and len(value) in (1, dim) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return tuple(value) * (dim // len(value))
    raise ValueError(f"{name} must be an int or a tuple of {dim} ints (or of one, repeated), got {value!r}")


def check_window_args(
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None,
    padding: IntOrTuple,
    dilation: IntOrTuple,
    dim: int,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Check kernel_size ≥ 1, stride ≥ 1 (None = kernel_size), 0 ≤ padding ≤ kernel_size/2, dilation ≥ 1."""
    k = to_tuple(kernel_size, dim, "kernel_size")
    if min(k) < 1:
        raise ValueError(f"kernel_size must be ≥ 1 in every dimension, got {kernel_size!r}")
    s = k if stride is None else to_tuple(stride, dim, "stride")
    if min(s) < 1:
        raise ValueError(f"stride must be ≥ 1 in every dimension (or None = kernel_size), got {stride!r}")
    p = to_tuple(padding, dim, "padding")
    if any(pi < 0 or 2 * pi > ki for pi, ki in zip(p, k)):
        half = [ki // 2 for ki in k]
        raise ValueError(f"padding must be in [0, kernel_size / 2] = [0, {half}], got {padding!r}")
    dl = to_tuple(dilation, dim, "dilation")
    if min(dl) < 1:
        raise ValueError(f"dilation must be ≥ 1 in every dimension, got {dilation!r}")
    return k, s, p, dl


def check_temperature(temperature: float | torch.Tensor, channels: int | None = None) -> None:
    """τ must be > 0 and not NaN: a positive float, or a tensor of shape () or (C,).

    A float is checked here (ValueError). A tensor's shape is checked here; its values by
    ``torch._assert_async``, which does not wait for the device: on the CPU it raises a RuntimeError at
    once, on CUDA the error surfaces at the next synchronization (as torch's own device-side checks do).
    """
    if isinstance(temperature, torch.Tensor):
        if temperature.dim() > 1 or (
            temperature.dim() == 1 and channels is not None and temperature.numel() not in (1, channels)
        ):
            raise ValueError(
                f"temperature must be a float or a tensor of shape () or (C,) = ({channels},), "
                f"got shape {tuple(temperature.shape)}"
            )
        torch._assert_async((temperature.detach() > 0).all(), TEMPERATURE_NOT_POSITIVE)
        return
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a positive float or a tensor, got {type(temperature).__name__}")
    if not temperature > 0:  # also catches NaN
        raise ValueError(f"temperature must be > 0 (τ in (0, ∞)), got {temperature}")


TEMPERATURE_NOT_POSITIVE = "temperature must be > 0 (and not NaN) in every channel"


def _out_len(size: int, k: int, s: int, p: int, dl: int, ceil_mode: bool) -> int:
    """torch's pooling output length: floor (or ceil) of (L + 2p − dl·(k − 1) − 1)/s + 1."""
    out = (size + 2 * p - dl * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside input or left pad
        out -= 1
    return out


class _derived:
    """``functools.cached_property`` without its lock (Python 3.11's, which ``torch.compile`` cannot enter):
    the value is worked out at the first read and kept in the instance's ``__dict__``, where later reads
    find it before this descriptor."""

    def __init__(self, fn) -> None:
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class PoolGeometry:
    """Where the windows of one pooling call lie (all tuples have one entry per spatial dimension).

    What is derived from the fields is worked out once per instance (:class:`_derived`): a pool's geometry
    is made once per shape (:func:`pool_geometry`) and asked again at every call.
    """

    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    batched: bool

    def __hash__(self) -> int:  # the kernels' caches ask it at every call: the fields' hash, once
        return self._hash

    @_derived
    def _hash(self) -> int:
        return hash((self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.in_size,
                     self.out_size, self.batched))  # fmt: skip

    @property
    def dim(self) -> int:
        return len(self.kernel_size)

    @_derived
    def window_size(self) -> int:  # K
        return math.prod(self.kernel_size)

    @_derived
    def span(self) -> tuple[int, ...]:
        """How far one window reaches: dl·(k − 1) + 1 positions."""
        return tuple(dl * (k - 1) + 1 for k, dl in zip(self.kernel_size, self.dilation))

    @_derived
    def pad_right(self) -> tuple[int, ...]:
        """Right padding that makes the last window fit (negative: trailing inputs no window reads)."""
        return tuple(
            (o - 1) * s + w - p - n
            for o, s, w, p, n in zip(self.out_size, self.stride, self.span, self.padding, self.in_size)
        )

    @_derived
    def has_padding(self) -> bool:
        """Does some window read a position outside the input?"""
        return any(self.padding) or any(r > 0 for r in self.pad_right)

    @_derived
    def has_empty_windows(self) -> bool:
        """Does some window read no input position at all (possible only with dilation and padding)?

        Decided from the sizes alone, on the host: a window is empty where it misses the input along one
        axis, and it misses along an axis when none of its k taps ``o·s − p + t·dl`` lies in ``[0, n)``.
        """
        if max(self.dilation) == 1 or not self.has_padding:
            return False
        return any(
            all(not 0 <= o * s - p + t * dl < n for t in range(k))
            for k, s, p, dl, n, out in zip(
                self.kernel_size, self.stride, self.padding, self.dilation, self.in_size, self.out_size
            )
            for o in range(out)
        )

    @_derived
    def tiles(self) -> bool:
        """Do the windows tile (a crop of) the input: stride = kernel, no dilation, nothing padded?"""
        return self.stride == self.kernel_size and max(self.dilation) == 1 and not self.has_padding


def pool_geometry(
    x: torch.Tensor,
    dim: int,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    ceil_mode: bool = False,
) -> PoolGeometry:
    """Validate a pooling call (input and window arguments) and return where its windows lie.

    The geometry of a shape and window arguments is computed once and kept (the arguments checked then):
    a pool called again on the same shape pays for the input checks only.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(x).__name__}")
    ndim = x.dim()
    if ndim not in (dim + 1, dim + 2):
        raise ValueError(
            f"input must be {dim + 2}-D (N, C, *spatial) or {dim + 1}-D (C, *spatial) for {dim}-D pooling, "
            f"got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"input must be a floating-point tensor, got {x.dtype}")
    shape = tuple(x.shape[-dim - 1 :])  # (C, *spatial)
    if min(shape) == 0:  # as torch: only the batch may be empty
        raise ValueError(
            f"input must have ≥ 1 channel and a non-zero spatial size (only the batch may be empty), "
            f"got shape {tuple(x.shape)}"
        )
    args = (kernel_size, stride, padding, dilation)
    if list in map(type, args):
        args = tuple(tuple(a) if isinstance(a, list) else a for a in args)
    # the cache only for ints (2.0 == 2 and True == 1 would find int arguments' entries): others are checked
    geometry = _geometry if _ints(args) else _geometry.__wrapped__
    return geometry(shape, ndim == dim + 2, *args, bool(ceil_mode))


_INT_TYPES = {int, type(None)}


def _ints(args: tuple) -> bool:
    """Is each of ``args`` None, an int or a tuple of ints (not bools, not floats)?"""
    return {type(v) for a in args for v in (a if type(a) is tuple else (a,))} <= _INT_TYPES


@functools.lru_cache(maxsize=1024)
def _geometry(
    shape: tuple[int, ...],
    batched: bool,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None,
    padding: IntOrTuple,
    dilation: IntOrTuple,
    ceil_mode: bool,
) -> PoolGeometry:
    """:func:`pool_geometry` of an input whose channels and spatial sizes are ``shape`` ``(C, *spatial)``."""
    dim = len(shape) - 1
    k, s, p, dl = check_window_args(kernel_size, stride, padding, dilation, dim)
    size = shape[1:]
    span = tuple(d * (ki - 1) + 1 for ki, d in zip(k, dl))
    if any(w > n + 2 * pi for w, n, pi in zip(span, size, p)):
        raise ValueError(
            f"kernel_size {k} with dilation {dl} spans {span}, larger than the padded input "
            f"{tuple(n + 2 * pi for n, pi in zip(size, p))}"
        )
    out = tuple(_out_len(n, ki, si, pi, d, ceil_mode) for n, ki, si, pi, d in zip(size, k, s, p, dl))
    return PoolGeometry(k, s, p, dl, ceil_mode, size, out, batched)


# --------------------------------------------------------------------------------------------------
# Windows: unfold, mask, softmax, memory format


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 / bfloat16 are computed in float32; float32 and float64 as they are."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``, without the dispatcher call where ``t`` has that dtype already (a call's cost on a
    small input)."""
    return t if t.dtype == dtype else t.to(dtype)


def unfold_windows(x: torch.Tensor, geo: PoolGeometry, fill: float = 0.0) -> torch.Tensor:
    """``(N, C, *spatial) -> (N, C, *out, K)``: every window as a row; padded positions hold ``fill``."""
    d = geo.dim
    pads: list[int] = []
    for p, r in zip(reversed(geo.padding), reversed(geo.pad_right)):
        pads += [p, r]  # F.pad wants the last dimension first; negative r crops
    if any(pads):
        x = F.pad(x, pads, value=fill)
    for i, (w, s, dl) in enumerate(zip(geo.span, geo.stride, geo.dilation)):
        x = x.unfold(2 + i, w, s)  # (N, C, *out, k_1, …, span_i)
        if dl > 1:
            x = x[..., ::dl]  # every dl-th position of the span: k_i taps
    return x.reshape(*x.shape[: 2 + d], geo.window_size)  # (N, C, *out, K)


def window_mask(geo: PoolGeometry, device: torch.device | str | None = None) -> torch.Tensor | None:
    """``(*out, K)`` bool, True where a window reads the input (False: padding); None if no padding."""
    if not geo.has_padding:
        return None
    ones = torch.ones((1, 1, *geo.in_size), device=device)
    return unfold_windows(ones, geo, fill=0.0)[0, 0] > 0  # (*out, K)


def window_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``softmax`` over the last axis (K) of ``scores`` ``(…, *out, K)``, with max pooling's limits.

    Taps where ``mask`` ``(*out, K)`` is False (padding) get 0. A window whose top score is ±inf shares
    its gate among the taps at the top (inf − inf would be NaN); a window with no input tap gets all 0;
    a NaN score makes its window's gates NaN. The max is subtracted first: no finite score overflows.
    """
    s = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).detach()  # the shift: softmax does not depend on it
    inf = m.isinf()  # (…, *out, 1): the top is +inf, or every input tap is −inf
    top = s == m if mask is None else (s == m) & mask
    at_top = torch.zeros_like(s).masked_fill_(~top, float("-inf"))  # the limit: hardmax over the top
    gates = torch.softmax(torch.where(inf, at_top, s - m.masked_fill(inf, 0.0)), dim=-1)
    if mask is not None:
        gates = gates.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # no input tap: no gate
    return gates


def weighted_sum(gates: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``Σ_j g_j v_j`` over the last axis; a tap with gate 0 adds nothing (not 0·inf = NaN).

    A window with no input tap (``mask`` all False) gives −inf, as torch's max pool.
    """
    out = (gates * values.masked_fill(gates == 0, 0.0)).sum(-1)
    if mask is not None:
        out = out.masked_fill(~mask.any(-1), float("-inf"))
    return out


def scale_scores(x: torch.Tensor, tau: float | torch.Tensor) -> torch.Tensor:
    """``x / τ``; ±inf stay as they are, so ∂/∂τ never meets inf · 0 (a learned τ stays finite)."""
    if not isinstance(tau, torch.Tensor):
        return x if tau == 1.0 else x / tau
    finite = x.isfinite()
    return torch.where(finite, x.masked_fill(~finite, 0.0) / tau, x)


_FIXED_TAU: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}
_INVERSE: dict[int, torch.Tensor] = {}  # id of a tensor in _FIXED_TAU -> its 1/τ (both kept alive there)


def temperature_tensor(tau: float, like: torch.Tensor) -> torch.Tensor:
    """A fixed τ as the ``(1,)`` tensor the kernels take, in ``like``'s compute dtype and device: made once
    per value, dtype and device (with its 1/τ, for :func:`inverse_temperature`), not at every call."""
    dtype = compute_dtype(like.dtype)  # float16 / bfloat16 values take τ in float32
    key = (tau, dtype, like.device)
    t = _FIXED_TAU.get(key)
    if t is None:
        if torch.compiler.is_compiling():  # a traced call makes its own (no cached constant in the graph)
            return like.new_full((1,), tau, dtype=dtype)
        with torch.inference_mode(False), torch.no_grad():  # usable by autograd, made under any mode
            t = torch.full((1,), tau, dtype=dtype, device=like.device)
            _INVERSE[id(t)] = 1.0 / t
        _FIXED_TAU[key] = t
    return t


def inverse_temperature(tau: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``a = 1/τ``, ``(1,)`` or ``(C,)`` in ``dtype``, for the kernels (kept for a fixed τ's tensor)."""
    a = _INVERSE.get(id(tau))
    if a is not None and a.dtype == dtype:
        return a
    tau = tau if tau.dtype == dtype else tau.to(dtype)
    return (tau if tau.dim() == 1 else tau.reshape(-1)).reciprocal()


def like_input_format(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Give ``out`` the memory format of ``x`` (channels_last in, channels_last out)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return out.contiguous(memory_format=torch.channels_last)
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return out.contiguous(memory_format=torch.channels_last_3d)
    return out


def project(pooled: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The attention gate's value projection: ``V · x`` at each position of ``pooled`` ``(N, C, *S)``, V given
    as its 1×1 convolution's weight ``(C, C, 1, …)`` (a global pool's flattened map takes it too)."""
    c, d = weight.shape[0], pooled.dim() - 2
    return _CONV_FN[d](pooled, weight.to(pooled.dtype).view(c, c, *([1] * d)))


def channel_view(t: torch.Tensor, extra_dims: int) -> torch.Tensor:
    """A per-channel tensor ``(C,)`` as ``(C, 1, …, 1)`` to broadcast over ``(N, C, *rest)``."""
    return t.reshape(-1, *([1] * extra_dims)) if t.dim() == 1 else t


# --------------------------------------------------------------------------------------------------
# The plain path: unfold, softmax, weighted sum


def softmax_pool_unfold(
    values: torch.Tensor, scores: torch.Tensor, geo: PoolGeometry
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out = Σ_j softmax(scores)_j · values_j`` per window, padded positions gated to 0.

    ``values`` ``(N, C, *spatial)``, ``scores`` ``(N, C or 1, *spatial)`` (one score shared by the
    channels). Returns ``out`` ``(N, C, *out)`` and the weights ``(N, C or 1, *out, K)``.
    """
    v = unfold_windows(values, geo, fill=0.0)  # (N, C, *out, K)
    s = unfold_windows(scores, geo, fill=float("-inf"))  # (N, C|1, *out, K)
    mask = window_mask(geo, values.device)  # (*out, K) or None
    gates = window_softmax(s, mask)
    return weighted_sum(gates, v, mask), gates


def soft_pool_unfold(
    x: torch.Tensor, geo: PoolGeometry, temperature: float | torch.Tensor = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain soft pool: ``(N, C, *spatial) -> (N, C, *out)`` and weights ``(N, C, *out, K)``."""
    tau = channel_view(temperature, geo.dim) if isinstance(temperature, torch.Tensor) else temperature
    return softmax_pool_unfold(x, scale_scores(x, tau), geo)
