"""Normal integrals: the rectified normal's moments, those of the skewed sum b + ReLU(y), and the bivariate
normal's E[ReLU(x) ReLU(y)] and P(x > 0, y > 0) (48-point Gauss–Legendre).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    """(E[p], E[p²], P(x > 0)) of p = ReLU(x), x ~ N(m, v), elementwise. Where v = 0, x = m: P(x > 0) is
    1[m > 0] (a sum exactly 0, b + ReLU(y) with a zero-initialised branch b, shuts its gate)."""
    s = v.clamp_min(0).sqrt().clamp_min(1e-300)
    a = torch.where(v > 0, m / s, torch.where(m > 0, math.inf, -math.inf))
    cdf, pdf = _cdf(a), _pdf(a)
    return m * cdf + s * pdf, (m * m + v) * cdf + m * s * pdf, cdf


@dataclass(frozen=True)
class Law:
    """A law per position as atoms: sorted values ``x`` (..., n) with masses ``w`` (..., n) summing to 1.

    A ReLU's output: ``x`` ≥ 0, ``x[..., 0] = 0`` carrying P(output = 0). A residual stream
    z_k = b_k + ReLU(z_{k−1}) is not normal past its first block (each ReLU skews it); its law is
    carried exactly, block to block, as these atoms (:func:`relu_of_sum_law`). A field that is not
    normal given its position (a sparse input, its first conv, a max pool of it: ``Field.law``,
    :mod:`law`) carries its law per position so."""

    x: torch.Tensor
    w: torch.Tensor

    def positive(self) -> torch.Tensor:
        """P(output > 0) per position."""
        return self.w[..., 1:].sum(-1)


def relu_law(m: torch.Tensor, v: torch.Tensor) -> Law:
    """The atoms of ReLU(y), y ~ N(m, v): the mass Φ(−m/s) at 0, and 48-point Gauss–Legendre nodes over
    y > 0 (z = (y − m)/s from −m/s to 9) with the normal's density as their masses."""
    s = v.clamp_min(0).sqrt()
    z0 = (-m / s.clamp_min(1e-300)).clamp(-_Z, _Z)
    half = (_Z - z0) / 2
    z = z0[..., None] + half[..., None] * (_GL_X + 1)  # (..., 48)
    x = (m[..., None] + s[..., None] * z).clamp_min(0)
    w = half[..., None] * _GL_W * _pdf(z)
    return Law(torch.cat([torch.zeros_like(m)[..., None], x], -1), torch.cat([_cdf(z0)[..., None], w], -1))


def _mixture_density(t: torch.Tensor, c: torch.Tensor, s: torch.Tensor, w: torch.Tensor, block: int):
    """Σ_j w_j φ((t − c_j)/s) / s (P, k) at the nodes t (P, k) of the mixtures of components c, w (P, n)
    and sd s (P, 1), φ as :func:`_pdf` computes it: the (P, k, n) terms made in place, ``block`` of them at
    a time (a block that stays in cache: the exponentials, not the memory traffic, set the cost)."""
    dens = torch.empty_like(t)
    step = max(1, block // (t.shape[1] * c.shape[1]))
    for i in range(0, len(t), step):
        rows = slice(i, i + step)
        z = t[rows, :, None] - c[rows, None, :]  # (step, k, n)
        z.div_(s[rows, :, None]).square_().mul_(-0.5).exp_().div_(math.sqrt(2 * math.pi))
        torch.sum(z.mul_(w[rows, None, :]), -1, out=dens[rows])
    return dens / s


def relu_of_sum_law(mb: torch.Tensor, vb: torch.Tensor, r: Law, chunk: int = 1 << 22, block: int = 1 << 18
                    ) -> Law:  # fmt: skip
    """The atoms of ReLU(b + r), b ~ N(mb, vb) independent of r ~ ``r``: the sum is the normal mixture
    Σ_j w_j N(mb + x_j, vb); its mass below 0 goes to the atom at 0, and its density over (0, hi]
    (hi = the largest component mean + 9 sd) is sampled at 48 Gauss–Legendre nodes, their masses scaled
    to the exact P(sum > 0). Positions in chunks of ``chunk`` node-atom pairs (memory), the density's
    terms ``block`` at a time (cache, :func:`_mixture_density`). Where vb = 0 (a zero-initialised branch:
    timm's ``zero_init_last``) the sum is r shifted, a law of atoms: those atoms, k ≥ 49 of them (the
    others padded with atoms of mass 0)."""
    sb = vb.clamp_min(0).sqrt().clamp_min(1e-12)
    shape, n = mb.shape, r.x.shape[-1]
    mb_, sb_, x_, w_ = mb.reshape(-1), sb.reshape(-1), r.x.reshape(-1, n), r.w.reshape(-1, n)
    xs, ws = [], []
    step = max(1, chunk // (48 * n))
    for i in range(0, len(mb_), step):
        m, s, x, w = mb_[i : i + step, None], sb_[i : i + step, None], x_[i : i + step], w_[i : i + step]
        c = m + x  # (P, n) the components' means
        p0 = (w * _cdf(-c / s)).sum(-1)  # P(sum ≤ 0)
        top = torch.where(w > 0, c, torch.full_like(c, -math.inf)).amax(-1, keepdim=True)
        hi = (top + _Z * s).clamp_min(1e-300)
        t = hi / 2 * (_GL_X + 1)  # (P, 48) nodes over (0, hi)
        wt = hi / 2 * _GL_W * _mixture_density(t, c, s, w, block)
        wt = wt * ((1 - p0) / wt.sum(-1).clamp_min(1e-300))[:, None]
        xs.append(torch.cat([torch.zeros_like(p0)[:, None], t], -1))
        ws.append(torch.cat([p0[:, None], wt], -1))
    law = Law(torch.cat(xs).reshape(*shape, 49), torch.cat(ws).reshape(*shape, 49))
    still = vb <= 0  # b a constant (a zero-initialised branch): the sum's atoms are r's, shifted
    if not bool(still.any()):
        return law
    exact = _shifted_relu_law(mb, r)
    k = max(law.x.shape[-1], exact.x.shape[-1])
    law, exact = _padded(law, k), _padded(exact, k)
    return Law(torch.where(still[..., None], exact.x, law.x), torch.where(still[..., None], exact.w, law.w))


def _shifted_relu_law(mb: torch.Tensor, r: Law) -> Law:
    """The atoms of ReLU(mb + r), mb a constant: r's atoms shifted, the mass of those ≤ 0 at 0 (ReLU(0) = 0;
    r's atoms sorted, so they stay so)."""
    c = mb[..., None] + r.x
    up = c > 0
    x = torch.cat([torch.zeros_like(mb)[..., None], torch.where(up, c, torch.zeros_like(c))], -1)
    return Law(x, torch.cat([(r.w * ~up).sum(-1, keepdim=True), r.w * up], -1))


def _padded(law: Law, k: int) -> Law:
    """``law`` on k atoms: atoms 0 of mass 0 after its first (the atom at 0), the order kept."""
    z = torch.zeros((*law.x.shape[:-1], k - law.x.shape[-1]), dtype=law.x.dtype)
    return Law(torch.cat([law.x[..., :1], z, law.x[..., 1:]], -1),
               torch.cat([law.w[..., :1], z, law.w[..., 1:]], -1))


def relu_of_sum_map(mb, vb, r: Law):
    """(E[p], E[p²], P(p > 0), P(p > 0, r > 0)) of p = ReLU(b + r), b ~ N(mb, vb) independent of the ReLU
    output r ~ ``r`` (its atoms), elementwise (a ResNet's block output, whose stream is a ReLU's output:
    the sum is skewed). Given r = x_j the inner value is N(mb + x_j, vb): each moment is the rectified
    normal's, averaged over the atoms."""
    inner = relu_moments_map(mb[..., None] + r.x, vb[..., None])
    out = tuple((r.w * i).sum(-1) for i in inner)
    return (*out, (r.w[..., 1:] * inner[2][..., 1:]).sum(-1))


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
