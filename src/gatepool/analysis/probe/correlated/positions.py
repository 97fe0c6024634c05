"""A field's covariance of positions, the (C, n, n) matrix K(p, q) = √v_p √v_q ρ(q − p) of a (C, H, W)
field (n = H·W), and the moments read back from it; the rules that are a matrix over the positions work
on it (adaptive pools, attentions over draws, the branch gain).
"""

from __future__ import annotations

import functools

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums


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
