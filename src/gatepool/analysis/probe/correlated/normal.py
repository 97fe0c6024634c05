"""Normal integrals: the rectified normal's moments, those of the skewed sum b + ReLU(y), and the bivariate
normal's E[ReLU(x) ReLU(y)] and P(x > 0, y > 0) (48-point Gauss–Legendre).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gatepool.analysis.probe.correlated.field import _DT

_SQRT2 = math.sqrt(2.0)
_GL_X, _GL_W = (torch.tensor(a, dtype=_DT) for a in np.polynomial.legendre.leggauss(48))
_Z = 9.0  # the quadrature runs over z ≤ 9: the rest of the normal has mass 1e-19


def _cdf(x):
    return 0.5 * torch.erfc(-x / _SQRT2)


def _pdf(x):
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _rect_mean(mu, sd):
    """E[ReLU(y)], y ~ N(mu, sd²) (sd may be 0)."""
    sd = sd.clamp_min(1e-300)
    a = mu / sd
    return mu * _cdf(a) + sd * _pdf(a)


def relu_moments_map(m: torch.Tensor, v: torch.Tensor):
    """(E[p], E[p²], P(x > 0)) of p = ReLU(x), x ~ N(m, v), elementwise."""
    s = v.clamp_min(0).sqrt().clamp_min(1e-300)
    a = m / s
    cdf, pdf = _cdf(a), _pdf(a)
    return m * cdf + s * pdf, (m * m + v) * cdf + m * s * pdf, cdf


def relu_of_sum_map(mb, vb, my, vy):
    """(E[p], E[p²], P(p > 0), P(p > 0, y > 0)) of p = ReLU(b + ReLU(y)), b ~ N(mb, vb) and y ~ N(my, vy)
    independent, elementwise (a ResNet's block output whose stream is a ReLU's output: the sum is skewed).

    Given y the inner value is N(mb + ReLU(y), vb): each moment is the rectified normal's, averaged
    over y: its mass Φ(−my/sy) at ReLU(y) = 0, and 48-point Gauss–Legendre over y > 0 (z = (y − my)/sy
    from −my/sy to 9, as :func:`bivariate_relu`)."""
    sy = vy.clamp_min(0).sqrt()
    z0 = (-my / sy.clamp_min(1e-300)).clamp(-_Z, _Z)
    half = (_Z - z0) / 2
    z = z0[..., None] + half[..., None] * (_GL_X + 1)  # (..., n)
    w = half[..., None] * _GL_W * _pdf(z)
    inner = relu_moments_map((mb + my)[..., None] + sy[..., None] * z, vb[..., None])  # given y > 0
    out = tuple(_cdf(z0) * o + (w * i).sum(-1) for o, i in zip(relu_moments_map(mb, vb), inner))
    return (*out, (w * inner[2]).sum(-1))


def bivariate_relu(m1, s1, m2, s2, r):
    """(E[ReLU(x) ReLU(y)], P(x > 0, y > 0)) of a bivariate normal with means m, sds s, correlation r.

    Given z = (x − m1)/s1, y ~ N(m2 + s2 r z, s2² (1 − r²)): E[ReLU(y) | z] is a rectified-normal mean and
    P(y > 0 | z) a Φ; both integrate against φ(z) over z > −m1/s1 by 48-point Gauss–Legendre (smooth
    there). With zero means E[ReLU ReLU] is the arccos kernel s1 s2 (√(1−r²) + (π − arccos r) r) / 2π.
    """
    dead = (s1 <= 1e-150) | (s2 <= 1e-150)
    r = torch.where(dead, torch.zeros_like(r), r).clamp(-1.0, 1.0)
    s1c = s1.clamp_min(1e-300)
    z0 = (-m1 / s1c).clamp(-_Z, _Z)
    half = (_Z - z0) / 2
    z = z0[..., None] + half[..., None] * (_GL_X + 1)  # (..., n)
    w = half[..., None] * _GL_W * _pdf(z)
    mu2 = torch.addcmul(m2[..., None], (s2 * r)[..., None], z)
    sd2 = (s2 * (1 - r * r).clamp_min(0).sqrt())[..., None].clamp_min(1e-300)
    a = mu2 / sd2
    cdf = _cdf(a)  # P(y > 0 | z), and E[ReLU(y) | z] = mu2 Φ(a) + sd2 φ(a) (as _rect_mean)
    rect = torch.addcmul(mu2.mul_(cdf), sd2, _pdf(a))
    x1 = torch.addcmul(m1[..., None], s1[..., None], z)
    e = x1.mul_(w).mul_(rect).sum(-1)
    p = cdf.mul_(w).sum(-1)
    return e, p
