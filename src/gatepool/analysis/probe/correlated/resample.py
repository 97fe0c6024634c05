"""A map resized by ``F.interpolate`` / ``nn.Upsample`` (HRNet's fuse layers: nearest × 2, × 4): every
mode of torch is a linear map of the positions, y = A x, and A is torch's own, read off by resizing the
map's H·W unit maps (an exact copy of its index rounding, corner alignment and antialias).

forward   m_out = A m; per channel Cov_out = A Cov_in Aᵀ with Cov_in(p, q) = √(v_p v_q) ρ(q − p), the
          variance map its diagonal, the lag sums T(Δ) = Σ_P Cov_out(P, P + Δ) (as the adaptive pool's
          window matrix, :mod:`adaptive`)
backward  g_in = Aᵀ g: Cov = Aᵀ Cov_g A, the same sums

:class:`PositionMap` is that for a given A: PoolFormer's ``pool(x) − x``, one map A − I of x.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.adaptive import (
    _MAX_POSITIONS,
    AdaptiveAvgPool,
    covariance,
    from_covariance,
)
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.registry import register_correlated_rule


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
            raise NotImplementedError(f"interpolate {H}×{W} → {Ho}×{Wo}: at most {_MAX_POSITIONS} positions")
        unit = torch.eye(H * W, dtype=_DT).reshape(H * W, 1, H, W)
        out = F.interpolate(unit, **self.kwargs)  # (H·W, 1, Ho, Wo): the image of each input position
        self.in_hw, self.A = (H, W), out.reshape(H * W, Ho * Wo).T  # (Ho·Wo, H·W)
        mean = (x.mean.reshape(C, -1) @ self.A.T).reshape(C, Ho, Wo)
        return from_covariance(mean, self.A @ covariance(x) @ self.A.T)


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
