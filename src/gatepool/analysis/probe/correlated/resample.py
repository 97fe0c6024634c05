"""A map resized by ``F.interpolate`` / ``nn.Upsample`` (HRNet's fuse layers: nearest × 2, × 4): every
mode of torch is a linear map of the positions, y = A x, and A is torch's own, read off by resizing the
map's H·W unit maps (an exact copy of its index rounding, corner alignment and antialias).

forward   m_out = A m; per channel Cov_out = A Cov_in Aᵀ with Cov_in(p, q) = √(v_p v_q) ρ(q − p), the
          variance map its diagonal, the lag sums T(Δ) = Σ_P Cov_out(P, P + Δ) (as the adaptive pool's
          window matrix, :mod:`adaptive`)
backward  g_in = Aᵀ g: Cov = Aᵀ Cov_g A, the same sums

A map larger than that (CrossViT's 64 × 64 input resized to 240 × 240: A would be 57,600 × 4,096) is
resized separably, A = A_H ⊗ A_W (every mode of torch: each output's weights a product of one weight per
axis, checked on a random map), each axis a small matrix, and the output's state taken from the input's
covariance K(i, j; k, l) = Cov(x_ij, x_kl) (H·W × H·W) without A:

    T(Δ) = Σ K(i, j; k, l) B_H(i, k; Δ_h) B_W(j, l; Δ_w),   B(i, k; δ) = Σ_a A[a, i] A[a + δ, k]
    v(a, b) = Σ K(i, j; k, l) A_H[a, i] A_H[a, k] A_W[b, j] A_W[b, l]

(the pairs (i, k) of rows against the pairs (j, l) of columns: two matrix products per channel). Its
backward would need the output gradient's covariance over the large map's pairs: not predicted (the
input's gradient has none).

:class:`PositionMap` is that for a given A: PoolFormer's ``pool(x) − x``, one map A − I of x.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.adaptive import _MAX_POSITIONS, AdaptiveAvgPool
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums
from gatepool.analysis.probe.correlated.positions import covariance, from_covariance, lag_index
from gatepool.analysis.probe.correlated.registry import register_correlated_rule

_MAX_SEPARABLE = 4096  # the input's H·W at most for a separable resize: its (H·W, H·W) covariance


class Interpolate(AdaptiveAvgPool):
    """``F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)`` of
    a (C, H, W) field, the arguments torch's."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                 recompute_scale_factor=None, antialias: bool = False) -> None:  # fmt: skip
        if (size is None) == (scale_factor is None):
            raise ValueError("one of size and scale_factor must be given")
        self.kwargs = dict(size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                           recompute_scale_factor=recompute_scale_factor, antialias=antialias)  # fmt: skip
        F.interpolate(torch.zeros(1, 1, 4, 4), **self.kwargs)  # torch's own errors for its arguments

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        Ho, Wo = F.interpolate(torch.zeros(1, 1, H, W, dtype=_DT), **self.kwargs).shape[-2:]
        if max(H * W, Ho * Wo) > _MAX_POSITIONS:
            return self._separable(x, Ho, Wo)
        unit = torch.eye(H * W, dtype=_DT).reshape(H * W, 1, H, W)
        out = F.interpolate(unit, **self.kwargs)  # (H·W, 1, Ho, Wo): the image of each input position
        self.in_hw, self.A = (H, W), out.reshape(H * W, Ho * Wo).T  # (Ho·Wo, H·W)
        mean = (x.mean.reshape(C, -1) @ self.A.T).reshape(C, Ho, Wo)
        return from_covariance(mean, self.A @ covariance(x) @ self.A.T)

    def _axes(self, H: int, W: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(A_H (Ho, H), A_W (Wo, W)) with torch's resize of every H × W map A_H X A_Wᵀ: A_H from the unit
        rows (each output's weights sum to 1 along the other axis), A_W from the unit columns."""
        rows = F.interpolate(torch.eye(H, dtype=_DT)[:, None, :, None].expand(H, 1, H, W), **self.kwargs)
        cols = F.interpolate(torch.eye(W, dtype=_DT)[:, None, None, :].expand(W, 1, H, W), **self.kwargs)
        Ah, Aw = rows[:, 0, :, 0].T, cols[:, 0, 0, :].T
        X = torch.randn((1, 1, H, W), dtype=_DT, generator=torch.Generator().manual_seed(0))
        if not torch.allclose(F.interpolate(X, **self.kwargs)[0, 0], Ah @ X[0, 0] @ Aw.T, rtol=0, atol=1e-12):
            raise NotImplementedError(f"interpolate {self.kwargs['mode']}: not one matrix per axis")
        return Ah, Aw

    def _separable(self, x: Field, Ho: int, Wo: int) -> Field:
        """The resize of a map past :data:`_MAX_POSITIONS` through A_H and A_W (see the module docstring)."""
        C, H, W = x.shape
        if H * W > _MAX_SEPARABLE:
            raise NotImplementedError(
                f"interpolate {H}×{W} → {Ho}×{Wo}: at most {_MAX_SEPARABLE} positions in"
            )
        Ah, Aw = self._axes(H, W)
        self.in_hw, self.A = (H, W), None
        Bh, Gh = _pairs(Ah), _squares(Ah)  # (H·H, 2Ho − 1), (H·H, Ho)
        right = torch.cat((_pairs(Aw), _squares(Aw)), 1)  # (W·W, 2Wo − 1 + Wo)
        lag = lag_index(H, W)
        T = torch.empty((C, 2 * Ho - 1, 2 * Wo - 1), dtype=_DT)
        var = torch.empty((C, Ho, Wo), dtype=_DT)
        for c in range(C):
            s = x.var[c].clamp_min(0).sqrt().reshape(-1)
            K = s[:, None] * s[None, :] * x.corr[c].reshape(-1)[lag]  # (i j, k l)
            K = K.reshape(H, W, H, W).permute(0, 2, 1, 3).reshape(H * H, W * W)  # (i k, j l)
            R = K @ right
            T[c], var[c] = Bh.T @ R[:, : 2 * Wo - 1], Gh.T @ R[:, 2 * Wo - 1 :]
        mean = Ah @ x.mean @ Aw.T
        return _field_from_sums(mean, var, T)

    def backward(self, g: Field) -> Field | None:
        return None if self.A is None else super().backward(g)


def _pairs(A: torch.Tensor) -> torch.Tensor:
    """B(i, k; δ) = Σ_a A[a, i] A[a + δ, k] for δ = −(o − 1) … o − 1: (n·n, 2o − 1) of an (o, n) matrix."""
    o, n = A.shape
    B = torch.zeros((n, n, 2 * o - 1), dtype=_DT)
    for d in range(-(o - 1), o):
        B[:, :, o - 1 + d] = A[max(0, -d) : o - max(0, d)].T @ A[max(0, d) : o - max(0, -d)]
    return B.reshape(n * n, 2 * o - 1)


def _squares(A: torch.Tensor) -> torch.Tensor:
    """G(i, k; a) = A[a, i] A[a, k]: (n·n, o)."""
    o, n = A.shape
    return (A.T[:, None, :] * A.T[None, :, :]).reshape(n * n, o)


class PositionMap(AdaptiveAvgPool):
    """y = M x at every channel, M (Ho·Wo, H·W) a fixed matrix of the positions: PoolFormer's
    ``pool(x) − x`` as one map (A − I) of x, where the two terms, both of x, are not independent."""

    def __init__(self, matrix: torch.Tensor, out_hw: tuple[int, int]) -> None:
        if matrix.ndim != 2 or matrix.shape[0] != out_hw[0] * out_hw[1]:
            raise ValueError(f"matrix must be (Ho·Wo, H·W) for out_hw {out_hw}, got {tuple(matrix.shape)}")
        self.M, self.out = matrix.to(_DT), tuple(out_hw)

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        if self.M.shape[1] != H * W:
            raise ValueError(f"the matrix reads {self.M.shape[1]} positions, the map has {H}·{W}")
        self.in_hw, self.A = (H, W), self.M
        mean = (x.mean.reshape(C, -1) @ self.A.T).reshape(C, *self.out)
        return from_covariance(mean, self.A @ covariance(x) @ self.A.T)


@register_correlated_rule(nn.Upsample)
def upsample_rule(m: nn.Upsample) -> Interpolate:
    return Interpolate(m.size, m.scale_factor, m.mode, m.align_corners, m.recompute_scale_factor)
