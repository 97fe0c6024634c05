"""Pools whose padding or output size follows the input's size: what ``convert`` puts in place of timm's.

``PoolSame(pool, kernel_size, stride, value)``: TensorFlow's "SAME" padding, then any pool (built with
padding 0): timm's ``MaxPool2dSame`` / ``AvgPool2dSame`` with a gate. Per spatial dimension of size n,
window k, stride s (timm's ``pad_same``, which its pools call with dilation 1):

    P = max((⌈n / s⌉ − 1)·s + k − n, 0),     left P // 2,   right P − P // 2

so the output has ⌈n / s⌉ positions. The map is padded with ``value`` (``F.pad``), then pooled. The value
is each gate's own rule for padding, where a constant can say it (:data:`SAME_FILL`):

    "max", "soft", "soft-learned"  −inf: padded taps get gate 0 (torch's max padding, and the soft
                                   family's: a −inf tap beside finite ones gets gate 0)
    "avg"                          0, counted in the mean: timm's ``AvgPool2dSame`` (padded, then averaged)
    "conv"                         0: padded zeros add nothing (the conv gate's own padding)
    "attention"                    0: a padded position is a zero vector, score 0 and value 0; a constant
                                   cannot give it gate 0 (its score is a projection of the vector)

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

__all__ = ["SAME_FILL", "AtLeastPool", "PoolSame", "same_padding"]

SAME_FILL = {"max": float("-inf"), "soft": float("-inf"), "soft-learned": float("-inf"),
             "avg": 0.0, "conv": 0.0, "attention": 0.0}  # fmt: skip


def same_padding(size: int, kernel_size: int, stride: int) -> tuple[int, int]:
    """(left, right): TensorFlow's "SAME" padding of one dimension, ⌈n / s⌉ outputs (timm's ``pad_same``)."""
    total = max((-(-size // stride) - 1) * stride + kernel_size - size, 0)
    return total // 2, total - total // 2


class PoolSame(nn.Module):
    """``pool(F.pad(x, same padding, value))``: "SAME" padding from the input's size, then ``pool``."""

    def __init__(self, pool: nn.Module, kernel_size: tuple[int, ...], stride: tuple[int, ...], value: float):
        super().__init__()
        if len(kernel_size) != len(stride):
            raise ValueError(f"kernel_size {kernel_size} and stride {stride} must have one entry per dim")
        self.pool = pool
        self.kernel_size, self.stride, self.value = tuple(kernel_size), tuple(stride), float(value)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, value={self.value}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads: list[int] = []  # F.pad's order: the last dimension first
        for n, k, s in zip(reversed(x.shape[-len(self.kernel_size) :]), reversed(self.kernel_size),
                           reversed(self.stride)):  # fmt: skip
            pads += same_padding(n, k, s)
        return self.pool(F.pad(x, pads, value=self.value))


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
