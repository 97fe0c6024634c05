"""Pools whose padding or output size follows the input's size: what ``convert`` puts in place of timm's.

``PoolSame(pool, kernel_size, stride, value=None)``: TensorFlow's "SAME" padding, then any pool (built
with padding 0): timm's ``MaxPool2dSame`` / ``AvgPool2dSame`` with a gate. Per spatial dimension of size
n, window k, stride s (timm's ``pad_same``, which its pools call with dilation 1):

    P = max((⌈n / s⌉ − 1)·s + k − n, 0),     left P // 2,   right P − P // 2

so the output has ⌈n / s⌉ positions. Who fills the padded taps is each gate's own padding rule:

    torch's pools ("max", "avg")   the map is padded with ``value`` (``F.pad``), then pooled: −inf for
                                   max, 0 counted in the mean for avg (:data:`SAME_FILL`): timm's exactly
    "soft", "soft-learned",        the gated pool pools the unpadded map over windows that start
    "attention", "conv"            ``left`` before it and reach ``right`` past it (a geometry with
                                   that asymmetric padding), as it pools its own padding: padded taps
                                   get gate 0 (the soft family and "attention"), padded zeros add nothing
                                   ("conv"). No fill value could do this for "attention", whose score of
                                   a padded vector is a projection of it (a zero vector scores 0, not −∞).

``AtLeastPool(pool, size)``: a map smaller than ``size`` in some dimension is pooled by adaptive windows
up to ``max(size_i, n_i)`` in each dimension; a map at least as large passes as it is. This is the input
guard of timm's VGG head (``ConvMlp``: ``F.adaptive_avg_pool2d`` up to the 7×7 its first conv needs) with
a gate: ``pool`` is an adaptive pool to ``size`` (torch's, or :class:`AdaptiveGatedPool2d`); for a map
smaller in one dimension only it runs with output size None (the input's) in the other dimension, on the
same parameters.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers import gate_table
from gatepool.layers.gated_pool import GatedPoolNd
from gatepool.layers.windows import PoolGeometry, _out_len

__all__ = ["SAME_FILL", "AtLeastPool", "PoolSame", "same_padding"]

# {"max": -inf, "avg": 0.0}: the value torch's pools pad with for timm's "SAME" padding
SAME_FILL = {g.name: g.same_fill for g in gate_table.TABLE.values() if g.same_fill is not None}


def same_padding(size: int, kernel_size: int, stride: int) -> tuple[int, int]:
    """(left, right): TensorFlow's "SAME" padding of one dimension, ⌈n / s⌉ outputs (timm's ``pad_same``)."""
    total = max((-(-size // stride) - 1) * stride + kernel_size - size, 0)
    return total // 2, total - total // 2


class PoolSame(nn.Module):
    """The "SAME" padding from the input's size, then ``pool``: by ``F.pad(x, …, value)`` for torch's pools,
    by the gate's own padding rule for the gated pools (padded taps get gate 0)."""

    def __init__(
        self,
        pool: nn.Module,
        kernel_size: tuple[int, ...],
        stride: tuple[int, ...],
        value: float | None = None,
    ):
        super().__init__()
        if len(kernel_size) != len(stride):
            raise ValueError(f"kernel_size {kernel_size} and stride {stride} must have one entry per dim")
        gated = _gated(pool)
        if gated and value is not None:
            raise ValueError(
                f"value={value} is for torch's pools; the gate {pool.gate!r} pads by its own "
                f"rule (padded taps get gate 0): pass value=None"
            )
        if not gated and value is None:
            raise ValueError(f"{type(pool).__name__} pools a padded map: pass value= the fill (SAME_FILL)")
        window = (tuple(pool.kernel_size), tuple(pool.stride)) if gated else ()
        if gated and (
            any(pool.padding)
            or pool.return_weights
            or pool.return_indices
            or window != (tuple(kernel_size), tuple(stride))
        ):
            raise ValueError(f"pool must have kernel_size={tuple(kernel_size)}, stride={tuple(stride)}, "
                             f"padding 0 and return the output only, got {pool!r}")  # fmt: skip
        self.pool = pool
        self.kernel_size, self.stride = tuple(kernel_size), tuple(stride)
        self.value = None if value is None else float(value)

    def extra_repr(self) -> str:
        fill = "" if self.value is None else f", value={self.value}"
        return f"kernel_size={self.kernel_size}, stride={self.stride}{fill}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = len(self.kernel_size)
        pads = [same_padding(n, k, s) for n, k, s in zip(x.shape[-d:], self.kernel_size, self.stride)]
        if self.value is None:  # a gated pool: its own padding rule
            return _pool_padded(self.pool, x, pads)
        flat = [p for pair in reversed(pads) for p in pair]  # F.pad's order: the last dimension first
        return self.pool(F.pad(x, flat, value=self.value))


def _gated(pool: nn.Module) -> bool:
    """A gated pool whose gate pads by a rule no fill value gives (not torch's "max" / "avg")."""
    return isinstance(pool, GatedPoolNd) and gate_table.row(pool.gate).same_fill is None


def _pool_padded(pool: GatedPoolNd, x: torch.Tensor, pads: list[tuple[int, int]]) -> torch.Tensor:
    """``pool`` over windows of ``x`` padded by ``pads`` ((left, right) per dim), padded taps its own way.

    The windows are those of ``pool`` on the padded map, (M − span(+ s − 1 with ceil_mode)) // s + 1 per
    dimension (M = n + left + right); the geometry says padding ``left`` and that many outputs, so its
    right padding (``PoolGeometry.pad_right``) is what the windows reach past the map: every gate path
    masks those taps as it masks a pool's own padding.
    """
    d = pool.dim
    if x.dim() not in (d + 1, d + 2) or not x.is_floating_point():
        raise ValueError(f"input must be a floating-point {d + 2}-D (N, C, *spatial) or {d + 1}-D tensor, "
                         f"got {x.dtype} of shape {tuple(x.shape)}")  # fmt: skip
    size = tuple(x.shape[-d:])
    padded = [n + left + right for n, (left, right) in zip(size, pads)]
    span = [dl * (k - 1) + 1 for k, dl in zip(pool.kernel_size, pool.dilation)]
    if any(w > m for w, m in zip(span, padded)):
        raise ValueError(
            f"kernel_size {pool.kernel_size} with dilation {pool.dilation} spans {tuple(span)}, "
            f"larger than the padded input {tuple(padded)}"
        )
    out = tuple(_out_len(m, k, s, 0, dl, pool.ceil_mode)
                for m, k, s, dl in zip(padded, pool.kernel_size, pool.stride, pool.dilation))  # fmt: skip
    geo = PoolGeometry(pool.kernel_size, pool.stride, tuple(left for left, _ in pads), pool.dilation,
                       pool.ceil_mode, size, out, x.dim() == d + 2)  # fmt: skip
    return pool._pool(x, geo)  # the gate's own step after its geometry, padded taps masked as its own


class AtLeastPool(nn.Module):
    """Adaptive windows up to ``max(size_i, n_i)`` where the map is smaller than ``size``; else ``x``."""

    def __init__(self, pool: nn.Module, size: tuple[int, ...]):
        super().__init__()
        out = getattr(pool, "output_size", None)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,) * len(size)
        if out != tuple(size):
            raise ValueError(f"pool must be an adaptive pool to size={tuple(size)}, got {pool!r}")
        self.pool, self.size = pool, tuple(size)

    def extra_repr(self) -> str:
        return f"size={self.size}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = [n < s for n, s in zip(x.shape[-len(self.size) :], self.size)]
        if not any(small):
            return x
        if all(small):
            return self.pool(x)
        pool = copy.copy(self.pool)  # the same parameters (and children), another output size
        pool.output_size = tuple(s if k else None for s, k in zip(self.size, small))
        return pool(x)
