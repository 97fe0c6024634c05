"""Any pointwise activation f of the Gaussian field: ReLU6, SiLU, GELU, Hardswish, Hardsigmoid, sigmoid, tanh,
LeakyReLU (TResNet's).

x = m + s z at each position (z ~ N(0, 1)); every expectation is Gauss–Legendre over z ∈ [−9, 9], cut into
pieces at f's kinks (where f or f' jumps: ReLU6 at 0 and 6, the hard ones at ±3), so each piece is smooth.

per position  E[f(x)], Var f(x); back E[f'(x)²]
per lag       Mehler's series in the normalized Hermite coefficients a_n(p) = E[f(x_p) He_n(z_p)] / √n!:

                  Cov(f(x_p), f(x_q)) = Σ_{n=1..N} ρⁿ a_n(p) a_n(q) + ρ^{N+1} r(p) r(q),
                  r² = Var f(x) − Σ_{n ≤ N} a_n²   (Parseval: the series' whole remainder at ρ = 1)

              so the sum is exact at ρ = 0 and at ρ = 1, and between them off by at most ρ^{N+1} r²
              (a kink makes a_n decay slowly: the remainder term carries what N = 24 terms leave).
skewed input  where x carries γ₁, γ₂ (``Field.skew``, ``kurt``: after a depthwise conv), E[f], E[f²] and
              E[f'²] under the Gram–Charlier density φ(z)(1 + γ₁/6 He₃(z) + γ₂/24 He₄(z)): the Hermite
              coefficients of f, f², f'² at orders 3 and 4 (:func:`law_moments`); the lags as above (the
              joint law of two positions Gaussian). Every output carries its own γ₁, γ₂, from E[f³],
              E[f⁴] under the normal of x's mean and variance (the Gram–Charlier density is negative in
              a far tail, where a rarely active f's standardized cumulants would blow up)
joint         where x's neighbours share skewed inputs (``Field.joint``: a depthwise conv's, through its
              norm), the lag sums gain the bivariate Edgeworth series' first terms (:mod:`joint`)
backward      g independent of x: Cov(g_p f'(x_p), g_q f'(x_q)) = Cov(g_p, g_q) E[f'(x_p) f'(x_q)], the same
              series of f' (its mean b_0 = E[f'] included); for a norm before it (``Field.yy``)
              E[g_p g_q x_p x_q f'(x_p) f'(x_q)], the series of u(x) = x f'(x).
dependence    where g depends on this rule's own output y = f(x) (``Field.dependence``, η = (y − m_y)/s_y:
              a depthwise conv after it, whose few taps move the next activation's gates),
              E[g² | x] = E[g²] (1 + β₁ η + β₂ (η² − 1)), so E[f'(x)² g²] = E[g²] E[f'² (a₀ + a₁ f + a₂ f²)]
              with a₂ = β₂/s_y², a₁ = β₁/s_y − 2 β₂ m_y/s_y², a₀ = 1 − β₂ − β₁ m_y/s_y + β₂ m_y²/s_y².
              The gradient at x carries its own: K(x) = f'(x)² (a₀ + a₁ f + a₂ f²) ≈ E[K] (1 + β₁' He₁(z) +
              β₂' He₂(z)), β₁' = E[K He₁]/E[K], β₂' = E[K He₂]/(2 E[K]), and the factor f' alone,
              r₁ = E[f' He₁]/E[f'], r₂ = E[f' He₂]/(2 E[f']) (what a depthwise conv before it needs,
              :mod:`conv`)

Cost: the integrals (each position's, or for f without kinks a lattice's, interpolated: see
:func:`hermite_coefficients`) and one batch of FFTs per series, of the terms that matter (:func:`_terms`:
where the input's correlation is weak, as between a transformer's tokens, a few).

ReLU keeps its own rule (:mod:`relu`: exact integrals at the near lags, the shapes b + ReLU(y)).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe.correlated import centred
from gatepool.analysis.probe.correlated.channels import activated, series_channels
from gatepool.analysis.probe.correlated.coupling import activation_coupling
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.joint import joint_lag_sums
from gatepool.analysis.probe.correlated.registry import register_correlated_rule

_ORDER = 24  # Mehler's series to ρ²⁴, then the Parseval remainder
_Z = 9.0  # the normal beyond |z| = 9 has mass 2e-19
_PIECES = 8  # [−9, 9] in 8 equal pieces (plus cuts at the kinks), 16-point Gauss–Legendre on each
_GL_X, _GL_W = (torch.tensor(a, dtype=_DT) for a in np.polynomial.legendre.leggauss(16))
_CHUNK = 2048  # positions at a time (the nodes of 2048 positions: 2048 × 160 float64 per map)
_GRID = 1 / 64  # the interpolation lattice's step in μ = m/s and in log s (f without kinks)
_MU_MAX = 1e4  # |μ| beyond which a position is integrated on its own
_POWERS = 5  # the powers' Hermite orders n = 0 … 4 (:func:`_integrate`)
_TAIL = 1e-7  # the series' terms dropped hold under this of the variance: the lattice's own accuracy

# f and the points where f or f' jumps (the quadrature cuts its pieces there)
ACTIVATIONS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[float, ...]]] = {
    "relu6": (F.relu6, (0.0, 6.0)),
    "silu": (F.silu, ()),
    "gelu": (F.gelu, ()),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), ()),
    "hardswish": (F.hardswish, (-3.0, 3.0)),
    "hardsigmoid": (F.hardsigmoid, (-3.0, 3.0)),
    "sigmoid": (torch.sigmoid, ()),
    "tanh": (torch.tanh, ()),
}


def _nodes(m: torch.Tensor, s: torch.Tensor, kinks: tuple[float, ...]):
    """Gauss–Legendre nodes z (P, Q) and weights w · φ(z) (P, Q) for E[h(m + s z)] at P positions."""
    edges = torch.linspace(-_Z, _Z, _PIECES + 1, dtype=_DT).expand(m.shape[0], -1)
    if kinks:
        alive = s > 0
        cut = [torch.where(alive, (t - m) / torch.where(alive, s, 1.0), -_Z).clamp(-_Z, _Z) for t in kinks]
        edges = torch.cat([edges, torch.stack(cut, 1)], 1).sort(1).values
    lo, half = edges[:, :-1, None], (edges[:, 1:, None] - edges[:, :-1, None]) / 2  # (P, pieces, 1)
    z = (lo + half * (_GL_X + 1)).flatten(1)
    w = (half * _GL_W).flatten(1) * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return z, w


def _basis(z: torch.Tensor, order: int) -> torch.Tensor:
    """(..., Q, order + 1): the normalized Hermite polynomials He_n(z) / √n!, by their recurrence
    He_{n+1} = (z He_n − √n He_{n−1}) / √(n+1), written into one tensor (no stack of the pieces)."""
    out = torch.empty((*z.shape, order + 1), dtype=z.dtype)
    out[..., 0] = 1.0
    out[..., 1] = z
    for n in range(1, order):
        torch.sub(z * out[..., n], out[..., n - 1], alpha=math.sqrt(n), out=out[..., n + 1])
        out[..., n + 1] /= math.sqrt(n + 1)
    return out


def _unique_rows(ms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of ms (P, 2), sorted as ``torch.unique(ms, dim=0)``, and each row's index among
    them: two stable sorts (``unique(dim=0)`` is several times slower)."""
    by_s = torch.sort(ms[:, 1], stable=True).indices
    order = by_s[torch.sort(ms[by_s, 0], stable=True).indices]
    rows = ms[order]
    new = torch.ones(len(ms), dtype=torch.bool)
    new[1:] = (rows[1:] != rows[:-1]).any(1)
    where = torch.empty(len(ms), dtype=torch.long)
    where[order] = new.cumsum(0) - 1
    return rows[new], where


def _integrate(f: Callable, kinks: tuple[float, ...], ms: torch.Tensor, order: int) -> torch.Tensor:
    """(P, :func:`_width`) at the rows (m, s) of ms (P, 2): for h = f, f', u, E[h], a_1 … a_order, E[h²]
    ((3, order + 2) flattened), then for k = f², f³, f⁴, f'², f'² f, f'² f², E[k He_n] / √n! at n = 0 … 4
    ((6, 5)).

    Without kinks every position has the same nodes z and weights: the Hermite basis is made once and
    each coefficient is one matrix product over the nodes; with kinks (cut where they fall for each
    position) the basis is per position."""
    shared = None
    if not kinks:
        z, w = _nodes(ms[:1, 0], ms[:1, 1], ())  # (1, Q): the same for every position
        shared = (z, (w[0, :, None] * _basis(z[0], order)))  # (Q, order + 1), the weights in
    parts, powers = [], []
    for chunk in ms.split(_CHUNK):
        mc, sc = chunk[:, 0], chunk[:, 1]
        z, w = (shared[0].expand(len(mc), -1), None) if shared else _nodes(mc, sc, kinks)  # (P, Q)
        x = (mc[:, None] + sc[:, None] * z).requires_grad_()
        with torch.enable_grad():
            y = f(x)
            (dy,) = torch.autograd.grad(y.sum(), x)
        x, y = x.detach(), y.detach()
        h = torch.stack([y, dy, x * dy], 1)  # (P, 3, Q): f, f', u
        y2 = y * y
        d2 = dy * dy
        k = torch.stack([y2, y2 * y, y2 * y2, d2, d2 * y, d2 * y2], 1)  # (P, 6, Q): f² … f⁴, f'², f'²f, f'²f²
        if shared:
            coef = h @ shared[1]  # (P, 3, order + 1)
            sq = (h * h) @ shared[1][:, 0]  # (P, 3): E[h²] (He_0 = 1)
            parts.append(torch.cat([coef, sq[..., None]], 2))
            powers.append(k @ shared[1][:, :_POWERS])  # (P, 6, 5)
        else:
            wh = w[:, None, :] * h
            basis = _basis(z, order)
            parts.append(torch.cat([torch.bmm(wh, basis), (wh * h).sum(2, keepdim=True)], 2))
            powers.append(torch.bmm(w[:, None, :] * k, basis[..., :_POWERS]))
    if not parts:
        return torch.empty((0, _width(order)), dtype=_DT)
    return torch.cat([torch.cat(parts).flatten(1), torch.cat(powers).flatten(1)], 1)


def _width(order: int) -> int:
    """The columns of :func:`_integrate`'s rows: (3, order + 2) for f, f', u, then (6, 5) for the powers."""
    return 3 * (order + 2) + 6 * _POWERS


def _cubic(t: torch.Tensor) -> torch.Tensor:
    """(4, P): the Lagrange weights of the nodes −1, 0, 1, 2 at t ∈ [0, 1) (cubic interpolation)."""
    return torch.stack([-t * (t - 1) * (t - 2) / 6, (t + 1) * (t - 1) * (t - 2) / 2,
                        -(t + 1) * t * (t - 2) / 2, (t + 1) * t * (t - 1) / 6])


def _lattice(ms: torch.Tensor, step: float = _GRID):
    """The lattice μ = m/s ∈ step·ℤ, log s ∈ step·ℤ around the positions ms (P, 2), s > 0: nodes (K, 2) as
    (m, s), rows (16, P) each position's 4 × 4 nodes among them, weights (16, P)."""
    ti, tj = ms[:, 0] / ms[:, 1] / step, ms[:, 1].log() / step
    i0, j0 = ti.floor(), tj.floor()
    wi, wj = _cubic(ti - i0), _cubic(tj - j0)  # (4, P) over μ, over log s
    i0, j0 = i0.long() - 1, j0.long() - 1  # each position's first node
    imin, jmin = int(i0.min()), int(j0.min())
    span = int(j0.max()) - jmin + 4
    cells, cell_of = torch.unique((i0 - imin) * span + (j0 - jmin), return_inverse=True)
    a = torch.arange(4)
    need = cells[:, None] + (a[:, None] * span + a).flatten()  # (cells, 16): node (i0 + a, j0 + b)
    keys, node_of = torch.unique(need, return_inverse=True)
    s = torch.exp((keys % span + jmin).to(_DT) * step)
    m = (keys // span + imin).to(_DT) * step * s
    return torch.stack([m, s], 1), node_of[cell_of].T, (wi[:, None] * wj[None, :]).reshape(16, -1)


def hermite_coefficients(f: Callable, kinks: tuple[float, ...], m: torch.Tensor, s: torch.Tensor,
                         order: int = _ORDER):
    """For h = f, f' and u = x f'(x) of x ~ N(m, s²) at every position of the maps m, s:
    ``{name: (E[h], E[h²], [a_1 … a_order])}``, a_n = E[h(x) He_n(z)] / √n! (maps like m); and
    ``"powers"`` (6, 5, *m.shape): E[k(x) He_n(z)] / √n! for k = f², f³, f⁴, f'², f'² f, f'² f² and
    n = 0 … 4 (n = 3, 4: what the Gram–Charlier density of a skewed input adds to their means,
    :func:`law_moments`; n = 1, 2: how a gradient through f depends on x, ``Field.dependence``).

    Positions with the same (m, s) (a map's interior, away from its borders and the data's layout) are
    integrated once. For f without kinks each of these is an analytic function of (μ = m/s, log s): where
    the positions are over four times the nodes of the lattice of step :data:`_GRID` in both around them
    (a transformer's tokens, a map whose every position differs a little), the lattice's nodes are
    integrated and the positions interpolated, cubic in each: within 1e-7 of h's standard deviation and
    Var h within 1e-6 of itself (``tests/analysis/test_probe_speed.py``)."""
    if order < 4:
        raise ValueError(f"order must be >= 4 (the powers' He_3, He_4), got {order}")
    shape, width = m.shape, _width(order)
    ms = torch.stack([m.reshape(-1), s.clamp_min(0).reshape(-1)], 1)
    near, near_out = torch.zeros(len(ms), dtype=torch.bool), None
    if not kinks:
        near = (ms[:, 1] > 0) & (ms[:, 0].abs() < _MU_MAX * ms[:, 1])
        count = int(near.sum())
        plan = _lattice(ms[near]) if count > 64 else None
        if plan is not None and 4 * len(plan[0]) <= count:  # the nodes: a quarter of the positions at most
            near_out = _interpolate(_integrate(f, (), plan[0], order), *plan[1:], order)  # (width, near)
        else:
            near[:] = False
    if near_out is not None and bool(near.all()):
        out = near_out
    else:
        out = torch.empty((width, len(ms)), dtype=_DT)  # (width, positions)
        if near_out is not None:
            out[:, near] = near_out
        rows, where = _unique_rows(ms[~near])
        out[:, ~near] = _integrate(f, kinks, rows, order).reshape(-1, width)[where].T
    h, powers = out[: 3 * (order + 2)].reshape(3, order + 2, *shape), out[3 * (order + 2) :]
    result = {key: (h[i, 0], h[i, -1], list(h[i, 1:-1].unbind(0))) for i, key in enumerate(("f", "df", "u"))}
    result["powers"] = powers.reshape(6, _POWERS, *shape)
    return result


def _interpolate(table: torch.Tensor, rows: torch.Tensor, w: torch.Tensor, order: int) -> torch.Tensor:
    """(width, P): the table (K, width) of :func:`_integrate` at the lattice's nodes interpolated to P
    positions, Σ_k w_k · table[rows_k] over their 16 nodes (a sparse (P, K) matrix product in CSR, 16
    entries a row, by blocks of positions turned as they come; CSR's product is 3–4× COO's on the CPU);
    Var h in place of E[h²] (it keeps its digits where h's mean is large)."""
    hw = 3 * (order + 2)  # f, f', u's columns; the powers' after them
    table = table.clone()
    h = table[:, :hw].unflatten(1, (3, order + 2))  # a view: the edit below is the table's
    h[..., -1] -= h[..., 0] ** 2
    out = []
    with warnings.catch_warnings():  # torch warns that CSR is in beta
        warnings.simplefilter("ignore", UserWarning)
        for start in range(0, rows.shape[1], 8 * _CHUNK):
            r, wc = rows[:, start : start + 8 * _CHUNK], w[:, start : start + 8 * _CHUNK]
            P = r.shape[1]
            starts = torch.arange(0, 16 * P + 1, 16)  # row p's entries: its 16 nodes, sorted
            S = torch.sparse_csr_tensor(starts, r.T.reshape(-1), wc.T.reshape(-1), (P, len(table)),
                                        check_invariants=False)
            out.append((S @ table).T)
    out = torch.cat(out, 1)
    h = out[:hw].unflatten(0, (3, order + 2))
    h[:, -1] += h[:, 0] ** 2
    return out


def law_moments(h: dict, skew: torch.Tensor | None, kurt: torch.Tensor | None) -> dict:
    """E[f], E[f²], E[f³], E[f⁴], E[f'²], E[f'² f], E[f'² f²] (maps) of x with the Gram–Charlier density
    of its first four cumulants, from :func:`hermite_coefficients`' Gaussian ones:

        p(x) = φ(z) (1 + γ₁/6 He_3(z) + γ₂/24 He_4(z)) / s,   E[k(x)] = c_0 + γ₁/√6 c_3 + γ₂/√24 c_4,

    c_n = E_φ[k He_n] / √n! (γ₁, γ₂ None: 0, the normal's moments). Exact for a polynomial k of degree
    ≤ 4 (all four cumulants matched); for f of a sum of a few skewed terms, the Edgeworth series' first
    terms (after a depthwise conv's norm, γ₁ ≈ ±0.5, γ₂ ≈ 0.6: ReLU6's variance per channel within 0.7%
    where the normal of the same mean and variance is 12% off, ``tests/analysis/test_probe_skew.py``)."""
    a = h["f"][2]
    pw = h["powers"]  # (6, 5, ...)
    e1 = h["f"][0]
    ek = torch.stack([h["f"][1], pw[1, 0], pw[2, 0], h["df"][1], pw[4, 0], pw[5, 0]])  # the normal's E[f²] …
    if skew is not None:
        e1 = e1 + skew / 6**0.5 * a[2]
        ek = ek + skew / 6**0.5 * pw[:, 3]
    if kurt is not None:
        e1 = e1 + kurt / 24**0.5 * a[3]
        ek = ek + kurt / 24**0.5 * pw[:, 4]
    return {"e1": e1, "e2": ek[0], "e3": ek[1], "e4": ek[2], "df2": ek[3], "df2f": ek[4], "df2f2": ek[5]}


def _shape(mom: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, var, γ₁, γ₂) of f(x) from its raw moments (γ 0 where the variance is ~0: a constant)."""
    m, e2, e3, e4 = mom["e1"], mom["e2"], mom["e3"], mom["e4"]
    var = (e2 - m * m).clamp_min(0)
    k3 = e3 - 3 * m * e2 + 2 * m**3
    k4 = e4 - 4 * m * e3 + 6 * m * m * e2 - 3 * m**4 - 3 * var * var
    ok = var > 1e-12 * (1 + m * m)
    v = torch.where(ok, var, torch.ones_like(var))
    return m, var, torch.where(ok, k3 / v**1.5, 0.0), torch.where(ok, k4 / (v * v), 0.0)


def _rho_terms(corr: torch.Tensor) -> int:
    """The first N with r^{N+1} ≤ :data:`_TAIL`, r the largest |ρ| off lag 0: the series' terms after N,
    and its remainder, are each at most |ρ|^{N+1} r_p r_q (a transformer's tokens, r ≈ 0.02: N = 4)."""
    H, W = (corr.shape[-2] + 1) // 2, (corr.shape[-1] + 1) // 2
    off = corr.flatten(1).abs()
    off[:, (H - 1) * (2 * W - 1) + W - 1] = 0  # lag 0
    r = float(off.max())
    return _ORDER if r >= 1 else 0 if r == 0 else min(_ORDER, math.ceil(math.log(_TAIL) / math.log(r)) - 1)


def _terms(var: torch.Tensor, coef: list[torch.Tensor], corr: torch.Tensor) -> list[torch.Tensor]:
    """The series' first N terms, those after them moving no lag sum by over 2·:data:`_TAIL` of √(v_p v_q)
    (the remainder term carries them): N is the last n whose tail Σ_{k ≥ n} a_k² is over _TAIL of the
    variance somewhere, or :func:`_rho_terms` if that is less."""
    tail = torch.zeros_like(var)  # Σ_{k ≥ n} a_k² per position, from the last term down
    for k in range(len(coef) - 1, -1, -1):
        tail += coef[k] * coef[k]
        if bool((tail > _TAIL * var).any()):  # the terms from k on still matter somewhere
            return coef[: min(k + 1, _rho_terms(corr))]
    return []


def series_lag_sums(corr: torch.Tensor, mean: torch.Tensor, e2: torch.Tensor, coef: list[torch.Tensor],
                    weight: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_p w_p w_{p+e} Cov(h(x_p), h(x_{p+e})) for every lag e: Mehler's series to ``len(coef)`` and the
    Parseval remainder ρ^{N+1} r_p r_q (see the module docstring).

    The series stops where the terms left hold under :data:`_TAIL` of the variance at every position (a
    smooth f decays fast, :func:`_terms`): the remainder term then carries them, at a power of ρ lower by
    as many. Each term's lag sums are FFTs of their own (C, H, W) map, added as they come: all terms
    at once would hold (N + 1, C, 2H−1, 2W−1) lag maps and their spectra (2.7 GB at MaxViT-T's stem
    GELU, 64 channels on 112 × 112, 25 terms)."""
    w = torch.ones_like(mean) if weight is None else weight
    var = (e2 - mean * mean).clamp_min(0)
    coef = _terms(var, coef, corr)
    rest = (var - sum((c * c for c in coef), torch.zeros_like(var))).clamp_min(0).sqrt()
    T = torch.zeros_like(corr)
    rn = torch.ones_like(corr)
    for c in coef:
        rn = rn * corr
        T += rn * xcorr(w * c, w * c)
    return T + rn * corr * xcorr(w * rest, w * rest)


def dependence_weights(dependence: tuple, mean_y: torch.Tensor, e2_y: torch.Tensor) -> tuple:
    """(a₀, a₁, a₂): E[g² | y] / E[g²] = a₀ + a₁ y + a₂ y² from g's (β₁, β₂) (``Field.dependence``) in the
    standardized units of y, whose mean and E[y²] are given (maps; see the module docstring)."""
    b1, b2 = dependence[:2]
    v = (e2_y - mean_y * mean_y).clamp_min(1e-300)
    s = v.sqrt()
    m = mean_y
    return 1 - b2 - b1 * m / s + b2 * m * m / v, b1 / s - 2 * b2 * m / v, b2 / v


class Pointwise:
    """f applied elementwise (one of :data:`ACTIVATIONS`, or any f with its kinks) to the Gaussian field."""

    def __init__(self, f: str | Callable[[torch.Tensor], torch.Tensor], kinks: tuple[float, ...] = ()
                 ) -> None:
        if isinstance(f, str):
            if f not in ACTIVATIONS:
                raise ValueError(f"f must be a callable or one of {sorted(ACTIVATIONS)}, got {f!r}")
            f, kinks = ACTIVATIONS[f]
        self.f, self.kinks = f, tuple(kinks)

    def forward(self, x: Field) -> Field:
        self.x = x
        order = max(_rho_terms(x.corr), 4)  # the series' terms it can use (4: the powers' He₃, He₄)
        self.h = hermite_coefficients(self.f, self.kinks, x.mean, x.var.clamp_min(0).sqrt(), order)
        mean, e2, coef = self.h["f"]
        var = (e2 - mean * mean).clamp_min(0)
        out = _field_from_sums(mean.clone(), var, series_lag_sums(x.corr, *self.h["f"]))
        # the output's shape from the normal of the input's mean and variance: in a tail the Gram–Charlier
        # density turns negative (at γ₁ = −1 beyond z ≈ 2.5), and a ReLU active there only has a
        # variance near 0 and its standardized cumulants blow up; the next conv sums them anyway
        _, _, skew, kurt = _shape(law_moments(self.h, None, None))
        self.mom = law_moments(self.h, x.skew, x.kurt)
        if x.skew is not None or x.kurt is not None:  # its own mean and variance (the correlation: normal's)
            m, var, _, _ = _shape(self.mom)
            out = replace(out, mean=m, var=var)
        if x.joint is not None:  # neighbours sharing skewed inputs (a depthwise conv's): h_n = √n! a_n
            h = [coef[n - 1] * math.factorial(n) ** 0.5 for n in (1, 2, 3)]
            out = _field_from_sums(out.mean, out.var, out.lag_sums() + joint_lag_sums(x.joint, *h))
        self._keep_for_backward()
        chan, chan_dc = series_channels(x, coef, out)  # the normal's series per channel pair
        out = replace(out, skew=skew, kurt=kurt, chan=chan, chan_dc=chan_dc)
        out.made = activated(x, out, coef)
        return out

    def _keep_for_backward(self) -> None:
        """Of :func:`hermite_coefficients`' table only what the backward reads (f', u, the powers of f'²),
        each map its own tensor: the table is one (width, positions) tensor, and a view of one of its rows
        would keep all of it alive to the end of the walk (0.5 GB at a ViT-B's GELU)."""

        def series(key: str) -> tuple:
            mean, e2, coef = self.h[key]
            kept = _terms((e2 - mean * mean).clamp_min(0), coef, self.x.corr)
            return mean.clone(), e2.clone(), [c.clone() for c in coef[: max(len(kept), 2)]]

        self.h = {"df": series("df"), "u": series("u"), "powers": self.h["powers"][3:6].clone()}
        self.mom = {k: self.mom[k].clone() for k in ("e1", "e2", "df2", "df2f", "df2f2")}

    def backward(self, g: Field) -> Field:
        sg = g.var.clamp_min(0).sqrt()
        corr = self.x.corr

        def second_moments(key: str) -> torch.Tensor:  # Σ_p sg_p sg_q E[h(x_p) h(x_q)] per lag
            mean = self.h[key][0]
            return xcorr(sg * mean, sg * mean) + series_lag_sums(corr, *self.h[key], weight=sg)

        T = g.corr * second_moments("df")
        YY = g.corr * second_moments("u")
        a = self._weights(g.dependence)
        mom = self.mom
        ek = a[0] * mom["df2"] + a[1] * mom["df2f"] + a[2] * mom["df2f2"]  # E[f'(x)² E[g²|x]] / E[g²]
        var = g.var * ek.clamp_min(0)
        out = _field_from_sums(torch.zeros_like(var), var, T, yy=YY.sum((1, 2)))
        out.dependence = self._dependence(a)
        out.coupling = activation_coupling(g, self.h["df"][0], self.h["df"][2][0], self.x.var)
        out.centred = centred.through_factor(g, self.h["df"][0])
        return out

    def _weights(self, dependence: tuple | None) -> tuple:
        """(a₀, a₁, a₂) of :func:`dependence_weights` in y = f(x)'s units (none: 1, 0, 0)."""
        one = torch.ones_like(self.mom["e1"])
        if dependence is None:
            return one, 0 * one, 0 * one
        return dependence_weights(dependence, self.mom["e1"], self.mom["e2"])

    def _dependence(self, a: tuple) -> tuple:
        """(β₁', β₂', r₁, r₂) of the gradient at x (see the module docstring), from the normal's Hermite
        coefficients: K = f'² (a₀ + a₁ f + a₂ f²) and f' alone."""
        c = self.h["powers"]  # f'², f'² f, f'² f²: E[k He_n] / √n!, n = 0 … 4
        k0, k1, k2 = (a[0] * c[0, n] + a[1] * c[1, n] + a[2] * c[2, n] for n in range(3))
        d0, (d1, d2) = self.h["df"][0], self.h["df"][2][:2]  # E[f'], E[f' He_n] / √n!

        def ratio(num, den):
            ok = den.abs() > 1e-300
            return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), 0.0)

        return ratio(k1, k0), ratio(k2, 2**0.5 * k0), ratio(d1, d0), ratio(d2, 2**0.5 * d0)


def hardtanh_rule(m: nn.Hardtanh) -> Pointwise:
    lo, hi = float(m.min_val), float(m.max_val)
    return Pointwise(lambda x: F.hardtanh(x, lo, hi), (lo, hi))


def gelu_rule(approximate: str) -> Pointwise:
    return Pointwise("gelu_tanh" if approximate == "tanh" else "gelu")


register_correlated_rule(nn.ReLU6, lambda m: Pointwise("relu6"))
register_correlated_rule(nn.Hardtanh, hardtanh_rule)
register_correlated_rule(nn.SiLU, lambda m: Pointwise("silu"))
register_correlated_rule(nn.GELU, lambda m: gelu_rule(m.approximate))
register_correlated_rule(nn.Hardswish, lambda m: Pointwise("hardswish"))
register_correlated_rule(nn.Hardsigmoid, lambda m: Pointwise("hardsigmoid"))
register_correlated_rule(nn.Sigmoid, lambda m: Pointwise("sigmoid"))
register_correlated_rule(nn.Tanh, lambda m: Pointwise("tanh"))
register_correlated_rule(
    nn.LeakyReLU, lambda m: Pointwise(partial(F.leaky_relu, negative_slope=m.negative_slope), (0.0,))
)
