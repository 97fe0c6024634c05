"""Which computation pools a softmax gate's windows, and why: one chooser for every softmax pool.

The softmax gates ("soft", "soft-learned", "attention"; :mod:`gatepool.layers.gated_pool`) compute
``Σ_j softmax(s/τ)_j v_j`` over each window. Four computations give it, fastest first:

    path      what runs                                          taken when
    "c"       the C kernel (``gatepool::softmax_pool`` traced)     float16/bfloat16/float32/float64 on the
                                                                 CPU, kernel built
    "triton"  ``gatepool::softmax_pool``: Triton                   float16/bfloat16/float32 on CUDA, triton
    "tiled"   dense ops over the K window slices (soft_pool)     no kernel; s = v and windows that tile
    "plain"   unfold, masked softmax, weighted sum (windows)     otherwise; always for ``return_weights``

and two for windows of another kind: ``"one-window"``, a softmax over the last axis, for a global pool off
the CPU (the windowed GPU kernel unrolls its taps at compile time), and ``"gather"`` for the adaptive pools
(windows of varying size, gathered and padded to the largest).

:func:`softmax_path` is the one place that decides; the windowed, global and adaptive pools and
``soft_pool*d`` all ask it, so "why did this call take the slow path?" has one answer::

    >>> softmax_path(torch.zeros(2, 3, 8, 8, dtype=torch.int32), tiles=True).reason
    'no fused kernel takes torch.int32 on cpu (the C kernel: float16, bfloat16, float32, float64)'

:func:`pool_in` is the one wrapper around a path for batch, dtype and memory format: an unbatched input gets
a batch of one, the input goes in in the dtype its path takes (:func:`input_dtype`: the fused kernels, C
and Triton, read float16/bfloat16 as they are and compute in float32 inside; the pure-PyTorch paths
compute them in float32, on a copy) and the output comes back in the input's dtype, memory format and
batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gatepool.layers import fused_pool
from gatepool.layers.c_kernels import DTYPES
from gatepool.layers.windows import as_dtype, compute_dtype, like_input_format

__all__ = ["PATHS", "SoftmaxPath", "input_dtype", "pool_in", "softmax_path"]

PATHS = ("c", "triton", "tiled", "plain", "one-window", "gather")
_C_DTYPES = tuple(DTYPES)  # the C kernel's
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class SoftmaxPath:
    """A path (one of :data:`PATHS`) and why it was taken, in words."""

    name: str
    reason: str

    @property
    def fused(self) -> bool:
        """Does the path run the ``gatepool::softmax_pool`` op (the C kernel or Triton)?"""
        return self.name in ("c", "triton")


_KERNELS = {  # (device type, dtype): the fused kernel's path, made once (a call asks for it every time)
    **{("cpu", t): SoftmaxPath("c", f"{t} on cpu: the C kernel") for t in _C_DTYPES},
    **{("cuda", t): SoftmaxPath("triton", f"{t} on cuda: the Triton kernels") for t in _TRITON_DTYPES},
}


def _kernel(x: torch.Tensor) -> SoftmaxPath | None:
    """The fused kernel that takes ``x`` here, or None."""
    if not fused_pool.usable(x):
        return None
    return _KERNELS[x.device.type, x.dtype]


def _no_kernel(x: torch.Tensor) -> str:
    """Why no fused kernel takes ``x``."""
    if x.device.type == "cuda":
        if x.dtype not in _TRITON_DTYPES:
            return f"no fused kernel takes {x.dtype} on cuda (Triton: float16, bfloat16, float32)"
        return "the Triton kernels cannot run here (triton not installed, or GATEPOOL_KERNELS=0)"
    if x.device.type != "cpu":
        return f"no fused kernel runs on {x.device.type}"
    if x.dtype not in _C_DTYPES:
        return f"no fused kernel takes {x.dtype} on cpu (the C kernel: float16, bfloat16, float32, float64)"
    return "the C kernel is not built here (no C compiler, or GATEPOOL_KERNELS=0)"


def softmax_path(
    x: torch.Tensor,
    *,
    tiles: bool = False,
    scored: bool = False,
    return_weights: bool = False,
    windows: str = "fixed",
) -> SoftmaxPath:
    """The path that pools ``x`` ``(N, C, *spatial)`` (its device and dtype as given), and why.

    ``tiles``: the windows tile the input (``PoolGeometry.tiles``); ``scored``: the gate scores positions
    (attention: s ≠ v, which the tiled path does not take); ``return_weights``: the weights are asked for
    (only the plain path makes them); ``windows``: ``"fixed"`` (a window size), ``"global"`` (one window of
    every position: off the CPU a softmax over the last axis, ``"one-window"``, as the windowed GPU kernel
    unrolls its taps) or ``"adaptive"`` (torch's adaptive windows: gathered, ``"gather"``, unless they
    tile the input, ``tiles``, on the CPU, where they are a windowed pool's and the C kernel takes them).
    """
    if windows == "adaptive" and not (tiles and x.device.type == "cpu"):
        why = "on the GPU the Triton kernel unrolls a window's taps" if tiles else "the windows vary in size"
        return SoftmaxPath("gather", f"adaptive windows ({why}): gathered and padded to the largest")
    if return_weights:
        return SoftmaxPath("plain", "return_weights=True: only the plain path makes the weights")
    if windows == "global" and x.device.type != "cpu":
        return SoftmaxPath("one-window", "a global window off the CPU: one softmax over its taps")
    kernel = _kernel(x)
    if kernel is not None:
        return kernel
    why = _no_kernel(x)
    if tiles and not scored:
        return SoftmaxPath("tiled", why)
    shape = "the gate scores positions (attention)" if scored else "the windows do not tile the input"
    return SoftmaxPath("plain", f"{why}; {shape}")


def input_dtype(x: torch.Tensor, return_weights: bool = False) -> torch.dtype:
    """The dtype ``x`` goes into a path in: its own where a fused kernel (C or Triton) takes it, else
    float32 (float64 stays): the pure-PyTorch paths compute float16 / bfloat16 in float32, on a copy
    (``return_weights``: the plain path's, see :func:`softmax_path`)."""
    return x.dtype if fused_pool.usable(x) and not return_weights else compute_dtype(x.dtype)


def pool_in(
    input: torch.Tensor,
    batched: bool,
    pool: Callable[[torch.Tensor], torch.Tensor],
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``pool`` of ``input`` as ``(N, C, *spatial)`` in ``dtype`` (:func:`input_dtype` by default); its output
    in ``input``'s batch, dtype and memory format (unbatched ``(C, *spatial)`` in, ``(C, *out)`` out)."""
    xb = input if batched else input.unsqueeze(0)  # (N, C, *spatial)
    out = pool(as_dtype(xb, input_dtype(xb) if dtype is None else dtype))  # (N, C, *out)
    out = as_dtype(like_input_format(out, xb), input.dtype)
    return out if batched else out.squeeze(0)
