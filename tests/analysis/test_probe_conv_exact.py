"""The conv rule against the exact covariance of its state: the field's covariance
Cov(x_cp, x_cq) = √(v_p v_q) ρ_c(q − p) as a dense matrix, pushed through the conv's own matrix (forward)
or its transpose (backward), per channel its variance map and lag sums T(c, e) = Σ_q Cov(q, q + e).
The rule is exact on this model (the pairs of taps whose positions both fall in the map): these agree to
rounding. Cases with many taps of one class (Mixer-S/32's patch embedding, kernel = stride: every pair of
taps sums into one of few tap offsets), padding (taps of many classes), depthwise, a kernel larger than
the map."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gatepool.analysis.probe import correlated as cr

DT = torch.float64


def _field(C: int, H: int, W: int, seed: int) -> cr.Field:
    """A variance map and the correlation of a random stationary process (a random 3 × 3 filter's
    autocorrelation: positive definite, so every lag sum is within its bound)."""
    gen = torch.Generator().manual_seed(seed)
    var = 0.5 + torch.rand((C, H, W), dtype=DT, generator=gen)
    a = cr.autocorr(torch.randn((C, 1, 3, 3), dtype=DT, generator=gen))[:, 0]  # (C, 5, 5)
    corr = torch.zeros((C, 2 * H + 3, 2 * W + 3), dtype=DT)
    corr[:, H - 1 : H + 4, W - 1 : W + 4] = a / a[:, 2:3, 2:3]
    return cr.Field(torch.zeros_like(var), var, corr[:, 2 : 2 * H + 1, 2 : 2 * W + 1].contiguous())


def _dense_cov(f: cr.Field) -> torch.Tensor:
    """(C·H·W)² : δ_cc' √(v_p v_q) ρ_c(q − p)."""
    C, H, W = f.shape
    h, w = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    h, w = h.flatten(), w.flatten()
    dh, dw = H - 1 + h[None] - h[:, None], W - 1 + w[None] - w[:, None]  # (HW, HW): q − p, centred
    s = f.var.reshape(C, -1).sqrt()
    blocks = f.corr[:, dh, dw] * s[:, :, None] * s[:, None, :]  # (C, HW, HW)
    return torch.block_diag(*blocks)


def _var_and_lag_sums(cov: torch.Tensor, C: int, H: int, W: int):
    """Per channel the variance map and T(c, e) = Σ_q Cov(q, q + e) over q, q + e inside the map."""
    m = H * W
    blocks = torch.stack([cov[c * m : (c + 1) * m, c * m : (c + 1) * m] for c in range(C)])
    h, w = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    h, w = h.flatten(), w.flatten()
    lag = (
        (H - 1 + h[None] - h[:, None]) * (2 * W - 1) + W - 1 + w[None] - w[:, None]
    ).flatten()  # (p, q): q − p
    T = torch.zeros((C, (2 * H - 1) * (2 * W - 1)), dtype=DT).index_add_(1, lag, blocks.flatten(1))
    return torch.diagonal(blocks, dim1=1, dim2=2).reshape(C, H, W), T.reshape(C, 2 * H - 1, 2 * W - 1)


def _conv_matrix(w, stride, padding, groups, H, W):
    """(Co·Ho·Wo, Ci·H·W): the conv applied to each basis map."""
    Ci = w.shape[1] * groups
    eye = torch.eye(Ci * H * W, dtype=DT).reshape(-1, Ci, H, W)
    return F.conv2d(eye, w, None, stride, padding, 1, groups).flatten(1).T


CASES = [  # Co, Ci, groups, k, stride, padding, H
    (3, 2, 1, 4, 4, 0, 8),  # kernel = stride, no padding: one class of 16 taps (Mixer's patch embedding)
    (3, 2, 1, 5, 2, 0, 9),  # overlapping strided taps, one class
    (3, 2, 1, 3, 1, 1, 5),  # padding: every tap its own class
    (4, 4, 4, 3, 2, 1, 6),  # depthwise, strided
    (3, 3, 3, 7, 1, 3, 4),  # depthwise, the kernel larger than the map
    (2, 3, 1, 4, 2, 1, 6),  # an even kernel with padding: classes of several taps
]


@pytest.mark.parametrize("Co, Ci, groups, k, s, p, H", CASES)
def test_conv_rule_equals_the_dense_covariance(Co, Ci, groups, k, s, p, H):
    torch.manual_seed(0)
    w = torch.randn((Co, Ci // groups, k, k), dtype=DT) / k
    rule = cr.Conv(w, None, (s, s), (p, p), groups)
    x = _field(Ci, H, H, seed=1)
    K = _conv_matrix(w, s, p, groups, H, H)
    Ho = (H + 2 * p - k) // s + 1
    y = rule.forward(x)
    var, T = _var_and_lag_sums(K @ _dense_cov(x) @ K.T, Co, Ho, Ho)
    scale = float(var.max())

    assert float((y.var - var).abs().max()) < 1e-10 * scale
    assert float((y.lag_sums() - T).abs().max()) < 1e-10 * scale * Ho * Ho
    g = _field(Co, Ho, Ho, seed=2)
    gi = rule.backward(g)
    var, T = _var_and_lag_sums(K.T @ _dense_cov(g) @ K, Ci, H, H)
    scale = float(var.max())

    assert float((gi.var - var).abs().max()) < 1e-10 * scale
    assert float((gi.lag_sums() - T).abs().max()) < 1e-10 * scale * H * H
