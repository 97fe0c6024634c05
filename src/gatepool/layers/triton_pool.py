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
dtype. Their backward runs the forward once more for out in float32 instead of reading the rounded out:
∂L/∂a sums terms g_j (v_j − out) s_j G that cancel, so out rounded to the half dtype would carry its
rounding error into ∂τ many times over.
Non-finite windows take the plain path's limits (``windows.window_softmax``): a NaN makes its
window NaN; a top score of ±inf shares the gate among the taps at the top (and gives no score or τ
gradient); a tap of −inf beside finite ones gets gate 0 (and adds nothing: not 0 · inf); a window with no
input tap gives −inf.

Kernels (1-D and 2-D run as 3-D with leading sizes of 1; any strides, so NCHW and channels_last alike):

  * forward: one program per block of BLOCK_P flat (n, o) output positions × BLOCK_C channels; two
    passes over the K taps (unrolled: kernel, stride, padding and dilation are compile-time constants),
    the max, then the exp, den and Σ e v. With a shared score a program recomputes the score softmax for
    its channel block (the scores are one per position), and the first channel block writes the stats.
  * backward: a gather, one program per block of flat (n, i) *input* positions: for each tap t the window
    that reads i at t (o = (i + p − t·dl)/s where that is a whole number inside the output) gives its
    term, recomputed from the saved m, 1/den, out and G. Each gradient is written once, by one program
    (no atomics, no zeroing, deterministic; inputs no window reads get 0), however the windows overlap.
    With a shared score a program loops over all the channels (the score gradient sums over them). ∂L/∂a:
    one partial sum per program (and channel), summed afterwards by torch, in a fixed order.

``stats`` is ``(2, N, *out, C or 1)`` as the C op's: the window max m of z and 1/den. Where the C kernel
marks a window it redid by the limits with m = NaN, this one keeps m itself (±inf, NaN for a NaN window)
and 1/den over the taps at the top: each backward reads only its own forward's stats.

triton is imported on first use (the kernels are jit-wrapped then); :func:`available` says whether it
can be (``GATEPOOL_KERNELS=0`` turns these kernels off too). ``TRITON_INTERPRET=1``, set before triton is
first imported, runs them on CPU tensors: the tests do that where no GPU is.
"""

import contextlib  # no ``from __future__ import annotations``: the kernels' tl.constexpr must be evaluated
import functools
import importlib.util
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


def _softmax_pool_forward(
    v_ptr, s_ptr, a_ptr, out_ptr, stats_ptr,
    C, TOTAL, RD_AT, ID, IH, IW, OD, OH, OW,
    svn, svc, svd, svh, svw,
    ssn, ssc, ssd, ssh, ssw,
    son, soc, sod, soh, sow,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    SOFT: tl.constexpr, SHARED: tl.constexpr, A_PER_CHANNEL: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    OS = OD * OH * OW
    p = pid_p.to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # flat (n, o)  (P,)
    pmask = p < TOTAL  # TOTAL = N · OS, RD_AT = N · OS · (C or 1): int64 where they need it
    n = p // OS
    o = p % OS
    od = o // (OH * OW)
    oh = (o // OW) % OH
    ow = o % OW
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)  # (C,)
    cmask = c < C
    if SHARED:  # one score per position: (P, 1) lanes
        s_c = tl.zeros([BLOCK_S], dtype=tl.int64)
        s_cmask = s_c == 0
        st_c = s_c
    else:
        s_c = c.to(tl.int64) * ssc
        s_cmask = cmask
        st_c = c.to(tl.int64)
    if A_PER_CHANNEL:
        a = tl.load(a_ptr + c, mask=cmask, other=1.0).to(ACC)[None, :]  # (1, C)
    else:
        a = tl.load(a_ptr).to(ACC)
    v_c = c.to(tl.int64) * svc
    # pass 1: the window max of z (P, S), and whether a NaN is in the window
    m = tl.full([BLOCK_P, BLOCK_S], float("-inf"), ACC)
    nan = m != m
    for kd in tl.static_range(KD):
        i_d = od * SD - PD + kd * DD
        ok_d = pmask & (i_d >= 0) & (i_d < ID)
        for kh in tl.static_range(KH):
            i_h = oh * SH - PH + kh * DH
            ok_h = ok_d & (i_h >= 0) & (i_h < IH)
            for kw in tl.static_range(KW):
                i_w = ow * SW - PW + kw * DW
                ok = ok_h & (i_w >= 0) & (i_w < IW)  # (P,)
                if SOFT:
                    off = n * svn + i_d * svd + i_h * svh + i_w * svw
                    s = tl.load(s_ptr + off[:, None] + v_c[None, :], mask=ok[:, None] & cmask[None, :],
                                other=float("-inf"))  # fmt: skip
                else:
                    off = n * ssn + i_d * ssd + i_h * ssh + i_w * ssw
                    s = tl.load(s_ptr + off[:, None] + s_c[None, :], mask=ok[:, None] & s_cmask[None, :],
                                other=float("-inf"))  # fmt: skip
                z = a * s.to(ACC)  # (P, S)
                nan = nan | (z != z)
                m = tl.where(z > m, z, m)
    finite = (m > float("-inf")) & (m < float("inf"))  # else the limits: the taps at the top share the gate
    # pass 2: den = Σ e_j, acc = Σ e_j v_j
    den = tl.zeros([BLOCK_P, BLOCK_S], ACC)
    acc = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    for kd in tl.static_range(KD):
        i_d = od * SD - PD + kd * DD
        ok_d = pmask & (i_d >= 0) & (i_d < ID)
        for kh in tl.static_range(KH):
            i_h = oh * SH - PH + kh * DH
            ok_h = ok_d & (i_h >= 0) & (i_h < IH)
            for kw in tl.static_range(KW):
                i_w = ow * SW - PW + kw * DW
                ok = ok_h & (i_w >= 0) & (i_w < IW)
                off = n * svn + i_d * svd + i_h * svh + i_w * svw
                vmask = ok[:, None] & cmask[None, :]
                v = tl.load(v_ptr + off[:, None] + v_c[None, :], mask=vmask, other=0.0).to(ACC)  # (P, C)
                if SOFT:
                    s = tl.where(vmask, v, float("-inf"))
                else:
                    s_off = n * ssn + i_d * ssd + i_h * ssh + i_w * ssw
                    s = tl.load(s_ptr + s_off[:, None] + s_c[None, :], mask=ok[:, None] & s_cmask[None, :],
                                other=float("-inf")).to(ACC)  # fmt: skip
                z = a * s
                e = tl.where(finite, tl.exp(z - m), tl.where(z == m, 1.0, 0.0))
                e = tl.where(ok[:, None], e, 0.0)  # (P, S)
                den += e
                acc += tl.where(e == 0, 0.0, e * v)  # a gate of 0 adds nothing, not 0 · inf
    out = acc / den
    out = tl.where(den == 0, float("-inf"), out)  # no input tap: −inf, as max pool
    out = tl.where(nan, float("nan"), out)
    y_off = n * son + od * sod + oh * soh + ow * sow
    tl.store(out_ptr + y_off[:, None] + c.to(tl.int64)[None, :] * soc,
             out.to(out_ptr.dtype.element_ty), mask=pmask[:, None] & cmask[None, :])  # fmt: skip
    m = tl.where(nan, float("nan"), m)
    stats_mask = pmask[:, None] & s_cmask[None, :]
    if SHARED:
        stats_mask = stats_mask & (pid_c == 0)
    if SHARED:
        st = p[:, None] + st_c[None, :]
    else:
        st = p[:, None] * C + st_c[None, :]
    tl.store(stats_ptr + st, m.to(stats_ptr.dtype.element_ty), mask=stats_mask)
    tl.store(stats_ptr + RD_AT + st, (1.0 / den).to(stats_ptr.dtype.element_ty), mask=stats_mask)


def _softmax_pool_backward(
    v_ptr, s_ptr, a_ptr, y_ptr, stats_ptr, go_ptr, gv_ptr, gs_ptr, ga_ptr,
    C, TOTAL, RD_AT, ID, IH, IW, OD, OH, OW,
    svn, svc, svd, svh, svw,
    ssn, ssc, ssd, ssh, ssw,
    syn, syc, syd, syh, syw,
    sgn, sgc, sgd, sgh, sgw,
    gvn, gvc, gvd, gvh, gvw,
    gsn, gsc, gsd, gsh, gsw,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    SOFT: tl.constexpr, A_PER_CHANNEL: tl.constexpr, TAU_GRAD: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """A score per channel (soft pooling, or a (N, C, *spatial) score map): input positions × channels."""
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    IS = ID * IH * IW
    OS = OD * OH * OW
    q = pid_p.to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # flat (n, i)  (P,)
    qmask = q < TOTAL  # TOTAL = N · IS, RD_AT = N · OS · (C or 1)
    n = q // IS
    i = q % IS
    i_d = i // (IH * IW)
    i_h = (i // IW) % IH
    i_w = i % IW
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    c64 = c.to(tl.int64)
    mask = qmask[:, None] & cmask[None, :]  # (P, C)
    if A_PER_CHANNEL:
        a = tl.load(a_ptr + c, mask=cmask, other=1.0).to(ACC)[None, :]
    else:
        a = tl.load(a_ptr).to(ACC)
    v_off = n * svn + i_d * svd + i_h * svh + i_w * svw
    v = tl.load(v_ptr + v_off[:, None] + c64[None, :] * svc, mask=mask, other=0.0).to(ACC)  # (P, C)
    if SOFT:
        s = v
    else:
        s_off = n * ssn + i_d * ssd + i_h * ssh + i_w * ssw
        s = tl.load(s_ptr + s_off[:, None] + c64[None, :] * ssc, mask=mask, other=0.0).to(ACC)
    z = a * s
    gv = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    gs = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    ga = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    for kd in tl.static_range(KD):
        t_d = i_d + PD - kd * DD  # o_d · SD for the window that reads i at this tap
        o_d = t_d // SD
        ok_d = qmask & (t_d >= 0) & (t_d % SD == 0) & (o_d < OD)
        for kh in tl.static_range(KH):
            t_h = i_h + PH - kh * DH
            o_h = t_h // SH
            ok_h = ok_d & (t_h >= 0) & (t_h % SH == 0) & (o_h < OH)
            for kw in tl.static_range(KW):
                t_w = i_w + PW - kw * DW
                o_w = t_w // SW
                ok = ok_h & (t_w >= 0) & (t_w % SW == 0) & (o_w < OW)  # (P,)
                wmask = ok[:, None] & cmask[None, :]
                po = n * OS + (o_d * OH + o_h) * OW + o_w  # flat (n, o)
                st = po[:, None] * C + c64[None, :]
                mo = tl.load(stats_ptr + st, mask=wmask, other=0.0).to(ACC)
                rd = tl.load(stats_ptr + RD_AT + st, mask=wmask, other=0.0).to(ACC)
                y_off = n * syn + o_d * syd + o_h * syh + o_w * syw
                y = tl.load(y_ptr + y_off[:, None] + c64[None, :] * syc, mask=wmask, other=0.0).to(ACC)
                g_off = n * sgn + o_d * sgd + o_h * sgh + o_w * sgw
                go = tl.load(go_ptr + g_off[:, None] + c64[None, :] * sgc, mask=wmask, other=0.0).to(ACC)
                finite = (mo > float("-inf")) & (mo < float("inf"))
                gate = tl.where(finite | (mo != mo), tl.exp(z - mo) * rd, tl.where(z == mo, rd, 0.0))
                gate = tl.where(wmask, gate, 0.0)
                gv += gate * go
                push = tl.where(finite & (gate != 0), gate * (v - y) * go, 0.0)  # g_j (v_j − out) G
                if SOFT:
                    gv += a * push
                else:
                    gs += a * push
                if TAU_GRAD:
                    ga += tl.where(push != 0, push * s, 0.0)  # not 0 · inf
    gv_off = n * gvn + i_d * gvd + i_h * gvh + i_w * gvw
    tl.store(gv_ptr + gv_off[:, None] + c64[None, :] * gvc, gv.to(gv_ptr.dtype.element_ty), mask=mask)
    if not SOFT:
        gs_off = n * gsn + i_d * gsd + i_h * gsh + i_w * gsw
        tl.store(gs_ptr + gs_off[:, None] + c64[None, :] * gsc, gs.to(gs_ptr.dtype.element_ty), mask=mask)
    if TAU_GRAD:  # this program's partial sums of ∂L/∂a, one per channel: (programs, C)
        tl.store(ga_ptr + pid_p.to(tl.int64) * C + c64, tl.sum(ga, axis=0), mask=cmask)


def _softmax_pool_backward_shared(
    v_ptr, s_ptr, a_ptr, y_ptr, stats_ptr, go_ptr, gv_ptr, gs_ptr, ga_ptr,
    C, TOTAL, RD_AT, ID, IH, IW, OD, OH, OW,
    svn, svc, svd, svh, svw,
    ssn, ssc, ssd, ssh, ssw,
    syn, syc, syd, syh, syw,
    sgn, sgc, sgd, sgh, sgw,
    gvn, gvc, gvd, gvh, gvw,
    gsn, gsc, gsd, gsh, gsw,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PD: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    TAU_GRAD: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """One score per position shared by the channels: program = input positions, looping over the channels."""
    pid_p = tl.program_id(0)
    IS = ID * IH * IW
    OS = OD * OH * OW
    q = pid_p.to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)  # flat (n, i)  (P,)
    qmask = q < TOTAL  # TOTAL = N · IS, RD_AT = N · OS · (C or 1)
    n = q // IS
    i = q % IS
    i_d = i // (IH * IW)
    i_h = (i // IW) % IH
    i_w = i % IW
    a = tl.load(a_ptr).to(ACC)
    s_off = n * ssn + i_d * ssd + i_h * ssh + i_w * ssw
    s = tl.load(s_ptr + s_off, mask=qmask, other=0.0).to(ACC)[:, None]  # (P, 1)
    z = a * s
    v_off = n * svn + i_d * svd + i_h * svh + i_w * svw
    gv_off = n * gvn + i_d * gvd + i_h * gvh + i_w * gvw
    gs = tl.zeros([BLOCK_P, 1], ACC)
    ga = tl.zeros([BLOCK_P, 1], ACC)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        cmask = c < C
        c64 = c.to(tl.int64)
        mask = qmask[:, None] & cmask[None, :]
        v = tl.load(v_ptr + v_off[:, None] + c64[None, :] * svc, mask=mask, other=0.0).to(ACC)  # (P, C)
        gv = tl.zeros([BLOCK_P, BLOCK_C], ACC)
        for kd in tl.static_range(KD):
            t_d = i_d + PD - kd * DD
            o_d = t_d // SD
            ok_d = qmask & (t_d >= 0) & (t_d % SD == 0) & (o_d < OD)
            for kh in tl.static_range(KH):
                t_h = i_h + PH - kh * DH
                o_h = t_h // SH
                ok_h = ok_d & (t_h >= 0) & (t_h % SH == 0) & (o_h < OH)
                for kw in tl.static_range(KW):
                    t_w = i_w + PW - kw * DW
                    o_w = t_w // SW
                    ok = ok_h & (t_w >= 0) & (t_w % SW == 0) & (o_w < OW)  # (P,)
                    wmask = ok[:, None] & cmask[None, :]
                    po = n * OS + (o_d * OH + o_h) * OW + o_w
                    mo = tl.load(stats_ptr + po, mask=ok, other=0.0).to(ACC)[:, None]  # (P, 1)
                    rd = tl.load(stats_ptr + RD_AT + po, mask=ok, other=0.0).to(ACC)[:, None]
                    y_off = n * syn + o_d * syd + o_h * syh + o_w * syw
                    y = tl.load(y_ptr + y_off[:, None] + c64[None, :] * syc, mask=wmask, other=0.0).to(ACC)
                    g_off = n * sgn + o_d * sgd + o_h * sgh + o_w * sgw
                    go = tl.load(go_ptr + g_off[:, None] + c64[None, :] * sgc, mask=wmask, other=0.0).to(ACC)
                    finite = (mo > float("-inf")) & (mo < float("inf"))
                    gate = tl.where(finite | (mo != mo), tl.exp(z - mo) * rd, tl.where(z == mo, rd, 0.0))
                    gate = tl.where(ok[:, None], gate, 0.0)  # (P, 1)
                    gv += gate * go
                    dot = tl.sum(tl.where(wmask, (v - y) * go, 0.0), axis=1)[:, None]  # Σ_c (v_j − out) G
                    push = tl.where(finite & (gate != 0), gate * dot, 0.0)  # (P, 1)
                    gs += a * push
                    if TAU_GRAD:
                        ga += tl.where(push != 0, push * s, 0.0)
        tl.store(gv_ptr + gv_off[:, None] + c64[None, :] * gvc, gv.to(gv_ptr.dtype.element_ty), mask=mask)
    gs_off = n * gsn + i_d * gsd + i_h * gsh + i_w * gsw
    tl.store(gs_ptr + gs_off[:, None], gs.to(gs_ptr.dtype.element_ty), mask=qmask[:, None])
    if TAU_GRAD:
        tl.store(ga_ptr + pid_p, tl.sum(tl.sum(ga, axis=1), axis=0))


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

    return types.SimpleNamespace(
        forward=triton.jit(_softmax_pool_forward),
        backward=triton.jit(_softmax_pool_backward),
        backward_shared=triton.jit(_softmax_pool_backward_shared),
        acc={torch.float64: tl.float64, torch.float32: tl.float32},
    )


# ------------------------------------------------------------------------------------------- launchers


def _strides(t: torch.Tensor | None, d: int) -> list[int]:
    """The strides of ``t`` ``(N, C, *S)`` as a ``(N, C, D, H, W)`` tensor: the leading spatial sizes of 1
    (d < 3) take stride 0, as their index is always 0 (read from the strides: no view made)."""
    if t is None:
        return [0] * 5
    strides = t.stride()
    return [strides[0], strides[1], *[0] * (3 - d), *strides[2:]]


@functools.lru_cache(maxsize=1024)
def _window_args(geo: PoolGeometry) -> dict[str, int]:
    """Kernel, stride, padding, dilation as 3-D compile-time constants (1-D and 2-D: leading 1, 1, 0, 1)."""
    lead = 3 - geo.dim
    args = {}
    for name, t, fill in (("K", geo.kernel_size, 1), ("S", geo.stride, 1), ("P", geo.padding, 0),
                          ("D", geo.dilation, 1)):  # fmt: skip
        for axis, value in zip("DHW", [fill] * lead + list(t)):
            args[name + axis] = value
    return args


@functools.lru_cache(maxsize=1024)
def _sizes(geo: PoolGeometry) -> tuple[int, ...]:
    lead = 3 - geo.dim
    return (1,) * lead + geo.in_size + (1,) * lead + geo.out_size


def _like_values(values: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An empty ``(N, C, *out)`` in the memory format the ops give: channels-last for channels-last values."""
    if values.movedim(1, -1).is_contiguous():
        return values.new_empty((shape[0], *shape[2:], shape[1]), dtype=dtype).movedim(-1, 1)
    return values.new_empty(shape, dtype=dtype)


def _blocks(c: int) -> tuple[int, int]:
    block_c = min(64, _next_power_of_2(c))
    return _TILE // block_c, block_c


def _next_power_of_2(x: int) -> int:
    return 1 << (max(x, 1) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _device(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def forward(
    values: torch.Tensor,
    scores: torch.Tensor | None,
    tau: torch.Tensor,
    geo: PoolGeometry,
    *,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gatepool::softmax_pool`` on Triton: ``(out, stats)``, out ``(N, C, *out)`` in values' memory format.

    ``values`` ``(N, C, *spatial)``; ``scores`` None (s = v), ``(N, 1, *spatial)`` (shared; τ then has one
    entry, as the C op: a[0]) or ``(N, C, *spatial)``; ``tau`` ``(1,)`` or ``(C,)``; ``dtype`` out's, values'
    by default (the backward asks for the compute dtype).
    """
    kernels = _kernels()
    n, c = values.shape[:2]
    shared = scores is not None and scores.shape[1] == 1 and c > 1
    cs = 1 if shared else c
    acc_dtype = compute_dtype(values.dtype)
    out = _like_values(values, (n, c, *geo.out_size), dtype or values.dtype)
    stats = values.new_empty((2, n, *geo.out_size, cs), dtype=acc_dtype)
    if out.numel() == 0:
        return out, stats
    a = inverse_temperature(tau, acc_dtype)
    per_channel = a.numel() > 1 and not shared
    block_p, block_c = _blocks(c)
    d = geo.dim
    positions = n * (out.numel() // (n * c))
    grid = (_cdiv(positions, block_p), _cdiv(c, block_c))
    s = values if scores is None else scores
    with _device(values):
        kernels.forward[grid](
            values, s, a, out, stats, c, positions, positions * cs, *_sizes(geo),
            *_strides(values, d), *_strides(s, d), *_strides(out, d), **_window_args(geo),
            SOFT=scores is None, SHARED=shared, A_PER_CHANNEL=per_channel,
            BLOCK_P=block_p, BLOCK_C=block_c, BLOCK_S=1 if shared else block_c, ACC=kernels.acc[acc_dtype],
            **_LAUNCH,
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
    """
    kernels = _kernels()
    n, c = values.shape[:2]
    shared = scores is not None and scores.shape[1] == 1 and c > 1
    acc_dtype = compute_dtype(values.dtype)
    gv = torch.empty_like(values)
    gs = values.new_empty(0) if scores is None else torch.empty_like(scores)
    a = inverse_temperature(tau, acc_dtype)
    per_channel = a.numel() > 1 and not shared
    block_p, block_c = _blocks(c)
    d = geo.dim
    positions = values.numel() // c if c else 0  # C = 0: nothing to pool, nothing to launch
    programs = _cdiv(positions, block_p)
    if positions and out.dtype != acc_dtype:  # fp16/bf16: out again, unrounded, for (v_j − out) (see top)
        out = forward(values, scores, tau, geo, dtype=acc_dtype)[0]
    # ∂L/∂a per program; without tau_grad the kernel never reads it: stats (of its dtype) stands in
    ga = values.new_zeros((programs, 1 if shared else c), dtype=acc_dtype) if tau_grad else stats
    if positions:
        stats = stats.contiguous()
        s = values if scores is None else scores
        gs_arg = gv if scores is None else gs
        rd_at = stats.numel() // 2
        common = (values, s, a, out, stats, grad_out, gv, gs_arg, ga, c, positions, rd_at, *_sizes(geo),
                  *_strides(values, d), *_strides(s, d), *_strides(out, d), *_strides(grad_out, d),
                  *_strides(gv, d), *_strides(gs_arg, d))  # fmt: skip
        with _device(values):
            if shared:
                kernels.backward_shared[(programs,)](
                    *common, **_window_args(geo), TAU_GRAD=tau_grad, BLOCK_P=block_p, BLOCK_C=block_c,
                    ACC=kernels.acc[acc_dtype], **_LAUNCH,
                )  # fmt: skip
            else:
                kernels.backward[(programs, _cdiv(c, block_c))](
                    *common, **_window_args(geo), SOFT=scores is None, A_PER_CHANNEL=per_channel,
                    TAU_GRAD=tau_grad, BLOCK_P=block_p, BLOCK_C=block_c, ACC=kernels.acc[acc_dtype],
                    **_LAUNCH,
                )  # fmt: skip
    if not tau_grad:
        return gv, gs, values.new_empty(0)
    total = ga.sum(0)  # ∂L/∂a per channel (or per shared score)
    if not per_channel:
        total = total.sum().reshape(1)
    return gv, gs, (-total * a * a).to(tau.dtype)  # ∂L/∂τ = −∂L/∂a / τ²
