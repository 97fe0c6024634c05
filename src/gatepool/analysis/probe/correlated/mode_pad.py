"""A map padded by reflection, replication or wrapping: ``F.pad(x, pads, mode)`` with mode 'reflect',
'replicate' or 'circular' (TResNet's and the anti-aliased models' ``BlurPool2d``: a reflect pad, then a
binomial blur): every padded value is a copy of one of the map's, so the pad is a fixed map of the
positions, y = A x, A read off torch's own pad of the map's H·W unit maps.

forward   m_out = A m; per channel Cov_out = A Cov_in Aᵀ (Cov_in(p, q) = √(v_p v_q) ρ(q − p)); the variance
          map its diagonal, the lag sums T(Δ) = Σ_P Cov_out(P, P + Δ) (:class:`PositionMap`)
backward  g_in = Aᵀ g: a border value's gradient gets its copies' too; Cov = Aᵀ Cov_g A, the same sums
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.adaptive import _MAX_POSITIONS
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.resample import PositionMap

MODES = ("reflect", "replicate", "circular")


class ModePad(PositionMap):
    """``F.pad(x, pads, mode)`` of a (C, H, W) field, ``pads`` (left, right[, top, bottom]) ≥ 0."""

    def __init__(self, pads, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        pads = tuple(pads)
        if len(pads) not in (2, 4) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                              for p in pads):  # fmt: skip
            raise ValueError(f"pads must be 2 or 4 ints ≥ 0 (left, right[, top, bottom]), got {pads}")
        self.pads, self.mode = pads, mode

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        if H * W > _MAX_POSITIONS:
            raise NotImplementedError(f"{self.mode} pad of a {H}×{W} map: at most {_MAX_POSITIONS} positions")
        unit = torch.eye(H * W, dtype=_DT).reshape(H * W, 1, H, W)
        out = F.pad(unit, self.pads, mode=self.mode)  # (H·W, 1, Ho, Wo): where each position's value goes
        self.M, self.out = out.reshape(H * W, -1).T, tuple(out.shape[-2:])
        return super().forward(x)
