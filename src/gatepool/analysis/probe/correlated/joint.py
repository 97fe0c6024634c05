"""The joint cumulants of a depthwise conv's neighbouring outputs (``Field.joint``), and what they add to
the covariance of an activation after its norm.

A depthwise conv's outputs z_P, z_Q (Q = P + e) read some of the same inputs of one channel (taps j, l
with u_j − u_l = s·e land on one input). Its inputs independent with cumulants κ₃, κ₄ (``Field.skew``,
``kurt``: a rectified input's), the pair's joint cumulants are sums over those shared inputs:

    κ₂₁ = κ(z_P, z_P, z_Q) = Σ w_j² w_l κ₃,   κ₂₂ = κ(z_P, z_P, z_Q, z_Q) = Σ w_j² w_l² κ₄,
    κ₃₁ = κ(z_P, z_P, z_P, z_Q) = Σ w_j³ w_l κ₄,

carried standardized, k21 = κ₂₁/(v_P √v_Q), k22 = κ₂₂/(v_P v_Q), k31 = κ₃₁/(v_P^{3/2} √v_Q) (a norm's affine
map keeps them, k21's sign flipped with γ's). The Gaussian state has them 0: its lags are pair
correlations only, so the energy the outputs of a map share (on a 4 × 4 map a 5 × 5 kernel reads the whole
map from every output) is lost, and the pool of f(z) over the map (a squeeze-and-excitation gate's) has
too little variance. The bivariate Edgeworth series' first terms (integrating the density's corrections
by parts onto f) add to Cov(f(z_P), f(z_Q))

    ½ k21 h₂(P) h₁(Q) + ½ k12 h₁(P) h₂(Q) + ¼ k22 h₂(P) h₂(Q) + ⅙ k31 h₃(P) h₁(Q) + ⅙ k13 h₁(P) h₃(Q),

h_n = E[f(x) He_n(z)] = sⁿ E[f⁽ⁿ⁾(x)] of each position's normal (the pair's correlation's own terms left
out: second order), k12(P, e) = k21(Q, −e).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import _DT, _shifted


def depthwise_joint(w: torch.Tensor, taps: list[tuple[int, int]], stride: tuple[int, int],
                    k3: list[torch.Tensor] | None, k4: list[torch.Tensor] | None, var: torch.Tensor
                    ) -> dict:  # fmt: skip
    """{e: (k21, k22, k31)} maps (C, Ho, Wo) at P for the pair (P, P + e), from each output channel's
    kernel ``w`` (C, kh, kw), its ``taps`` offsets, the input's cumulants on the output grid per tap
    (``k3[j]``, ``k4[j]``: κ at s·P + u_j; None: 0) and the output's variance ``var``."""
    sh, sw = stride
    raw: dict = {}
    zero = torch.zeros_like(var)
    for j, (aj, bj) in enumerate(taps):
        wj = w[:, aj, bj][:, None, None]
        for l, (al, bl) in enumerate(taps):
            dh, dw = aj - al, bj - bl
            if l == j or dh % sh or dw % sw:
                continue
            e = (dh // sh, dw // sw)
            if abs(e[0]) >= var.shape[1] or abs(e[1]) >= var.shape[2]:
                continue  # no pair of the map that far apart
            wl = w[:, al, bl][:, None, None]
            r21, r22, r31 = raw.get(e, (zero, zero, zero))
            if k3 is not None:
                r21 = r21 + wj * wj * wl * k3[j]
            if k4 is not None:
                r22, r31 = r22 + wj * wj * wl * wl * k4[j], r31 + wj**3 * wl * k4[j]
            raw[e] = (r21, r22, r31)
    v = var.clamp_min(1e-300)
    out = {}
    for (dh, dw), (r21, r22, r31) in raw.items():
        vq = _shifted(v, dh, dw)
        ok = vq > 1e-300  # Q = P + e inside the map
        vq = torch.where(ok, vq, torch.ones_like(vq))
        out[(dh, dw)] = tuple(torch.where(ok, r / d, 0.0) for r, d in
                              ((r21, v * vq.sqrt()), (r22, v * vq), (r31, v**1.5 * vq.sqrt())))  # fmt: skip
    return out


def flipped(joint: dict | None, sign: torch.Tensor) -> dict | None:
    """The joint cumulants through y = a_c x + b: k21's sign is a_c's (``sign`` (C,))."""
    if joint is None:
        return None
    s = sign[:, None, None]
    return {e: (k21 * s, k22, k31 * s) for e, (k21, k22, k31) in joint.items()}


def joint_lag_sums(joint: dict, h1: torch.Tensor, h2: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    """What the joint cumulants add to the lag sums T(e) = Σ_P Cov(f(z_P), f(z_{P+e})) of f(z): (C, 2H − 1,
    2W − 1), symmetric, 0 at lag 0 (each position's own law is the Gram–Charlier one's)."""
    C, H, W = h1.shape
    T = torch.zeros((C, 2 * H - 1, 2 * W - 1), dtype=_DT)
    for (dh, dw), (k21, k22, k31) in joint.items():
        q1, q2 = _shifted(h1, dh, dw), _shifted(h2, dh, dw)
        a = (0.5 * k21 * h2 * q1 + k31 * h3 * q1 / 6).sum((1, 2))  # A(e); A(−e) lands at the mirror lag
        b = 0.25 * (k22 * h2 * q2).sum((1, 2))
        T[:, H - 1 + dh, W - 1 + dw] += a + 0.5 * b
        T[:, H - 1 - dh, W - 1 - dw] += a + 0.5 * b
    return T
