"""Any pointwise activation f of the Gaussian field: ReLU6, SiLU, GELU, Hardswish, Hardsigmoid, sigmoid, tanh.

x = m + s z at each position (z ~ N(0, 1)); every expectation is Gauss–Legendre over z ∈ [−9, 9], cut into
pieces at f's kinks (where f or f' jumps: ReLU6 at 0 and 6, the hard ones at ±3), so each piece is smooth.

per position  E[f(x)], Var f(x); back E[f'(x)²]
per lag       Mehler's series in the normalized Hermite coefficients a_n(p) = E[f(x_p) He_n(z_p)] / √n!:

                  Cov(f(x_p), f(x_q)) = Σ_{n=1..N} ρⁿ a_n(p) a_n(q) + ρ^{N+1} r(p) r(q),
                  r² = Var f(x) − Σ_{n ≤ N} a_n²   (Parseval: the series' whole remainder at ρ = 1)

              so the sum is exact at ρ = 0 and at ρ = 1, and between them off by at most ρ^{N+1} r²
              (a kink makes a_n decay slowly: the remainder term carries what N = 24 terms leave).
backward      g independent of x: Cov(g_p f'(x_p), g_q f'(x_q)) = Cov(g_p, g_q) E[f'(x_p) f'(x_q)], the same
              series of f' (its mean b_0 = E[f'] included); for a norm before it (``Field.yy``)
              E[g_p g_q x_p x_q f'(x_p) f'(x_q)], the series of u(x) = x f'(x).

Cost: the integrals (each position's, or for f without kinks a lattice's, interpolated: see
:func:`hermite_coefficients`) and one batch of FFTs per series.

ReLU keeps its own rule (:mod:`relu`: exact integrals at the near lags, the shapes b + ReLU(y)).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr

_ORDER = 24  # Mehler's series to ρ²⁴, then the Parseval remainder
_Z = 9.0  # the normal beyond |z| = 9 has mass 2e-19
_PIECES = 8  # [−9, 9] in 8 equal pieces (plus cuts at the kinks), 16-point Gauss–Legendre on each
_GL_X, _GL_W = (torch.tensor(a, dtype=_DT) for a in np.polynomial.legendre.leggauss(16))
_CHUNK = 2048  # positions at a time (the nodes of 2048 positions: 2048 × 160 float64 per map)
_GRID = 1 / 64  # the interpolation lattice's step in μ = m/s and in log s (f without kinks)
_MU_MAX = 1e4  # |μ| beyond which a position is integrated on its own

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
    """(P, 3, order + 2) at the rows (m, s) of ms (P, 2): for h = f, f', u, E[h], a_1 … a_order, E[h²].

    Without kinks every position has the same nodes z and weights: the Hermite basis is made once and
    each coefficient is one matrix product over the nodes; with kinks (cut where they fall for each
    position) the basis is per position."""
    shared = None
    if not kinks:
        z, w = _nodes(ms[:1, 0], ms[:1, 1], ())  # (1, Q): the same for every position
        shared = (z, (w[0, :, None] * _basis(z[0], order)))  # (Q, order + 1), the weights in
    parts = []
    for chunk in ms.split(_CHUNK):
        mc, sc = chunk[:, 0], chunk[:, 1]
        z, w = (shared[0].expand(len(mc), -1), None) if shared else _nodes(mc, sc, kinks)  # (P, Q)
        x = (mc[:, None] + sc[:, None] * z).requires_grad_()
        with torch.enable_grad():
            y = f(x)
            (dy,) = torch.autograd.grad(y.sum(), x)
        x, y = x.detach(), y.detach()
        h = torch.stack([y, dy, x * dy], 1)  # (P, 3, Q): f, f', u
        if shared:
            coef = h @ shared[1]  # (P, 3, order + 1)
            sq = (h * h) @ shared[1][:, 0]  # (P, 3): E[h²] (He_0 = 1)
            parts.append(torch.cat([coef, sq[..., None]], 2))
        else:
            wh = w[:, None, :] * h
            parts.append(torch.cat([torch.bmm(wh, _basis(z, order)), (wh * h).sum(2, keepdim=True)], 2))
    return torch.cat(parts) if parts else torch.empty((0, 3, order + 2), dtype=_DT)


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
    ``{name: (E[h], E[h²], [a_1 … a_order])}``, a_n = E[h(x) He_n(z)] / √n! (maps like m).

    Positions with the same (m, s) (a map's interior, away from its borders and the data's layout) are
    integrated once. For f without kinks each of these is an analytic function of (μ = m/s, log s): where
    the positions are over four times the nodes of the lattice of step :data:`_GRID` in both around them
    (a transformer's tokens, a map whose every position differs a little), the lattice's nodes are
    integrated and the positions interpolated, cubic in each: within 1e-7 of h's standard deviation and
    Var h within 1e-6 of itself (``tests/analysis/test_probe_speed.py``)."""
    shape, width = m.shape, 3 * (order + 2)
    ms = torch.stack([m.reshape(-1), s.clamp_min(0).reshape(-1)], 1)
    near, near_out = torch.zeros(len(ms), dtype=torch.bool), None
    if not kinks:
        near = (ms[:, 1] > 0) & (ms[:, 0].abs() < _MU_MAX * ms[:, 1])
        count = int(near.sum())
        plan = _lattice(ms[near]) if count > 64 else None
        if plan is not None and 4 * len(plan[0]) <= count:  # the nodes: a quarter of the positions at most
            near_out = _interpolate(_integrate(f, (), plan[0], order), *plan[1:])  # (width, near positions)
        else:
            near[:] = False
    if near_out is not None and bool(near.all()):
        out = near_out
    else:
        out = torch.empty((width, len(ms)), dtype=_DT)  # (3 · (order + 2), positions)
        if near_out is not None:
            out[:, near] = near_out
        rows, where = _unique_rows(ms[~near])
        out[:, ~near] = _integrate(f, kinks, rows, order).reshape(-1, width)[where].T
    out = out.reshape(3, order + 2, *shape)
    return {key: (out[i, 0], out[i, -1], list(out[i, 1:-1].unbind(0)))
            for i, key in enumerate(("f", "df", "u"))}


def _interpolate(table: torch.Tensor, rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(3 · (order + 2), P): the table (K, 3, order + 2) at the lattice's nodes interpolated to P
    positions, Σ_k w_k · table[rows_k] over their 16 nodes (a sparse (P, K) matrix product, by blocks of
    positions turned as they come); Var h in place of E[h²] (it keeps its digits where h's mean is
    large)."""
    table = table.clone()
    table[..., -1] -= table[..., 0] ** 2
    table = table.flatten(1)  # (K, width)
    out = []
    for start in range(0, rows.shape[1], 8 * _CHUNK):
        r, wc = rows[:, start : start + 8 * _CHUNK], w[:, start : start + 8 * _CHUNK]
        P = r.shape[1]
        at = torch.stack([torch.arange(P).repeat_interleave(16), r.T.reshape(-1)])  # each row's nodes, sorted
        S = torch.sparse_coo_tensor(at, wc.T.reshape(-1), (P, len(table)), is_coalesced=True,
                                    check_invariants=False)
        out.append(torch.sparse.mm(S, table).T)
    out = torch.cat(out, 1).reshape(3, -1, rows.shape[1])
    out[:, -1] += out[:, 0] ** 2
    return out.flatten(0, 1)


def series_lag_sums(corr: torch.Tensor, mean: torch.Tensor, e2: torch.Tensor, coef: list[torch.Tensor],
                    weight: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_p w_p w_{p+e} Cov(h(x_p), h(x_{p+e})) for every lag e: Mehler's series to ``len(coef)`` and the
    Parseval remainder ρ^{N+1} r_p r_q (see the module docstring).

    The series stops where the terms left hold under 1e-12 of the variance at every position (a smooth f
    decays fast): the remainder term then carries them, at a power of ρ lower by as many. The lag sums
    of all its terms are one batch of FFTs."""
    w = torch.ones_like(mean) if weight is None else weight
    var = (e2 - mean * mean).clamp_min(0)
    tail, keep = torch.zeros_like(var), 0  # Σ_{k ≥ n} a_k² per position, from the last term down
    for n in range(len(coef) - 1, -1, -1):
        tail += coef[n] * coef[n]
        if bool((tail > 1e-12 * var).any()):  # the terms from n on still matter somewhere
            keep = n + 1
            break
    coef = coef[:keep]
    rest = (var - sum((c * c for c in coef), torch.zeros_like(var))).clamp_min(0).sqrt()
    maps = torch.stack([w * c for c in coef] + [w * rest])  # (N + 1, C, H, W)
    X = xcorr(maps, maps)  # (N + 1, C, 2H−1, 2W−1)
    T = torch.zeros_like(corr)
    rn = torch.ones_like(corr)
    for n in range(keep):
        rn = rn * corr
        T += rn * X[n]
    return T + rn * corr * X[keep]


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
        self.h = hermite_coefficients(self.f, self.kinks, x.mean, x.var.clamp_min(0).sqrt())
        mean, e2, coef = self.h["f"]
        return _field_from_sums(mean, (e2 - mean * mean).clamp_min(0), series_lag_sums(x.corr, *self.h["f"]))

    def backward(self, g: Field) -> Field:
        sg = g.var.clamp_min(0).sqrt()
        corr = self.x.corr

        def second_moments(key: str) -> torch.Tensor:  # Σ_p sg_p sg_q E[h(x_p) h(x_q)] per lag
            mean = self.h[key][0]
            return xcorr(sg * mean, sg * mean) + series_lag_sums(corr, *self.h[key], weight=sg)

        T = g.corr * second_moments("df")
        YY = g.corr * second_moments("u")
        var = g.var * self.h["df"][1]  # E[g²] E[f'(x)²]
        return _field_from_sums(torch.zeros_like(var), var, T, yy=YY.sum((1, 2)))
