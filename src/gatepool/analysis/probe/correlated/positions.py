"""A field's covariance of positions, the (C, n, n) matrix K(p, q) = √v_p √v_q ρ(q − p) of a (C, H, W)
field (n = H·W), and the moments read back from it; the rules that are a matrix over the positions work
on it (adaptive pools, attentions over draws, the branch gain), and so does a depthwise conv where it is
the cheaper road: on a small map with a large kernel (ConvMixer's 7 × 7 on 9 × 9; the pairs of taps'
road, :class:`conv.Conv`, takes k(k + 1)/2 pairs of taps, each an FFT over the lags, 1,225 for 7 × 7).

Each output channel o reads one input channel i = src(o) through its kernel w_o, so y_o = A_o x_i with
A_o the (Ho·Wo, H·W) matrix of the conv (stride, zero padding: a tap in the padding reads nothing).
With the input's covariance of positions K_i:

forward    Cov(y_o) = A_o K_i A_oᵀ: the variance map its diagonal, the lag sums T_o(Δ) = Σ_P Cov(y_P, y_{P+Δ})
           over the pairs of output positions inside the map
backward   Cov(g_x,i) = Σ_{o: src(o) = i} A_oᵀ G_o A_o, G_o(P, Q) = √v_g,P √v_g,Q ρ_g,o(Q − P)

Exactly the sums the pairs' road computes (``tests/analysis/test_probe_positions.py`` holds the two
together); the cost C·(m·n² + m²·n) multiply-adds (m, n the output's and input's positions) against the
pairs' k²/2 FFTs over the lags per channel, :func:`cheaper` picks.
"""

from __future__ import annotations

import functools
import math

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums

_BYTES = 2**28  # the largest (C, n, n) covariance this road builds (256 MB)


@functools.lru_cache(maxsize=64)
def lag_index(H: int, W: int) -> torch.Tensor:
    """(H·W, H·W): the flat index into a (2H − 1, 2W − 1) lag map of q − p for positions p, q."""
    h, w = torch.arange(H).repeat_interleave(W), torch.arange(W).repeat(H)
    return (h[None, :] - h[:, None] + H - 1) * (2 * W - 1) + (w[None, :] - w[:, None] + W - 1)


def covariance(f: Field) -> torch.Tensor:
    """(C, H·W, H·W): Cov(x_p, x_q) = √(v_p v_q) ρ(q − p) of every pair of positions."""
    C, H, W = f.shape
    s = f.var.clamp_min(0).sqrt().reshape(C, -1)
    rho = f.corr.reshape(C, -1)[:, lag_index(H, W)]
    return s[:, :, None] * s[:, None, :] * rho


def moments(K: torch.Tensor, hw) -> tuple[torch.Tensor, torch.Tensor]:
    """(variance map (C, H, W), lag sums (C, 2H − 1, 2W − 1)) of a position covariance K (C, H·W, H·W)."""
    (H, W), C = hw, K.shape[0]
    var = torch.diagonal(K, dim1=1, dim2=2).reshape(C, H, W)
    T = torch.zeros((C, (2 * H - 1) * (2 * W - 1)), dtype=_DT)
    T.index_add_(1, lag_index(H, W).flatten(), K.reshape(C, -1))
    return var, T.reshape(C, 2 * H - 1, 2 * W - 1)


def from_covariance(mean: torch.Tensor, K: torch.Tensor) -> Field:
    """The state of a (C, H, W) map with mean ``mean`` and position covariance ``K`` (C, H·W, H·W)."""
    return _field_from_sums(mean, *moments(K, mean.shape[1:]))


@functools.lru_cache(maxsize=64)
def _taps_at(kh: int, kw: int, in_hw, out_hw, stride, padding):
    """(P, q, t): output position P reads input position q through tap t, for every tap inside the map."""
    (H, W), (Ho, Wo), (sh, sw), (ph, pw) = in_hw, out_hw, stride, padding
    P = torch.arange(Ho * Wo).repeat_interleave(kh * kw)
    t = torch.arange(kh * kw).repeat(Ho * Wo)
    qh = sh * (P // Wo) + t // kw - ph
    qw = sw * (P % Wo) + t % kw - pw
    inside = (qh >= 0) & (qh < H) & (qw >= 0) & (qw < W)
    return P[inside], (qh * W + qw)[inside], t[inside]


def conv_matrix(w: torch.Tensor, in_hw, out_hw, stride, padding) -> torch.Tensor:
    """(Co, Ho·Wo, H·W): each output channel's conv as a matrix, from its kernels w (Co, kh, kw), or
    from tap weights that depend on the output position too, w (Co, kh, kw, Ho, Wo) (a stencil's)."""
    kh, kw = w.shape[1:3]
    P, q, t = _taps_at(kh, kw, tuple(in_hw), tuple(out_hw), tuple(stride), tuple(padding))
    A = torch.zeros((w.shape[0], out_hw[0] * out_hw[1], in_hw[0] * in_hw[1]), dtype=_DT)
    w = w.flatten(1, 2)  # (Co, k) or (Co, k, Ho, Wo)
    A[:, P, q] = w[:, t] if w.dim() == 2 else w.flatten(2)[:, t, P]  # each (P, q) is reached by one tap
    return A


def conv_forward(A: torch.Tensor, src: torch.Tensor, x: Field, out_hw):
    """A depthwise conv's output (variance map, lag sums): A (Co, Ho·Wo, H·W) each output channel's
    matrix (:func:`conv_matrix`) on its input channel src (Co,)."""
    return moments(A @ covariance(x)[src] @ A.transpose(1, 2), out_hw)


def conv_backward(A: torch.Tensor, src: torch.Tensor, channels: int, g: Field, in_hw):
    """A depthwise conv's input gradient (variance map, lag sums) from the output's gradient ``g``."""
    per_out = A.transpose(1, 2) @ covariance(g) @ A  # (Co, n, n)
    n = in_hw[0] * in_hw[1]
    cov = torch.zeros((channels, n, n), dtype=_DT).index_add_(0, src, per_out)
    return moments(cov, in_hw)


def cheaper(channels: int, k: int, in_hw, out_hw) -> bool:
    """Whether this road costs less than the pairs of taps', within its memory. A pair's FFT over the lags
    counted at 16 (4 + log₂ lags) a lag, as measured against this road's matrix products (2-core AMD EPYC,
    float64, twelve depthwise forwards from a 3 × 3 on 32 × 32 to a 7 × 7 on 9 × 9: right on all twelve,
    this road 2–180× the faster where taken, the pairs' 7–44× where not)."""
    n, m = in_hw[0] * in_hw[1], out_hw[0] * out_hw[1]
    if channels * max(n, m) ** 2 * 8 > _BYTES:
        return False
    lags = (2 * out_hw[0] - 1) * (2 * out_hw[1] - 1)
    pairs = k * (k + 1) / 2 * lags * 16 * (4 + math.log2(lags))
    return m * n * (n + m) < pairs
