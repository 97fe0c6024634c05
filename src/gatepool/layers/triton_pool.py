"""Fused window softmax pooling on CUDA: Triton kernels for the ops of :mod:`gatepool.layers.fused_pool`.

The same equations as the C kernel (``kernels/softmax_pool.c``), per window (output position o), channel c
and the window's taps j inside the input (padded taps are not in the window: gate 0), with a = 1/τ:

    z_j = a · s_j                    s = v (soft pooling), or a score map (N, 1, *spatial) shared by channels
    m   = max_j z_j,   den = Σ_j e^(z_j − m),   g_j = e^(z_j − m) / den,   out = Σ_j g_j v_j

backward, with G = ∂L/∂out (the closed form, no autograd):

    ∂L/∂v_j += g_j G                 (+ a g_j (v_j − out) G when s = v: g_j G (1 + (v_j − out)/τ))
    ∂L/∂s_j += a g_j (v_j − out) G   (summed over c for a shared score)
    ∂L/∂a   += Σ_j g_j (v_j − out) s_j G,    ∂L/∂τ = −a² ∂L/∂a   (summed over batch and positions)

The max is subtracted before exp, so every finite input gives a finite output. float16/bfloat16 are read
and written in their dtype and computed in float32 (float64 in float64); ``stats`` is in that compute
dtype. ∂L/∂a sums terms g_j (v_j − out) s_j G that cancel (Σ_j g_j (v_j − out) = 0), so out rounded to
the half dtype would carry its rounding error δ into ∂τ as δ Σ_j g_j s_j G, many times the result: the
half forward keeps the residual r = out − rounded(out) (exact in float32) and the backward reads out as
rounded(out) + r, the forward's float32 out, without running the forward again.

Non-finite windows take the plain path's limits (``windows.window_softmax``): a NaN makes its
window NaN; a top score of ±inf shares the gate among the taps at the top (and gives no score or τ
gradient); a tap of −inf beside finite ones gets gate 0 (and adds nothing: not 0 · inf); a window with no
input tap gives −inf.

Kernels (1-D and 2-D run as 3-D with leading sizes of 1), on tensors dense in channels-last memory or
contiguous (the launchers copy any other, as max pool copies an expanded ∂L/∂out):
their strides follow from their sizes and one compile-time flag, so a launch passes pointers, sizes and
constants only (17 arguments and 21 constants at most), all but the pointers made once per shape
(:func:`_plan`). The index math is written once, in ``@triton.jit`` helpers the kernels call: a flat
position's indices, a tensor's offsets, the input that a window's tap reads (forward) and the window
that reads an input at a tap (backward), each pass's loop over the taps.

  * forward: one program per block of BLOCK_P flat (n, o) output positions × BLOCK_C channels; two
    passes over the K taps (unrolled: kernel, stride, padding and dilation are compile-time constants),
    the max, then the exp, den and Σ e v. With a shared score a program recomputes the score softmax for
    its channel block (the scores are one per position); the first channel block writes the stats (every
    block its channels' in fp16/bf16).
  * backward: a gather, one program per block of flat (n, i) *input* positions: for each tap t the window
    that reads i at t (o = (i + p − t·dl)/s where that is a whole number inside the output) gives its
    term, recomputed from the saved stats, out and G. Each gradient is written once, by one program
    (no atomics, no zeroing, deterministic; inputs no window reads get 0), however the windows overlap.
    With a shared score a program loops over all the channels (the score gradient sums over them). ∂L/∂τ:
    one partial sum per program (and channel), −a² ∂L/∂a, summed afterwards by torch in a fixed order
    (one reduction).

``stats`` (in float32: 8 bytes per output at most, as max pool's int64 indices), per window:

  * float32/float64: ``(2, N, *out, C or 1)`` as the C op's, the window max m of z and 1/den (g_j =
    e^(z_j − m)/den), per score channel (one for a shared score);
  * float16/bfloat16: ``(2, N, *out, C)``, the log-sum-exp of z, m + log den (g_j = e^(z_j − lse)), and
    the residual r (per channel, so a shared score's lse is repeated in each). The lse rounded to
    float32 moves every gate of its window by the same factor, 1 ± |lse|·2⁻²⁴: far below the half
    dtypes' rounding (float32 keeps m and 1/den, which lose nothing there).

Where the C kernel marks a window it redid by the limits with m = NaN, this one keeps m itself (±inf,
NaN for a NaN window; the half stats too, in place of the log-sum-exp) and 1/den over the taps at the
top (in place of r): the backward tells the cases apart by the first row. Each backward reads only its
own forward's stats.

triton is imported on first use (the kernels are jit-wrapped then); :func:`available` says whether it
can be (``GATEPOOL_KERNELS=0`` turns these kernels off too). ``TRITON_INTERPRET=1``, set before triton is
first imported, runs them on CPU tensors: the tests do that where no GPU is.
"""

import contextlib  # no ``from __future__ import annotations``: the kernels' tl.constexpr must be evaluated
import functools
import importlib.util
import math
import os
import types

import torch

from gatepool.layers.windows import PoolGeometry, compute_dtype, inverse_temperature

__all__ = ["available", "backward", "forward"]


class _Language:
    """Stands for ``triton.language`` until triton is loaded (:func:`_kernels`): the kernels' signatures
    name ``tl.constexpr``, which is then the string triton reads as constexpr."""

    constexpr = "constexpr"


tl = _Language  # triton.language once loaded; the kernels' bodies name it as a global
_DEVICE_FUNCTIONS = []  # the helpers the kernels call: jit-wrapped in place by _kernels()


def _device_function(fn):
    """Mark ``fn`` a helper of the kernels: :func:`_kernels` puts its ``triton.jit`` wrap under its name."""
    _DEVICE_FUNCTIONS.append(fn)
    return fn


_TILE = 1024  # elements of one program's (positions × channels) block
# Every launch's options. enable_fp_fusion=False: each product rounded before it is added, as in the C
# kernel and the interpreter, so the GPU's gradients of large inputs stay within the bounds the tests hold
# the C kernel to (fused multiply-adds do not: docs/benchmarks.md, the H200 run).
_LAUNCH = {"num_warps": 4, "enable_fp_fusion": False}


@torch.compiler.assume_constant_result  # torch.compile asks once, at trace time
def available() -> bool:
    """Can the Triton kernels run here: triton importable (and ``GATEPOOL_KERNELS`` not 0)?"""
    return _importable()


@functools.lru_cache(maxsize=1)
def _importable() -> bool:
    if os.environ.get("GATEPOOL_KERNELS", "1") == "0" or importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install: no kernels, the pure-PyTorch paths
        return False
    return True


# --------------------------------------------------------------------------------------------- kernels
# Every tensor the kernels index is dense in channels-last memory or contiguous (LAST says which; the
# launchers copy one that is neither): its strides follow from its sizes, so none is passed.


@_device_function
def _unflatten(p, D, H, W):
    """Flat (n, d, h, w) positions (P,) -> their four indices."""
    n = p // (D * H * W)
    r = p % (D * H * W)
    return n, r // (H * W), (r // W) % H, r % W


@_device_function
def _address(n, d, h, w, c, C, D, H, W, LAST):
    """Offsets (P, len(c)) of channels c at positions (n, d, h, w) (P,) of a dense (N, C, D, H, W) tensor."""
    if LAST:
        base = (((n * D + d) * H + h) * W + w) * C
        step = 1
    else:
        base = n * C * D * H * W + (d * H + h) * W + w
        step = D * H * W
    return base[:, None] + c.to(tl.int64)[None, :] * step


@_device_function
def _input_tap(od, oh, ow, pmask, t, ID, IH, IW, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW):
    """Tap t of windows o: the input position it reads, and whether that is inside the input (a padded
    tap is not in the window)."""
    i_d = od * SD - PD + (t // (KH * KW)) * DD
    i_h = oh * SH - PH + (t // KW % KH) * DH
    i_w = ow * SW - PW + (t % KW) * DW
    ok = pmask & (i_d >= 0) & (i_d < ID) & (i_h >= 0) & (i_h < IH) & (i_w >= 0) & (i_w < IW)
    return i_d, i_h, i_w, ok


@_device_function
def _window_of(i_d, i_h, i_w, qmask, t, OD, OH, OW, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW):
    """The window o that reads input i at tap t (o = (i + p − t·dl)/s), and whether there is one (a whole
    number inside the output)."""
    t_d = i_d + PD - (t // (KH * KW)) * DD
    t_h = i_h + PH - (t // KW % KH) * DH
    t_w = i_w + PW - (t % KW) * DW
    o_d = t_d // SD
    o_h = t_h // SH
    o_w = t_w // SW
    ok_d = (t_d >= 0) & (t_d % SD == 0) & (o_d < OD)
    ok_h = (t_h >= 0) & (t_h % SH == 0) & (o_h < OH)
    ok_w = (t_w >= 0) & (t_w % SW == 0) & (o_w < OW)
    return o_d, o_h, o_w, qmask & ok_d & ok_h & ok_w


@_device_function
def _inverse_temperature(a_ptr, c, cmask, A_PER_CHANNEL, ACC):
    """a = 1/τ: (1, C) per channel, else a scalar."""
    if A_PER_CHANNEL:
        a = tl.load(a_ptr + c, mask=cmask, other=1.0).to(ACC)[None, :]
    else:
        a = tl.load(a_ptr).to(ACC)
    return a


@_device_function
def _window_max(s_ptr, a, n, od, oh, ow, pmask, k, kmask, CS, ID, IH, IW,
                KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, LAST, ACC):  # fmt: skip
    """The forward's first pass: the window max m of z = a·s (P, len(k)), and whether a NaN is in it."""
    lanes = pmask[:, None] & kmask[None, :]
    m = tl.full(lanes.shape, float("-inf"), ACC)
    nan = m != m
    for t in tl.static_range(KD * KH * KW):
        i_d, i_h, i_w, ok = _input_tap(od, oh, ow, pmask, t, ID, IH, IW, KH, KW, SD, SH, SW, PD, PH, PW,
                                       DD, DH, DW)  # fmt: skip
        s = tl.load(s_ptr + _address(n, i_d, i_h, i_w, k, CS, ID, IH, IW, LAST), mask=ok[:, None] & lanes,
                    other=float("-inf"))  # fmt: skip
        z = a * s.to(ACC)
        nan = nan | (z != z)
        m = tl.where(z > m, z, m)
    return m, nan


@_device_function
def _window_sums(v_ptr, s_ptr, a, m, finite, n, od, oh, ow, pmask, c, cmask, k, kmask, C, CS, ID, IH, IW,
                 KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, SOFT, LAST, ACC):  # fmt: skip
    """The forward's second pass: den = Σ_j e_j (P, len(k)) and Σ_j e_j v_j (P, C), e_j = e^(z_j − m) (in
    a window whose top is ±inf: 1 at the top, 0 elsewhere)."""
    den = tl.zeros_like(m)
    acc = tl.zeros([m.shape[0], c.shape[0]], ACC)  # (P, C)
    for t in tl.static_range(KD * KH * KW):
        i_d, i_h, i_w, ok = _input_tap(od, oh, ow, pmask, t, ID, IH, IW, KH, KW, SD, SH, SW, PD, PH, PW,
                                       DD, DH, DW)  # fmt: skip
        vmask = ok[:, None] & cmask[None, :]
        v = tl.load(v_ptr + _address(n, i_d, i_h, i_w, c, C, ID, IH, IW, LAST), mask=vmask,
                    other=0.0).to(ACC)  # (P, C)  # fmt: skip
        if SOFT:
            s = tl.where(vmask, v, float("-inf"))
        else:
            s = tl.load(s_ptr + _address(n, i_d, i_h, i_w, k, CS, ID, IH, IW, LAST),
                        mask=ok[:, None] & kmask[None, :], other=float("-inf")).to(ACC)  # fmt: skip
        z = a * s
        e = tl.where(finite, tl.exp(z - m), tl.where(z == m, 1.0, 0.0))
        e = tl.where(ok[:, None], e, 0.0)  # (P, len(k))
        den += e
        acc += tl.where(e == 0, 0.0, e * v)  # a gate of 0 adds nothing, not 0 · inf
    return den, acc


@_device_function
def _window_terms(z, n, i_d, i_h, i_w, qmask, t, c, cmask, y_ptr, go_ptr, stats_ptr, C, SC, R, OD, OH, OW,
                  KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, SHARED, HALF, LAST, GO_LAST, ACC):  # fmt: skip
    """The backward's term of tap t: for the window that reads input i there, the gate g_j (P, C; P, 1 for
    a shared score) from its stats, whether the window is finite, out and G (P, C), and whether there is
    such a window (P,)."""
    o_d, o_h, o_w, ok = _window_of(i_d, i_h, i_w, qmask, t, OD, OH, OW, KH, KW, SD, SH, SW, PD, PH, PW,
                                   DD, DH, DW)  # fmt: skip
    if SHARED:  # the window's stats: one per position (channel 0's where they are per channel)
        k = tl.zeros([1], tl.int64)
    else:
        k = c.to(tl.int64)
    kmask = ok[:, None] & (k < C)[None, :]
    wmask = ok[:, None] & cmask[None, :]
    po = (((n * OD + o_d) * OH + o_h) * OW + o_w)[:, None] * SC  # flat (n, o) · SC
    mo = tl.load(stats_ptr + po + k[None, :], mask=kmask, other=0.0).to(ACC)
    rd = tl.load(stats_ptr + R + po + k[None, :], mask=kmask, other=0.0).to(ACC)
    yo = _address(n, o_d, o_h, o_w, c, C, OD, OH, OW, LAST)
    y = tl.load(y_ptr + yo, mask=wmask, other=0.0).to(ACC)
    if GO_LAST != LAST:  # G in the other layout (out is in the values')
        yo = _address(n, o_d, o_h, o_w, c, C, OD, OH, OW, GO_LAST)
    go = tl.load(go_ptr + yo, mask=wmask, other=0.0).to(ACC)
    finite = (mo > float("-inf")) & (mo < float("inf"))
    if HALF:  # mo: the log-sum-exp of z; the second row: out's rounding to the half dtype
        if SHARED:
            r = tl.load(stats_ptr + R + po + c.to(tl.int64)[None, :], mask=wmask, other=0.0).to(ACC)
        else:
            r = rd
        y = y + tl.where(finite, r, 0.0)  # out as the forward computed it, before its rounding
        g = tl.exp(z - mo)
    else:  # mo: the window max m of z; rd = 1/den
        g = tl.exp(z - mo) * rd
    gate = tl.where(finite | (mo != mo), g, tl.where(z == mo, rd, 0.0))  # rd = 1/(taps at a top of ±inf)
    return tl.where(kmask, gate, 0.0), finite, y, go, ok


def _softmax_pool_forward(
    v_ptr, s_ptr, a_ptr, out_ptr, stats_ptr, C, TOTAL, ID, IH, IW, OD, OH, OW,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    SOFT: tl.constexpr, SHARED: tl.constexpr, A_PER_CHANNEL: tl.constexpr, HALF: tl.constexpr,
    LAST: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """One program per BLOCK_P flat (n, o) output positions (TOTAL = N · OS) × BLOCK_C channels."""
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # flat (n, o)  (P,)
    pmask = p < TOTAL
    n, od, oh, ow = _unflatten(p, OD, OH, OW)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # (C,)
    cmask = c < C
    a = _inverse_temperature(a_ptr, c, cmask, A_PER_CHANNEL, ACC)
    if SHARED:  # one score per position: (P, 1) lanes
        k = tl.zeros([1], tl.int32)
        kmask = k == 0
        CS = 1
    else:
        k = c
        kmask = cmask
        CS = C
    m, nan = _window_max(s_ptr, a, n, od, oh, ow, pmask, k, kmask, CS, ID, IH, IW,
                         KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, LAST, ACC)  # fmt: skip
    finite = (m > float("-inf")) & (m < float("inf"))  # else the limits: the taps at the top share the gate
    den, acc = _window_sums(v_ptr, s_ptr, a, m, finite, n, od, oh, ow, pmask, c, cmask, k, kmask,
                            C, CS, ID, IH, IW, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, SOFT, LAST,
                            ACC)  # fmt: skip
    out = acc / den
    out = tl.where(den == 0, float("-inf"), out)  # no input tap: −inf, as max pool
    out = tl.where(nan, float("nan"), out)
    rounded = out.to(out_ptr.dtype.element_ty)
    omask = pmask[:, None] & cmask[None, :]
    tl.store(out_ptr + _address(n, od, oh, ow, c, C, OD, OH, OW, LAST), rounded, mask=omask)
    m = tl.where(nan, float("nan"), m)
    if HALF:  # stats (2, N, *out, C): the log-sum-exp of z and out − rounded out (see the top)
        residual = tl.where(out == rounded.to(ACC), 0.0, out - rounded.to(ACC))  # (P, C)
        second = tl.where(finite, residual, 1.0 / den)  # ±inf at the top: 1/(taps there)
        first = tl.where(finite, m + tl.log(den), m) + tl.zeros_like(second)
        st = p[:, None] * C + c.to(tl.int64)[None, :]
        smask = omask
        R = TOTAL * C
    else:  # stats (2, N, *out, CS): the window max m of z and 1/den
        first = m
        second = 1.0 / den
        st = p[:, None] * CS + k.to(tl.int64)[None, :]
        smask = pmask[:, None] & kmask[None, :]
        if SHARED:  # the first channel block writes a shared score's stats
            smask = smask & (tl.program_id(1) == 0)
        R = TOTAL * CS
    tl.store(stats_ptr + st, first.to(stats_ptr.dtype.element_ty), mask=smask)
    tl.store(stats_ptr + R + st, second.to(stats_ptr.dtype.element_ty), mask=smask)


def _softmax_pool_backward(
    v_ptr, s_ptr, a_ptr, y_ptr, stats_ptr, go_ptr, gv_ptr, gs_ptr, gt_ptr, C, TOTAL, ID, IH, IW, OD, OH, OW,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    SOFT: tl.constexpr, A_PER_CHANNEL: tl.constexpr, TAU_GRAD: tl.constexpr, HALF: tl.constexpr,
    LAST: tl.constexpr, GO_LAST: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
    ACC: tl.constexpr,
):  # fmt: skip
    """A score per channel (soft pooling, or a (N, C, *spatial) score map in the values' layout): one
    program per BLOCK_P flat (n, i) input positions (TOTAL = N · IS) × BLOCK_C channels."""
    q = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # flat (n, i)  (P,)
    qmask = q < TOTAL
    n, i_d, i_h, i_w = _unflatten(q, ID, IH, IW)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    mask = qmask[:, None] & cmask[None, :]  # (P, C)
    a = _inverse_temperature(a_ptr, c, cmask, A_PER_CHANNEL, ACC)
    x = _address(n, i_d, i_h, i_w, c, C, ID, IH, IW, LAST)  # values, scores and their gradients
    v = tl.load(v_ptr + x, mask=mask, other=0.0).to(ACC)  # (P, C)
    if SOFT:
        s = v
    else:
        s = tl.load(s_ptr + x, mask=mask, other=0.0).to(ACC)
    z = a * s
    rd_at = TOTAL // (ID * IH * IW) * (OD * OH * OW) * C  # stats (2, N, *out, C): the second row
    gv = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    gs = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    ga = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    for t in tl.static_range(KD * KH * KW):
        gate, finite, y, go, ok = _window_terms(z, n, i_d, i_h, i_w, qmask, t, c, cmask, y_ptr, go_ptr,
                                                stats_ptr, C, C, rd_at, OD, OH, OW, KH, KW, SD, SH, SW,
                                                PD, PH, PW, DD, DH, DW, False, HALF, LAST, GO_LAST,
                                                ACC)  # fmt: skip
        gv += gate * go
        push = tl.where(finite & (gate != 0), gate * (v - y) * go, 0.0)  # g_j (v_j − out) G
        if SOFT:
            gv += a * push
        else:
            gs += a * push
        if TAU_GRAD:
            ga += tl.where(push != 0, push * s, 0.0)  # not 0 · inf
    tl.store(gv_ptr + x, gv.to(gv_ptr.dtype.element_ty), mask=mask)
    if not SOFT:
        tl.store(gs_ptr + x, gs.to(gs_ptr.dtype.element_ty), mask=mask)
    if TAU_GRAD:  # this program's partial sums of ∂L/∂τ = −a² ∂L/∂a, one per channel: (programs, C)
        tl.store(gt_ptr + tl.program_id(0).to(tl.int64) * C + c, tl.sum(ga * (-a * a), axis=0), mask=cmask)


def _softmax_pool_backward_shared(
    v_ptr, s_ptr, a_ptr, y_ptr, stats_ptr, go_ptr, gv_ptr, gs_ptr, gt_ptr, C, TOTAL, ID, IH, IW, OD, OH, OW,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    TAU_GRAD: tl.constexpr, HALF: tl.constexpr, LAST: tl.constexpr, GO_LAST: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """One score per position shared by the channels: program = input positions, looping over the channels."""
    q = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # flat (n, i)  (P,)
    qmask = q < TOTAL
    n, i_d, i_h, i_w = _unflatten(q, ID, IH, IW)
    a = tl.load(a_ptr).to(ACC)
    one = tl.zeros([1], tl.int32)
    xs = _address(n, i_d, i_h, i_w, one, 1, ID, IH, IW, LAST)  # the score and its gradient  (P, 1)
    s = tl.load(s_ptr + xs, mask=qmask[:, None], other=0.0).to(ACC)
    z = a * s
    if HALF:  # stats (2, N, *out, C or 1): the second row
        SC = C
    else:
        SC = 1
    rd_at = TOTAL // (ID * IH * IW) * (OD * OH * OW) * SC
    gs = tl.zeros([BLOCK_P, 1], ACC)
    ga = tl.zeros([BLOCK_P, 1], ACC)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        cmask = c < C
        mask = qmask[:, None] & cmask[None, :]
        x = _address(n, i_d, i_h, i_w, c, C, ID, IH, IW, LAST)
        v = tl.load(v_ptr + x, mask=mask, other=0.0).to(ACC)  # (P, C)
        gv = tl.zeros([BLOCK_P, BLOCK_C], ACC)
        for t in tl.static_range(KD * KH * KW):
            gate, finite, y, go, ok = _window_terms(z, n, i_d, i_h, i_w, qmask, t, c, cmask, y_ptr, go_ptr,
                                                    stats_ptr, C, SC, rd_at, OD, OH, OW, KH, KW, SD, SH,
                                                    SW, PD, PH, PW, DD, DH, DW, True, HALF, LAST,
                                                    GO_LAST, ACC)  # fmt: skip
            gv += gate * go  # gate (P, 1)
            dot = tl.sum(tl.where(ok[:, None] & cmask[None, :], (v - y) * go, 0.0), axis=1)[:, None]
            push = tl.where(finite & (gate != 0), gate * dot, 0.0)  # g_j Σ_c (v_j − out) G  (P, 1)
            gs += a * push
            if TAU_GRAD:
                ga += tl.where(push != 0, push * s, 0.0)
        tl.store(gv_ptr + x, gv.to(gv_ptr.dtype.element_ty), mask=mask)
    tl.store(gs_ptr + xs, gs.to(gs_ptr.dtype.element_ty), mask=qmask[:, None])
    if TAU_GRAD:
        tl.store(gt_ptr + tl.program_id(0), -a * a * tl.sum(tl.sum(ga, axis=1), axis=0))


@functools.lru_cache(maxsize=1)
def _kernels() -> types.SimpleNamespace:
    """The jit-wrapped kernels (``TRITON_INTERPRET`` is read now: the interpreter where it is set)."""
    if not available():
        raise RuntimeError("gatepool's Triton kernels need triton (pip install triton), and GATEPOOL_KERNELS "
                           "not 0; check gatepool.layers.triton_pool.available() first")  # fmt: skip
    global tl
    import triton
    import triton.language

    tl = triton.language
    for fn in _DEVICE_FUNCTIONS:  # the kernels find their helpers, jit-wrapped, under the same names
        globals()[fn.__name__] = triton.jit(fn)
    return types.SimpleNamespace(
        forward=triton.jit(_softmax_pool_forward),
        backward=triton.jit(_softmax_pool_backward),
        backward_shared=triton.jit(_softmax_pool_backward_shared),
        acc={torch.float64: tl.float64, torch.float32: tl.float32},
    )


# ------------------------------------------------------------------------------------------- launchers


@functools.lru_cache(maxsize=1024)
def _dense_strides(shape: tuple[int, ...], last: bool) -> tuple[int, ...]:
    """The strides of a dense ``(N, C, *S)`` tensor: channels-last memory (``last``) or contiguous."""
    order = (1, *range(len(shape) - 1, 1, -1), 0) if last else range(len(shape) - 1, -1, -1)
    strides, step = [0] * len(shape), 1
    for i in order:
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


def _is_dense(t: torch.Tensor, last: bool) -> bool:
    """Is ``t`` dense in that memory (read from its strides; a dimension of size 1 may have any stride)?"""
    shape, strides = t.shape, t.stride()
    want = _dense_strides(shape, last)
    return strides == want or t.numel() == 0 or all(n == 1 or s == w for n, s, w in zip(shape, strides, want))


def _dense(t: torch.Tensor, last: bool) -> torch.Tensor:
    """``t`` itself where it is dense in that memory, else a copy that is."""
    if _is_dense(t, last):
        return t
    return t.movedim(1, -1).contiguous().movedim(-1, 1) if last else t.contiguous()


def _layout(values: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``values`` dense (copied where it is neither channels-last nor contiguous); whether channels-last."""
    if _is_dense(values, True):
        return values, True
    return values.contiguous(), False


@functools.lru_cache(maxsize=1024)
def _constants(geo: PoolGeometry) -> dict[str, int]:
    """Kernel, stride, padding, dilation as 3-D compile-time constants (1-D and 2-D: leading 1, 1, 0, 1)."""
    lead = 3 - geo.dim
    args = {}
    for name, t, fill in (("K", geo.kernel_size, 1), ("S", geo.stride, 1), ("P", geo.padding, 0),
                          ("D", geo.dilation, 1)):  # fmt: skip
        for axis, value in zip("DHW", [fill] * lead + list(t)):
            args[name + axis] = value
    return args


@functools.lru_cache(maxsize=1024)
def _plan(geo: PoolGeometry, shape: tuple[int, ...], last: bool, dtype: torch.dtype, scores: str,
          per_channel: bool) -> types.SimpleNamespace:  # fmt: skip
    """One shape's launches, made once: out's and stats' shapes and strides, both grids, the sizes the
    kernels take and their compile-time constants. ``scores``: "soft" (s = v), "shared" or "map"."""
    n, c = shape[:2]
    lead = (1,) * (3 - geo.dim)
    out_shape = (n, c, *geo.out_size)
    positions_in = n * math.prod(geo.in_size)
    positions_out = n * math.prod(geo.out_size)
    block_c = min(64, _next_power_of_2(c))
    block_p = _TILE // block_c
    acc = compute_dtype(dtype)
    half = acc != dtype
    common = {**_constants(geo), "HALF": half, "LAST": last, "BLOCK_P": block_p, "BLOCK_C": block_c,
              "ACC": _kernels().acc[acc], **_LAUNCH}  # fmt: skip
    soft, shared = scores == "soft", scores == "shared"
    return types.SimpleNamespace(
        out=(out_shape, _dense_strides(out_shape, last)),
        stats=(2, n, *geo.out_size, 1 if shared and not half else c),
        acc=acc,
        sizes=(*lead, *geo.in_size, *lead, *geo.out_size),
        forward_grid=(_cdiv(positions_out, block_p), _cdiv(c, block_c)),
        forward_args=(c, positions_out),
        forward=dict(common, SOFT=soft, SHARED=shared, A_PER_CHANNEL=per_channel),
        programs=_cdiv(positions_in, block_p) if c else 0,  # C = 0: nothing to pool, nothing to launch
        backward_grid=(_cdiv(positions_in, block_p), 1 if shared else _cdiv(c, block_c)),
        backward_args=(c, positions_in),
        backward=common if shared else dict(common, SOFT=soft, A_PER_CHANNEL=per_channel),
    )


def _next_power_of_2(x: int) -> int:
    return 1 << (max(x, 1) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _device(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _prepare(values, scores, tau):
    """The kernels' operands: values and scores dense in one layout, whether channels-last, the score kind,
    whether τ is per channel."""
    values, last = _layout(values)
    shared = scores is not None and scores.shape[1] == 1 and values.shape[1] > 1
    kind = "soft" if scores is None else "shared" if shared else "map"
    scores = None if scores is None else _dense(scores, last)
    return values, scores, last, kind, tau.numel() > 1 and not shared


def forward(
    values: torch.Tensor, scores: torch.Tensor | None, tau: torch.Tensor, geo: PoolGeometry,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gatepool::softmax_pool`` on Triton: ``(out, stats)``, out ``(N, C, *out)`` in values' memory format
    and in ``dtype`` (default values'; float32 for half values keeps out unrounded: its residual is 0).

    ``values`` ``(N, C, *spatial)``; ``scores`` None (s = v), ``(N, 1, *spatial)`` (shared; τ then has one
    entry, as the C op: a[0]) or ``(N, C, *spatial)``; ``tau`` ``(1,)`` or ``(C,)``.
    """
    kernels = _kernels()
    values, scores, last, kind, per_channel = _prepare(values, scores, tau)
    plan = _plan(geo, tuple(values.shape), last, values.dtype, kind, per_channel)
    out = values.new_empty_strided(*plan.out, dtype=dtype or values.dtype)
    stats = values.new_empty(plan.stats, dtype=plan.acc)
    if out.numel():
        s = values if scores is None else scores
        with _device(values):
            kernels.forward[plan.forward_grid](
                values, s, inverse_temperature(tau, plan.acc), out, stats, *plan.forward_args, *plan.sizes,
                **plan.forward,
            )  # fmt: skip
    return out, stats


def backward(
    grad_out: torch.Tensor,
    values: torch.Tensor,
    scores: torch.Tensor | None,
    tau: torch.Tensor,
    out: torch.Tensor,
    stats: torch.Tensor,
    geo: PoolGeometry,
    tau_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``gatepool::softmax_pool_backward`` on Triton: ``(grad_values, grad_scores, grad_tau)``.

    As the C op: ``grad_scores`` is empty when ``scores`` is None, ``grad_tau`` empty unless ``tau_grad``.
    ``grad_out`` of any strides (read where it is dense in either memory, else copied, as max pool does).
    """
    kernels = _kernels()
    values, scores, last, kind, per_channel = _prepare(values, scores, tau)
    plan = _plan(geo, tuple(values.shape), last, values.dtype, kind, per_channel)
    gv = torch.empty_like(values)  # dense: values' strides
    gs = values.new_empty(0) if scores is None else torch.empty_like(scores)
    a = inverse_temperature(tau, plan.acc)
    if plan.programs:
        # ∂L/∂τ per program; without tau_grad the kernel never reads it: stats (of its dtype) stands in
        cs = 1 if kind == "shared" else values.shape[1]
        gt = values.new_empty((plan.programs, cs), dtype=plan.acc) if tau_grad else stats
        go_last = last if _is_dense(grad_out, last) else not last  # G read in either layout where dense
        operands = (values, values if scores is None else scores, a, _dense(out, last), stats.contiguous(),
                    _dense(grad_out, go_last), gv, gv if scores is None else gs, gt)  # fmt: skip
        kernel = kernels.backward_shared if kind == "shared" else kernels.backward
        with _device(values):
            kernel[plan.backward_grid](
                *operands, *plan.backward_args, *plan.sizes, TAU_GRAD=tau_grad, GO_LAST=go_last,
                **plan.backward,
            )  # fmt: skip
    if not tau_grad:
        return gv, gs, values.new_empty(0)
    if not plan.programs:
        return gv, gs, torch.zeros_like(tau)
    grad_tau = gt.sum(0) if per_channel else gt.view(-1).sum(0, keepdim=True)  # the programs' partial sums
    return gv, gs, grad_tau.to(tau.dtype)
