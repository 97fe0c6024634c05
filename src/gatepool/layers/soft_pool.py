"""Soft pooling: the equations, the functional API and its paths (windows and the plain path: windows.py).

Every pooling is a gated sum over a window of n values v_1 … v_n (a k×k patch of one channel):

    out = Σ_j g_j · v_j,        g_j ≥ 0,   Σ_j g_j = 1

Soft pooling sets the gate with a softmax at temperature τ, out = V · softmax(V/τ):

    g = softmax(v / τ)

and its exact gradient is (the gate, plus a term that pushes each value away from the mean):

    ∂out/∂v_j = g_j · (1 + (v_j − out) / τ)         ∂out/∂τ = −Σ_j g_j (v_j − out)² / τ²

τ → 0 gives g = hardmax(v), max pooling; τ → ∞ gives g = 1/n, average pooling; τ = 1 is SoftPool.

Windows follow torch's pools, argument for argument (``F.max_pool2d(input, kernel_size, stride=None,
padding=0, dilation=1, ceil_mode=False)``): default stride = kernel_size; ``padding`` p ≤ k/2 on both
sides; a window reads every ``dilation``-th position; with ``ceil_mode`` the last window may hang over the
end but must start inside the input or the left padding. An empty batch gives an empty output; no
channels or a zero-size spatial dimension is an error, as in torch.

Padded taps get gate 0: padding is not a value (for max this is torch's −inf padding; for average it is
``count_include_pad=False``). A window with no input tap at all (possible with dilation) gives −inf, as
torch's max pool.

Non-finite values take the limits max pooling takes: a window whose largest value is +inf puts its whole
gate on its +inf taps (out = +inf, and ∂out/∂v_j = g_j, the max-pool gradient); a window of −inf gives
−inf; a tap of −inf beside finite ones gets gate 0; a NaN makes that window's output NaN and no other.

Weights layout (``return_weights=True``): ``(N, C, *out_spatial, K)`` with K = ∏ kernel_size, the window
positions flattened row-major (the last spatial axis fastest); ``(C, *out_spatial, K)`` for unbatched input.

Numerics: the softmax subtracts the window max before exp, so every finite input (±1e4 included, any
τ > 0) gives finite outputs. float16 / bfloat16 inputs go into the fused kernels, C and Triton, as they
are (computed in float32 inside); the pure-PyTorch paths compute them in float32 and cast back.

Three ways to compute, side by side (``softmax_paths.softmax_path`` picks, and says why):
  * the plain one, ``soft_pool_unfold`` (in windows.py): unfold the windows to ``(N, C, *out, K)``,
    softmax over K, weighted sum; autograd does the rest (double backward included). Any stride,
    padding, dilation, ceil_mode; it also returns the weights, and it holds the limits above. The
    reference the other two are tested against.
  * the fused kernel, ``fused_pool.softmax_pool`` (a C kernel compiled on first use, registered as the
    torch op ``gatepool::softmax_pool``, which eager CPU calls skip: they call the kernel from an
    autograd Function, ``fused_pool.eager``): one pass over each window's taps, vectorized over the
    channels of channels-last memory, the backward by the identity above; any geometry, 1-D to 3-D,
    float32/float64 on the CPU, the limits above included. The default wherever it could be built.
    On CUDA the same op runs Triton kernels (``triton_pool``: fp16/bf16/fp32, float32 math) where
    triton is installed.
  * the tiled one, ``_TiledSoftPool`` (pure PyTorch, for machines without a C compiler), when windows
    tile the input (stride = kernel, no padding, no dilation): one copy puts the window offsets in
    front, ``(K, N, C, *out)``, so each of the K window positions is a dense tensor in the input's
    memory format; the max, exp, sums and the backward are then dense elementwise ops, and the backward
    is the identity above (no autograd graph), written straight into the input's layout. channels_last
    in, channels_last out. It takes the limits above in those same dense ops (inf − inf at an infinite
    top becomes a shared gate, 0 · inf a zero), with no check on the host. Double backward
    (``create_graph=True``) goes through the plain path's autograd graph (so does the fused kernel's).
    It is there for the machines where no kernel runs (no compiler, ``GATEPOOL_KERNELS=0``, or CUDA
    without triton): dense elementwise ops over K tensors instead of a softmax over unfolded windows,
    several times faster than the plain path forward + backward (docs/benchmarks.md).

``gatepool bench pool`` measures all three against torch's max pool; docs/benchmarks.md has the tables.
"""

from __future__ import annotations

import dataclasses

import torch

from gatepool.layers import fused_pool
from gatepool.layers.softmax_paths import pool_in, softmax_path
from gatepool.layers.windows import (
    IntOrTuple,
    PoolGeometry,
    channel_view,
    check_temperature,
    compute_dtype,
    pool_geometry,
    soft_pool_unfold,
)

__all__ = ["soft_pool", "soft_pool1d", "soft_pool2d", "soft_pool3d", "soft_pool_tiled", "soft_pool_windows"]


# --------------------------------------------------------------------------------------------------
# The fast path for tiling windows (the plain path, soft_pool_unfold, is in windows.py)


def _window_major(
    shape: list[int], kernel: tuple[int, ...], memory_order: list[int]
) -> tuple[list[int], list[int]]:
    """How to view x ``(N, C, o_1·k_1, …)`` as windows ``(k_1, …, k_d, N, C, o_1, …, o_d)``.

    Returns the tile shape ``(N, C, o_1, k_1, …, o_d, k_d)`` and a permutation of it that puts the
    window offsets first and keeps the other dimensions in x's memory order (``memory_order``: x's
    dims, outermost first), so a channels_last x gives channels_last window slices.
    """
    n, c, *size = shape
    d = len(kernel)
    tile_shape = [n, c] + [v for s, k in zip(size, kernel) for v in (s // k, k)]
    tile_dims = [[0], [1]] + [[2 + 2 * i, 3 + 2 * i] for i in range(d)]  # x dim -> tile dims (o_i, k_i)
    k_dims = [3 + 2 * i for i in range(d)]
    rest = [t for i in memory_order for t in tile_dims[i] if t not in k_dims]
    return tile_shape, k_dims + rest


class _TiledSoftPool(torch.autograd.Function):
    """Soft pooling of non-overlapping, unpadded windows (the limits above for non-finite ones).

    ``x`` is ``(N, C, o_1·k_1, …, o_d·k_d)``, ``tau`` a float or a ``()`` / ``(C,)`` tensor, ``geo`` the
    windows of x. One copy puts the windows in front, ``w`` of shape ``(K, N, C, *out)``: each window
    position j is then a dense ``(N, C, *out)`` tensor in x's memory format, and every step below is a
    dense elementwise op (a broadcast over strided tile views is several times slower). The backward uses
    the identity ``g_j (1 + (v_j − out)/τ)`` directly; its last multiply writes straight into x's layout.
    A backward that must itself be differentiable (``create_graph=True``) recomputes the gradient through
    the plain path's autograd graph instead.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, tau: float | torch.Tensor, geo: PoolGeometry) -> torch.Tensor:
        kernel = geo.kernel_size
        d = len(kernel)
        memory_order = sorted(range(x.dim()), key=lambda i: -x.stride(i))  # x's dims, outermost first
        tile_shape, perm = _window_major(list(x.shape), kernel, memory_order)
        w = x.view(tile_shape).permute(perm).contiguous()  # (k_1, …, k_d, [N, C, *out] in x's order)
        logical = [perm.index(i) for i in range(2 * d + 2) if i not in perm[:d]]  # -> (k…, N, C, *out)
        w = w.permute(list(range(d)) + logical).flatten(0, d - 1)  # (K, N, C, *out)
        m = w[0].clone()  # window max  (N, C, *out); NaN if the window holds one
        for wj in w[1:]:
            torch.maximum(m, wj, out=m)
        e = torch.sub(w, m)  # v_j − m ≤ 0  (K, N, C, *out)
        if isinstance(tau, torch.Tensor) or tau != 1.0:
            e.div_(channel_view(tau, d) if isinstance(tau, torch.Tensor) else tau)
        # e_j = exp((v_j − m)/τ) ∈ [0, 1]. The limits: a top of ±inf gives inf − inf = NaN at its top taps,
        # which share the gate (e = 1), and −inf (e = 0) at the others; a NaN window gets den = NaN below.
        e.exp_().nan_to_num_(nan=1.0)
        denom = e.sum(0)  # Σ_j e_j ≥ 1  (N, C, *out)
        denom.masked_fill_(m.isnan(), float("nan"))  # a NaN makes its window's output and gradients NaN
        # Σ_j e_j v_j; a tap with e_j = 0 adds nothing (not 0 · −inf = NaN)
        num = torch.mul(e, w).nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf")).sum(0)
        out = num.div_(denom)  # (N, C, *out)
        tau_t = tau if isinstance(tau, torch.Tensor) else None
        ctx.save_for_backward(x, w, e, denom, out, tau_t)
        ctx.tau, ctx.geo, ctx.tile_shape, ctx.memory_order = tau, geo, tile_shape, memory_order
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, w, e, denom, out, tau_t = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the gradient must have a graph of its own
            return _tiled_backward_with_graph(ctx, x, tau_t, grad_out)
        d = out.dim() - 2
        tau = channel_view(tau_t, d) if tau_t is not None else ctx.tau
        a = grad_out / denom  # g_j · ∂L/∂out = e_j · a
        # v_j − out  (K, N, C, *out); 0 where the limits make it inf − inf (the top taps of an infinite
        # window: the max-pool gradient g_j) or ±inf (taps with gate 0)
        t = torch.sub(w, out).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        grad_tau = None
        if tau_t is not None and ctx.needs_input_grad[1]:
            # ∂L/∂τ = −Σ ∂L/∂out · Σ_j g_j (v_j − out)² / τ², summed over everything but the channel
            var = (e * t).mul_(t).sum(0).mul_(a)  # (N, C, *out)
            dims = [0] + list(range(2, var.dim()))
            grad_c = (var.sum(dims) / tau_t.reshape(-1) ** 2).neg_()  # (C,)
            grad_tau = grad_c.sum_to_size(tau_t.shape)  # a shared τ, () or (1,), gets the sum
        grad_x = None
        if ctx.needs_input_grad[0]:
            a_tau = a / tau if isinstance(tau, torch.Tensor) or tau != 1.0 else a
            torch.addcmul(a, t, a_tau, out=t)  # a · (1 + (v_j − out)/τ)
            order, shape = ctx.memory_order, ctx.tile_shape  # shape: (N, C, o_1, k_1, …, o_d, k_d)
            x_shape = shape[:2] + [shape[2 + 2 * i] * shape[3 + 2 * i] for i in range(d)]
            grad_x = torch.empty([x_shape[i] for i in order], dtype=t.dtype, device=t.device)
            grad_x = grad_x.permute([order.index(i) for i in range(d + 2)])  # dense, in x's memory format
            k_dims, o_dims = [3 + 2 * i for i in range(d)], [2 + 2 * i for i in range(d)]
            dst = grad_x.view(shape).permute(k_dims + [0, 1] + o_dims)  # (k_1, …, k_d, N, C, *out)
            kernel = [shape[k] for k in k_dims]
            # e_j · a (1 + (v_j − out)/τ) = g_j (1 + (v_j − out)/τ) ∂L/∂out, written in x's layout
            torch.mul(t.view(*kernel, *t.shape[1:]), e.view(*kernel, *e.shape[1:]), out=dst)
        return grad_x, grad_tau, None


def _tiled_backward_with_graph(ctx, x: torch.Tensor, tau_t: torch.Tensor | None, grad_out: torch.Tensor):
    """``_TiledSoftPool.backward``'s gradient by autograd through the plain path, so it is differentiable."""
    need_x, need_tau = ctx.needs_input_grad[0], tau_t is not None and ctx.needs_input_grad[1]
    inputs = [t for t, need in ((x, need_x), (tau_t, need_tau)) if need]
    out = soft_pool_unfold(x, ctx.geo, tau_t if tau_t is not None else ctx.tau)[0]
    grads = iter(torch.autograd.grad(out, inputs, grad_out, create_graph=True))
    return (next(grads) if need_x else None), (next(grads) if need_tau else None), None


def soft_pool_tiled(
    x: torch.Tensor, geo: PoolGeometry, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """The fast soft pool for tiling windows (``geo.tiles``): ``(N, C, *spatial) -> (N, C, *out)``."""
    crop = tuple(slice(0, o * k) for o, k in zip(geo.out_size, geo.kernel_size))
    x = x[(slice(None), slice(None), *crop)]  # drop trailing inputs no window reads (a view)
    geo = dataclasses.replace(geo, in_size=tuple(x.shape[2:]), batched=True)
    return _TiledSoftPool.apply(x, temperature, geo)


def soft_pool_windows(
    x: torch.Tensor,
    geo: PoolGeometry,
    temperature: float | torch.Tensor,
    return_weights: bool = False,
    log_temperature: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Soft pooling of ``x`` ``(N, C, *spatial)`` over the windows ``geo``, by the path
    :func:`~gatepool.layers.softmax_paths.softmax_path` chooses: ``(out, weights)`` with the weights, asked
    for, from the plain path, else ``(out, None)``. ``log_temperature``: ``temperature`` is log τ (a
    tensor, the learned gate's parameter), which the fused kernels take as it is (∂L/∂log τ from their
    backward, no node for its exp); the other paths pool with τ = exp(log τ).
    """
    path = softmax_path(x, tiles=geo.tiles, return_weights=return_weights)
    if path.fused:
        return fused_pool.softmax_pool(x, None, temperature, geo, log_tau=log_temperature), None
    if log_temperature:
        temperature = temperature.exp()
    if path.name == "tiled":
        return soft_pool_tiled(x, geo, temperature), None
    out, weights = soft_pool_unfold(x, geo, temperature)
    return out, (weights if return_weights else None)


# --------------------------------------------------------------------------------------------------
# Public functional API


def soft_pool(
    input: torch.Tensor,
    dim: int,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    ceil_mode: bool = False,
    *,
    temperature: float | torch.Tensor = 1.0,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Soft pooling in ``dim`` spatial dimensions: ``out = V · softmax(V/τ)`` over each window.

    The window arguments are torch's (``F.max_pool2d``'s order). ``temperature`` τ: a float > 0, or a
    tensor of shape ``()`` or ``(C,)`` (one τ per channel; it may require grad). Padded taps get gate 0.
    Returns ``out`` ``(N, C, *out)``, or ``(out, weights)`` with weights ``(N, C, *out, K)``.
    """
    geo = pool_geometry(input, dim, kernel_size, stride, padding, dilation, ceil_mode)
    check_temperature(temperature, input.shape[-dim - 1])
    weights = []

    def pool(x: torch.Tensor) -> torch.Tensor:
        tau = temperature  # a float, or a tensor in float32 for float16/bfloat16 x
        if isinstance(temperature, torch.Tensor):
            tau = temperature.to(compute_dtype(x.dtype))
        out, w = soft_pool_windows(x, geo, tau, return_weights)
        weights.append(w)
        return out

    out = pool_in(input, geo.batched, pool, compute_dtype(input.dtype) if return_weights else None)
    if not return_weights:
        return out
    w = weights[0].to(input.dtype)
    return out, (w if geo.batched else w.squeeze(0))


def soft_pool1d(
    input: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    ceil_mode: bool = False,
    *,
    temperature: float | torch.Tensor = 1.0,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Soft pooling over ``(N, C, L)`` or ``(C, L)``; see :func:`soft_pool`."""
    return soft_pool(
        input, 1, kernel_size, stride, padding, dilation, ceil_mode,
        temperature=temperature, return_weights=return_weights,
    )


def soft_pool2d(
    input: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    ceil_mode: bool = False,
    *,
    temperature: float | torch.Tensor = 1.0,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Soft pooling over ``(N, C, H, W)`` or ``(C, H, W)``; see :func:`soft_pool`."""
    return soft_pool(
        input, 2, kernel_size, stride, padding, dilation, ceil_mode,
        temperature=temperature, return_weights=return_weights,
    )


def soft_pool3d(
    input: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    ceil_mode: bool = False,
    *,
    temperature: float | torch.Tensor = 1.0,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Soft pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``; see :func:`soft_pool`."""
    return soft_pool(
        input, 3, kernel_size, stride, padding, dilation, ceil_mode,
        temperature=temperature, return_weights=return_weights,
    )
