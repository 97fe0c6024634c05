"""ReLU of a skewed field (``Field.skew``, ``kurt``: after a depthwise conv), in closed form.

x = m + s z with the Gram–Charlier density of its first four cumulants (as :func:`pointwise.law_moments`),

    p(z) = φ(z) (1 + γ₁/6 He₃(z) + γ₂/24 He₄(z)),

so a gated polynomial K(z) = 1[z > −a] Σ_j k_j z^j (a = m/s) has

    E[K] = Σ_j k_j (M_j + γ₁/6 (M_{j+3} − 3 M_{j+1}) + γ₂/24 (M_{j+4} − 6 M_{j+2} + 3 M_j)),

M_j = E[z^j 1[z > −a]] the normal's truncated moments (M₀ = Φ(a), M₁ = φ(a),
M_j = (j − 1) M_{j−2} + (−a)^{j−1} φ(a)). E[ReLU(x)^k] is K = (m + s z)^k, P(x > 0) is K = 1, and the
gradient's factor with a dependence on y (:mod:`relu_dependence`) K = a₀ + a₁ x + a₂ x². The output's own
γ₁, γ₂ are the rectified normal's (from E[ReLU^k], k ≤ 4, of the normal of x's mean and variance, as the
pointwise rule's: the Gram–Charlier density turns negative in a far tail).
"""

from __future__ import annotations

import math

import torch

from gatepool.analysis.probe.correlated.normal import _cdf, _pdf

A_MAX = 38.0  # |m/s| beyond this φ(a) is 0 in float64 (a position of s = 0 gets ±this)


def standardized(mean: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, a = m/s) per position; x = m exactly (s = 0) gets a = ±A_MAX: its gate 1[m > 0]."""
    s = var.clamp_min(0).sqrt()
    alive = s > 0
    dead = torch.where(mean > 0, A_MAX, -A_MAX)
    return s, torch.where(alive, mean / torch.where(alive, s, torch.ones_like(s)), dead).clamp(-A_MAX, A_MAX)


def truncated(a: torch.Tensor, order: int = 4) -> list[torch.Tensor]:
    """[M₀ … M_order]: E[z^j 1[z > −a]] of z ~ N(0, 1)."""
    phi = _pdf(a)
    M = [_cdf(a), phi]
    for j in range(2, order + 1):
        M.append((j - 1) * M[j - 2] + (-a) ** (j - 1) * phi)
    return M


def gated(k: list[torch.Tensor], M: list[torch.Tensor], skew: torch.Tensor | None,
          kurt: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """E[1[z > −a] Σ_j k_j z^j] under the Gram–Charlier density (γ None: 0); ``M`` to order len(k) + 3."""
    out = sum(kj * M[j] for j, kj in enumerate(k))
    if skew is not None:
        out = out + skew / 6 * sum(kj * (M[j + 3] - 3 * M[j + 1]) for j, kj in enumerate(k))
    if kurt is not None:
        out = out + kurt / 24 * sum(kj * (M[j + 4] - 6 * M[j + 2] + 3 * M[j]) for j, kj in enumerate(k))
    return out


def _powers(mean: torch.Tensor, s: torch.Tensor, k: int) -> list[torch.Tensor]:
    """The coefficients of (m + s z)^k in z."""
    return [math.comb(k, j) * mean ** (k - j) * s**j for j in range(k + 1)]


def relu_shape(mean: torch.Tensor, var: torch.Tensor, skew: torch.Tensor | None, kurt: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(E[ReLU x], E[(ReLU x)²], P(x > 0)) of the skewed x, and the output's (γ₁, γ₂) (the normal's)."""
    s, a = standardized(mean, var)
    M = truncated(a, 8)
    e = [gated(_powers(mean, s, k), M, skew, kurt) for k in (1, 2)]
    pos = gated([torch.ones_like(mean)], M, skew, kurt).clamp(0, 1)
    n1, n2, n3, n4 = (gated(_powers(mean, s, k), M, None, None) for k in (1, 2, 3, 4))
    v = (n2 - n1 * n1).clamp_min(0)
    k3 = n3 - 3 * n1 * n2 + 2 * n1**3
    k4 = n4 - 4 * n1 * n3 + 6 * n1 * n1 * n2 - 3 * n1**4 - 3 * v * v
    ok = v > 1e-12 * (1 + n1 * n1)
    d = torch.where(ok, v, torch.ones_like(v))
    e1 = e[0].clamp_min(0)
    skew_out, kurt_out = torch.where(ok, k3 / d**1.5, 0.0), torch.where(ok, k4 / d**2, 0.0)
    return e1, e[1].clamp_min(e1 * e1), pos, skew_out, kurt_out
