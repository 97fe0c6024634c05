"""Fused window softmax pooling as torch operators: their registration and autograd (CPU: the C kernel of
:mod:`gatepool.layers.c_kernels`; CUDA: the Triton kernels of :mod:`gatepool.layers.triton_pool`).

    gatepool::softmax_pool(values, scores, tau, geometry, log_tau=False) -> (out, stats)
    gatepool::softmax_pool_backward(grad_out, values, scores, tau, out, stats, geometry, tau_grad,
                                    log_tau=False) -> (grad_values, grad_scores, grad_tau)

``out = Σ_j softmax(s/τ)_j · v_j`` over each window, the equations of :mod:`gatepool.layers.soft_pool`;
``scores=None`` is soft pooling (s = v: each input is read once per pass), a score map ``(N, 1, *spatial)``
is the attention gate's one score per position, and score weights ``(C,)`` give that score as
``s_j = w · v_j``, computed in the kernel at each tap (no score map is made, forward or backward; the
backward's ``grad_scores`` is then ∂L/∂w, and ∂L/∂s_j · w is added into ``grad_values`` there).
``tau`` is ``(C,)`` or ``(1,)``; with ``log_tau`` it is log τ (the learned gate's parameter), and the
backward gives ∂L/∂log τ = ∂L/∂τ · τ: the parameter's exp is then no autograd node of its own.
``geometry`` is a :class:`~gatepool.layers.windows.PoolGeometry` as a list of ints (:func:`encode`). Both
ops take and give ``(N, C, *spatial)`` tensors in the input's memory format (channels_last in,
channels_last out); the kernel works in channels-last memory, so :func:`softmax_pool` copies an NCHW
input to it once (the copy autograd keeps for the backward) and the result back. float16, bfloat16 (read
and written as they are, computed in float32), float32 and float64; out in the values' dtype (but with
score weights in float32 for float16/bfloat16: the attention gate projects it next, :func:`_out_dtype`);
``stats`` ``(2, N, *out, C or 1)``, the window max m of z = s/τ and 1/Σ e^(z−m) per window and score
channel, is what the backward needs besides the output (as much memory as max pool's int64 indices; the
float32 kernel keeps m in base-2 units, z·log2 e: each backward reads only its own forward's stats).
``torch.library.opcheck`` passes for both, and ``torch.compile`` sees them as single nodes
(``fullgraph=True`` holds).

On CUDA the same two ops run the Triton kernels of :mod:`gatepool.layers.triton_pool` (registered
below as the ops' CUDA kernels; float16/bfloat16/float32 in, computed in float32, ``stats`` in float32),
wherever triton imports; :func:`usable` sends CUDA tensors there.

Eager calls on the CPU do not go through the op: the custom op's dispatch and its Python autograd cost tens
of microseconds a call, more than a small input's arithmetic. Where :func:`eager` holds (plain CPU tensors
of the C kernel's dtypes; not traced by ``torch.compile`` or ``torch.jit``, under no dispatch or function
mode, no ``torch.func`` transform), :func:`softmax_pool` calls ``gatepool::softmax_pool_eager``, the same
C kernels as a C++ operator with its autograd in C++ (``kernels/softmax_pool_op.cpp``, built by
:func:`~gatepool.layers.c_kernels.eager_op`): one dispatcher call forward, one autograd node backward, on
the operands the op would give the kernels, so the values and gradients are the op's bit for bit. The op
stays what ``torch.compile``, ``torch.export``, ``opcheck``, fake tensors and CUDA see. The attention
gate's value projection ``V`` (:func:`softmax_pool`'s ``projection``) is a 1×1 convolution after the op;
the eager operator applies it inside, to the kernel's output, and its backward gives ∂L/∂V (a small
product as a plain loop: the convolution's dispatch and node cost a small input more than it does).

Which function is which: :func:`_op_forward` / :func:`_op_forward_cuda` are the op's forward (its CPU and
CUDA kernels), :func:`_op_backward` / :func:`_op_backward_cuda` the op's backward (the op
``softmax_pool_backward``), :func:`_autograd_backward` the autograd formula that calls it once
(:func:`_autograd_setup_context` keeps what it needs); :func:`softmax_pool` is the call the pools make.
Whether a call comes here at all is :mod:`gatepool.layers.softmax_paths`' decision.

The backward is the closed form ``g_j G (1 + (v_j − out)/τ)`` (see the C file), not autograd. A
backward that must itself be differentiable (``create_graph=True``) goes through the plain path's
autograd graph instead (the eager operator calls it as ``gatepool::softmax_pool_vjp``), so double
backward works.

The C kernel's build and its ctypes boundary are in :mod:`gatepool.layers.c_kernels`.

"""

import functools  # no ``from __future__ import annotations``: torch.library reads the ops' annotations

import torch

from gatepool.layers import triton_pool
from gatepool.layers.c_kernels import DTYPES, available, call, eager_op, geometry_struct
from gatepool.layers.windows import (
    PoolGeometry,
    as_dtype,
    channel_view,
    compute_dtype,
    inverse_temperature,
    project,
    scale_scores,
    softmax_pool_unfold,
    temperature_tensor,
)

__all__ = ["available", "encode", "softmax_pool", "usable"]

_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the Triton kernels' (computed in float32)


def usable(x: torch.Tensor) -> bool:
    """Can the fused kernels pool ``x``: float16/bfloat16/float32/float64 on the CPU, with the kernels
    built, or float16/bfloat16/float32 on CUDA, with triton there?"""
    if x.is_cuda:
        return x.dtype in _CUDA_DTYPES and triton_pool.available()
    return x.is_cpu and x.dtype in DTYPES and available()


# -------------------------------------------------------------------------------------------- geometry


@functools.lru_cache(maxsize=1024)
def encode(geo: PoolGeometry) -> list[int]:
    """``geo`` as the ops' ``geometry`` argument: dim, kernel, stride, padding, dilation, in, out, ceil
    (made once per geometry: callers do not change it)."""
    return [geo.dim, *geo.kernel_size, *geo.stride, *geo.padding, *geo.dilation, *geo.in_size, *geo.out_size,
            int(geo.ceil_mode)]  # fmt: skip


def decode(geometry: list[int]) -> PoolGeometry:
    """The :class:`PoolGeometry` that :func:`encode` gave ``geometry`` for (decoded once per geometry)."""
    return _decode(tuple(geometry))


@functools.lru_cache(maxsize=1024)
def _decode(geometry: tuple[int, ...]) -> PoolGeometry:
    d = geometry[0]
    k, s, p, dl, size, out = (tuple(geometry[1 + i * d : 1 + (i + 1) * d]) for i in range(6))
    return PoolGeometry(k, s, p, dl, bool(geometry[-1]), size, out, True)


def _channels_last_memory(t: torch.Tensor) -> bool:
    """Is ``t`` ``(N, C, *S)`` dense in channels-last memory, ``t.movedim(1, -1).is_contiguous()``? Read from
    its strides (no view made)."""
    shape, strides = t.shape, t.stride()
    if 0 in shape:
        return True
    expected = 1
    for i in (1, *range(t.dim() - 1, 1, -1), 0):  # innermost first: C, the spatial dims, N
        if shape[i] != 1 and strides[i] != expected:
            return False
        expected *= shape[i]
    return True


def _last(t: torch.Tensor) -> torch.Tensor:
    """``(N, C, *S)`` as channels-last memory ``(N, *S, C)``, contiguous (a view for channels_last input)."""
    return t.movedim(1, -1) if _channels_last_memory(t) else t.movedim(1, -1).contiguous()


def _like(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Kernel layout ``(N, *S, C)`` back to ``(N, C, *S)`` in ``like``'s memory format."""
    out = y.movedim(-1, 1)
    return out if _channels_last_memory(like) else out.contiguous()


def _operands(values, scores, tau, geometry, log_tau=False):
    """What both ops start from: the geometry, N, C, the score channels, the kernel's views (values, the
    score map, the score weights), a = 1/τ (τ = exp(tau) with ``log_tau``)."""
    geo = decode(geometry)
    n, c = values.shape[:2]
    v = _last(values)
    dtype = compute_dtype(values.dtype)
    a = inverse_temperature(as_dtype(tau, dtype).exp() if log_tau else tau, dtype)
    if _weights(scores):  # s_j = w · v_j, in the kernel
        return geo, n, c, 1, v, None, scores.contiguous(), a
    cs = c if scores is None else scores.shape[1]
    s = v if scores is None else _last(scores)
    return geo, n, c, cs, v, s, None, a


def _weights(scores: torch.Tensor | None) -> bool:
    """Are ``scores`` the score weights ``(C,)`` (not a score map ``(N, 1, *spatial)``)?"""
    return scores is not None and scores.dim() == 1


def _out_dtype(values: torch.Tensor, scores: torch.Tensor | None) -> torch.dtype:
    """out's dtype: values', but with score weights their compute dtype (float32 for float16/bfloat16): the
    attention gate projects out next (V · out), and a rounded out would be rounded twice on the way."""
    return compute_dtype(values.dtype) if _weights(scores) else values.dtype


def _score_map(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``s_j = w · v_j``: ``(N, C, *spatial)``, ``(C,)`` -> ``(N, 1, *spatial)`` (in the values' dtype)."""
    return torch.einsum("nc...,c->n...", values, weights.to(values.dtype)).unsqueeze(1)


# ------------------------------------------------------------------------------------------------- ops


@torch.library.custom_op("gatepool::softmax_pool", mutates_args=(), device_types="cpu")
def _op_forward(
    values: torch.Tensor, scores: torch.Tensor | None, tau: torch.Tensor, geometry: list[int],
    log_tau: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    geo, n, c, cs, v, s, w, a = _operands(values, scores, tau, geometry, log_tau)
    y = values.new_empty((n, *geo.out_size, c), dtype=_out_dtype(values, scores))
    stats = values.new_empty((2, n, *geo.out_size, cs), dtype=a.dtype)
    call("forward", geometry_struct(geo, n, c, cs, a.numel()), torch.get_num_threads(), v=v, s=s, a=a, w=w,
         out=y, stats=stats)  # fmt: skip
    return _like(y, values), stats


@_op_forward.register_fake
def _(values, scores, tau, geometry, log_tau=False):
    geo = decode(geometry)
    n, c = values.shape[:2]
    # Triton's half stats are per channel (triton_pool); the C kernel's per score channel
    half = values.device.type != "cpu" and compute_dtype(values.dtype) != values.dtype
    cs = c if scores is None or half else 1 if _weights(scores) else scores.shape[1]
    stats = values.new_empty((2, n, *geo.out_size, cs), dtype=compute_dtype(values.dtype))
    return _like(values.new_empty((n, *geo.out_size, c), dtype=_out_dtype(values, scores)), values), stats


@_op_forward.register_kernel("cuda")
def _op_forward_cuda(values, scores, tau, geometry, log_tau=False):
    """The op ``gatepool::softmax_pool``'s forward on CUDA: Triton (under ``TRITON_INTERPRET=1`` it also
    runs on CPU tensors)."""
    dtype = _out_dtype(values, scores)
    tau = tau.exp() if log_tau else tau  # the Triton kernels take τ
    scores = _score_map(values, scores) if _weights(scores) else scores  # Triton reads a score map
    return triton_pool.forward(values, scores, tau, decode(geometry), dtype=dtype)


@torch.library.custom_op("gatepool::softmax_pool_backward", mutates_args=(), device_types="cpu")
def _op_backward(
    grad_out: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor | None,
    tau: torch.Tensor,
    out: torch.Tensor,
    stats: torch.Tensor,
    geometry: list[int],
    tau_grad: bool,
    log_tau: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op ``gatepool::softmax_pool``'s backward (itself the op ``gatepool::softmax_pool_backward``) on the
    CPU: the C kernel. ``(grad_values, grad_scores, grad_tau)`` (∂L/∂log τ with ``log_tau``), empty where
    not asked for."""
    geo, n, c, cs, v, s, w, a = _operands(values, scores, tau, geometry, log_tau)
    threads = torch.get_num_threads()
    gv = torch.empty_like(v)
    gs = None if s is None or scores is None else torch.empty_like(s)
    ga = a.new_zeros((threads, a.numel())) if tau_grad else None
    gw = None if w is None else a.new_empty((threads, c))  # each thread zeroes its row
    y, stats, go = _last(out), stats.contiguous(), _last(grad_out)  # named: each must outlive the call
    call("backward", geometry_struct(geo, n, c, cs, a.numel()), threads, v=v, s=s, a=a, w=w, out=y,
         stats=stats, gout=go, gv=gv, gs=gs, ga=ga, gw=gw)  # fmt: skip
    if gw is not None:
        grad_scores = gw.sum(0)  # ∂L/∂w
    else:
        grad_scores = values.new_empty(0) if gs is None else _like(gs, scores)
    if not tau_grad:
        grad_tau = values.new_empty(0)
    else:  # ∂L/∂τ = −∂L/∂a / τ², ∂L/∂log τ = ∂L/∂τ · τ = −∂L/∂a · a
        grad_tau = -ga.sum(0) * a if log_tau else -ga.sum(0) * a * a
    return _like(gv, values), grad_scores, grad_tau


@_op_backward.register_fake
def _(grad_out, values, scores, tau, out, stats, geometry, tau_grad, log_tau=False):
    grad_scores = values.new_empty(0) if scores is None else torch.empty_like(scores)
    return torch.empty_like(values), grad_scores, torch.empty_like(tau) if tau_grad else values.new_empty(0)


@_op_backward.register_kernel("cuda")
def _op_backward_cuda(grad_out, values, scores, tau, out, stats, geometry, tau_grad, log_tau=False):
    """The op ``gatepool::softmax_pool_backward`` on CUDA: Triton, as :func:`_op_forward_cuda`."""
    if log_tau:  # Triton takes τ and gives ∂L/∂τ: ∂L/∂log τ = ∂L/∂τ · τ
        t = tau.exp()
        gv, gs, gt = _op_backward_cuda(grad_out, values, scores, t, out, stats, geometry, tau_grad)
        return gv, gs, gt * t if tau_grad else gt
    if not _weights(scores):
        return triton_pool.backward(grad_out, values, scores, tau, out, stats, decode(geometry), tau_grad)
    # score weights: Triton takes the score map; the chain rule through s_j = w · v_j here
    gv, gs, gt = triton_pool.backward(grad_out, values, _score_map(values, scores), tau, out, stats,
                                      decode(geometry), tau_grad)  # fmt: skip
    gs = gs.to(values.dtype)  # ∂L/∂s (N, 1, *spatial)
    grad_values = gv + gs * scores.to(gs.dtype).view(1, -1, *[1] * (values.dim() - 2))  # + ∂L/∂s_j · w
    grad_w = torch.einsum("n...,nc...->c", gs[:, 0], values).to(scores.dtype)  # ∂L/∂w = Σ_j ∂L/∂s_j v_j
    return grad_values, grad_w, gt


def _autograd_setup_context(ctx, inputs, output):
    """What the autograd formula keeps of a forward: its inputs, out and stats."""
    values, scores, tau, geometry, log_tau = inputs
    out, stats = output
    ctx.save_for_backward(values, scores, tau, out, stats)
    ctx.geometry, ctx.log_tau = geometry, log_tau
    ctx.mark_non_differentiable(stats)
    ctx.set_materialize_grads(False)  # no zeros of stats' shape for a gradient it never has


def _autograd_backward(ctx, grad_out, _grad_stats):
    """The autograd formula of ``gatepool::softmax_pool``: one call of the backward op (or, for a
    differentiable backward, autograd through the plain path)."""
    values, scores, tau, out, stats = ctx.saved_tensors
    need_v, need_s, need_tau = ctx.needs_input_grad[:3]
    if grad_out is None:  # out did not reach the loss
        grad_out = torch.zeros_like(out)
    if torch.is_grad_enabled():  # create_graph=True: the gradient needs a graph of its own
        grads = _plain_vjp(values, scores, tau, ctx.geometry, None, ctx.log_tau, grad_out,
                           (need_v, need_s, need_tau, False))  # fmt: skip
        return (*grads[:3], None, None)
    gv, gs, gt = _op_backward(grad_out, values, scores, tau, out, stats, ctx.geometry, need_tau, ctx.log_tau)
    return gv, (gs if scores is not None else None), (gt if need_tau else None), None, None


torch.library.register_autograd(
    "gatepool::softmax_pool", _autograd_backward, setup_context=_autograd_setup_context
)


def _plain(values, scores, tau, geo: PoolGeometry, projection=None, log_tau=False) -> torch.Tensor:
    """The same pooling on the plain path (differentiable by autograd, double backward included)."""
    scores = scores if projection is None else scores.reshape(-1)  # score weights (C,)
    tau = as_dtype(tau, compute_dtype(values.dtype)).exp() if log_tau else tau
    tau_view = channel_view(tau, geo.dim) if tau.numel() > 1 else tau.reshape(())
    s = values if scores is None else _score_map(values, scores) if _weights(scores) else scores
    out = softmax_pool_unfold(values, scale_scores(s, tau_view), geo)[0]
    return out if projection is None else project(out.to(_out_dtype(values, scores)), projection)


def _plain_vjp(values, scores, tau, geometry, projection, log_tau, grad_out, needs):
    """The gradients of values, scores, τ (or log τ) and the projection, by autograd through :func:`_plain`
    with a graph (``needs``: which are asked for; None for the others)."""
    operands = (values, scores, tau, projection)
    inputs = [t for t, need in zip(operands, needs) if need and t is not None]
    out = _plain(values, scores, tau, decode(geometry), projection, log_tau)
    grads = iter(torch.autograd.grad(out, inputs, grad_out, create_graph=True))
    return tuple(next(grads) if need and t is not None else None for t, need in zip(operands, needs))


# ------------------------------------------------------------------------------------------ the eager path


_EAGER_DTYPES = tuple(DTYPES)  # every C kernel's, checked bit for bit against the op


def eager(
    values: torch.Tensor,
    scores: torch.Tensor | None,
    tau: torch.Tensor,
    projection: torch.Tensor | None = None,
) -> bool:
    """May this call skip the op and run ``gatepool::softmax_pool_eager`` (the C++ operator of
    :func:`~gatepool.layers.c_kernels.eager_op`): plain CPU tensors of the kernel's dtypes, with nothing
    that must see the op (``torch.compile`` or ``torch.jit`` tracing, a dispatch mode such as fake tensors
    or a counting mode, a function mode, tensor subclasses, ``torch.func`` transforms)?"""
    return (
        not torch.compiler.is_compiling()
        and values.is_cpu
        and values.dtype in _EAGER_DTYPES
        and not torch._C._len_torch_dispatch_stack()
        and not torch.overrides.has_torch_function_variadic(values, scores, tau, projection)
        and not torch._C._are_functorch_transforms_active()
        and not torch._C._get_tracing_state()
        and eager_op() is not None
    )


# The eager operator's backward under create_graph=True (a gradient that must itself be differentiable):
# autograd through the plain path, which the C++ node calls by this name. Gradients not asked for are empty.
_vjp_library = torch.library.Library("gatepool", "FRAGMENT")
_vjp_library.define(
    "softmax_pool_vjp(Tensor grad_out, Tensor values, Tensor? scores, Tensor tau, int[] geometry, "
    "Tensor? projection, bool log_tau, bool need_values, bool need_scores, bool need_tau, "
    "bool need_projection) -> Tensor[]"
)


def _vjp(grad_out, values, scores, tau, geometry, projection, log_tau, need_values, need_scores, need_tau,
         need_projection):  # fmt: skip
    needs = (need_values, need_scores, need_tau, need_projection)
    grads = _plain_vjp(values, scores, tau, geometry, projection, log_tau, grad_out, needs)
    return [values.new_empty(0) if g is None else g for g in grads]


_vjp_library.impl("softmax_pool_vjp", _vjp, "CompositeImplicitAutograd")


# --------------------------------------------------------------------------------------------- the API


def softmax_pool(
    values: torch.Tensor,
    scores: torch.Tensor | None,
    tau: float | torch.Tensor,
    geo: PoolGeometry,
    *,
    log_tau: bool = False,
    projection: torch.Tensor | None = None,
) -> torch.Tensor:
    """``Σ_j softmax(s/τ)_j v_j`` per window by the fused kernels: ``(N, C, *spatial) -> (N, C, *out)``.

    ``values`` float16/bfloat16/float32/float64 on the CPU, float16/bfloat16/float32 on CUDA (check
    :func:`usable` first); ``scores`` None (soft pooling: s = v), a score map ``(N, 1, *spatial)``, or
    score weights ``(C,)`` (s_j = w · v_j, computed in the kernel); ``tau`` a float or a ``()``, ``(1,)``
    or ``(C,)`` tensor > 0, or with ``log_tau`` a tensor log τ (its gradient comes from the op: one node).
    ``projection``, with score weights (then ``(C,)`` or the score's 1×1 convolution weight
    ``(1, C, 1, …)``): the attention gate's value matrix V as its 1×1 convolution's weight ``(C, C, 1, …)``,
    applied to the pooled map (``V · out``; the eager operator does it inside, the parameters as they are);
    no window may be empty (``geo.has_empty_windows``: the caller masks those).
    """
    weights = projection is not None or _weights(scores)
    c = values.shape[1]
    if projection is not None and (scores is None or scores.numel() != c or geo.has_empty_windows):
        raise ValueError("projection needs score weights of C entries, (C,) or (1, C, 1, …), and windows "
                         "that all read the input (geo.has_empty_windows False)")  # fmt: skip
    if not isinstance(tau, torch.Tensor):
        if log_tau:
            raise TypeError(f"log_tau=True takes log τ as a tensor, got {type(tau).__name__}")
        tau = temperature_tensor(float(tau), values)  # (1,), made once per value
    elif tau.dtype != compute_dtype(values.dtype) or tau.dim() != 1:
        tau = tau.to(compute_dtype(values.dtype)).reshape(-1)  # τ in float32 for float16/bfloat16 values
    if scores is not None and tau.numel() != 1:
        raise ValueError(f"shared scores take one temperature, got {tau.numel()}")
    if eager(values, scores, tau, projection):  # score weights in the compute dtype (float32 for halves)
        if scores is not None:
            scores = as_dtype(scores, compute_dtype(values.dtype) if weights else values.dtype)
        if projection is None and not log_tau:
            return eager_op()(values, scores, tau, encode(geo))
        return eager_op()(values, scores, tau, encode(geo), projection, log_tau)  # (positional: faster)
    # The kernel reads channels-last memory: copy an NCHW input there once, here, so that autograd
    # saves that copy for the backward (instead of the op copying it again) and copies the gradient back.
    v = _as_channels_last(values)
    if weights:
        s = scores.reshape(-1).to(compute_dtype(values.dtype))  # w (C,), float32 for float16/bfloat16 values
    else:
        s = None if scores is None else _as_channels_last(scores)
    out = torch.ops.gatepool.softmax_pool(v, s, tau, encode(geo), log_tau)[0]
    out = out if v is values else out.contiguous()
    return out if projection is None else project(out, projection)


def _as_channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``(N, C, *S)`` with channels-last strides: ``t`` itself when it has them, else a copy."""
    return t if _channels_last_memory(t) else t.movedim(1, -1).contiguous().movedim(-1, 1)
