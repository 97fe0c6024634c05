"""ReLU of the Gaussian field (and of the skewed residual sum b + ReLU(y)).

ReLU      per position the rectified normal; per lag Mehler's series, a = m/s,
          Cov(ReLU x_p, ReLU x_q) = Σ_{n≥1} ρⁿ/n! c_n(p) c_n(q), c_1 = sΦ(a), c_n = sφ(a)He_{n−2}(−a)
          to n = 12 (one FFT per term: every lag at once; Price's theorem is its first term), and
          where it converges slowly (|ρ| > 0.5, lags |e| ≤ ``exact_lags``) the bivariate normal
          integral E[ReLU(x_p) ReLU(x_q)] (Gauss–Legendre over x_p of the conditional rectified
          mean: the arccos kernel when the means are 0). Back: Cov(g_p, g_q) · P(x_p > 0, x_q > 0),
          P by the same series (k_n = φ(a)He_{n−1}(−a)) or the same integral; where the gradient
          depends on y (``Field.dependence``: a depthwise conv after it) E[1[x > 0] g²] and the input
          gradient's own dependence, in closed form (:mod:`relu_dependence`).
          Of a skewed field (``Field.skew``, ``kurt``: after a depthwise conv) E[ReLU], E[ReLU²] and the
          gate's E[1[x > 0] g²] under the Gram–Charlier density, in closed form (:mod:`relu_shape`);
          the correlations the normal's (plus the joint cumulants' terms, ``Field.joint``, :mod:`joint`).
          Its output carries the rectified normal's γ₁, γ₂.
          Of b + ReLU(y) (``Field.parts``): the skewed sum's own mean and variance, from the law of
          ReLU(y) as atoms (``ReLU.law``: exact block after block of a residual stream, where a normal
          fitted to the stream would lose 6% of its variance a block), its correlations a normal's of
          the sum's moments; back, the stream's gate jointly:
          E[g_y²] = E[g²] P(y > 0 | b + ReLU(y) > 0) (``Field.stream_gate``)
          Of a field with a law (``Field.law``: atoms per position, a Gaussian copula of latent ρ_z,
          :mod:`law`): the moments and P(x > 0) from the atoms; per lag the same series in ρ_z with the
          step function's coefficients, c_n = a_n of ReLU(Q_p(Φ(z))) and k_n those of the gate
          1[z > Φ⁻¹(P(x ≤ 0))] (a normal's: k_n = φ(a)He_{n−1}(−a), a = Φ⁻¹(P(x > 0))), plus
          Parseval's rest ρ_z^{N+1} r_p r_q (r² = Var − Σ c_n²/n!); back the same in k; at a max pool's
          neighbour lags (``Field.copula``) E[ReLU ReLU] and P(both > 0) from the pairs' joint law
          instead (:mod:`copula`)
          Of a field with a regime and no law (``Field.regime``, :mod:`regime`): per position the
          mixture (1 − π) δ_bg + π N(m_s, v_s)'s moments and P(x > 0), the lags' correlation the
          normal's; back, the gate P(x > 0) the mixture's. With a regime (an energy, with or without a
          law) the gate is read against the gradient's per-sample weights (``Field.weight``):
          E[g² 1[x > 0]] = E[g²] mean_s(w_s P_s) / mean_s(w_s), P_s sample s's component's gate
          (:func:`regime.gate_weights`: a gradient larger where the gate is open)
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated import centred, regime
from gatepool.analysis.probe.correlated.add import add_grads
from gatepool.analysis.probe.correlated.channels import activated, series_channels
from gatepool.analysis.probe.correlated.copula import relu_pairs
from gatepool.analysis.probe.correlated.coupling import activation_coupling
from gatepool.analysis.probe.correlated.field import Field, _at_lag, _field_from_sums, _ratio, _valid, xcorr
from gatepool.analysis.probe.correlated.joint import joint_lag_sums
from gatepool.analysis.probe.correlated.law import _icdf, hermite_steps, latent_corr
from gatepool.analysis.probe.correlated.normal import (
    Law,
    _cdf,
    _pdf,
    bivariate_relu,
    relu_law,
    relu_moments_map,
    relu_of_sum_law,
    relu_of_sum_map,
)
from gatepool.analysis.probe.correlated.registry import register_correlated_rule
from gatepool.analysis.probe.correlated.relu_dependence import relu_dependence
from gatepool.analysis.probe.correlated.relu_shape import relu_shape

_SERIES_ORDER = 12  # Mehler's series to ρ¹²: at |ρ| ≤ 0.5 its remainder is < 1e-6 of σ_p σ_q
_SERIES_RHO = 0.5  # above this |ρ| (within ``exact_lags``) the bivariate integral instead
_A_MAX = 38.0  # |m/s| beyond this: φ(a) = 0 in float64 (and a dead position, s = 0, gets ±this)


def _hermite_maps(a: torch.Tensor, order: int) -> list[torch.Tensor]:
    """[He_0(−a), …, He_order(−a)]: the probabilists' Hermite polynomials, He_{k+1} = x He_k − k He_{k−1}."""
    x = -a
    out = [torch.ones_like(a), x]
    for k in range(1, order):
        out.append(x * out[k] - k * out[k - 1])
    return out[: order + 1]


def relu_series_maps(m: torch.Tensor, s: torch.Tensor, order: int = _SERIES_ORDER):
    """Mehler's coefficients of ReLU(m + s z) and of 1[m + s z > 0], z ~ N(0, 1), per position:

        Cov(ReLU(x_p), ReLU(x_q)) = Σ_{n≥1} ρⁿ/n! c_n(p) c_n(q),  c_1 = s Φ(a), c_n = s φ(a) He_{n−2}(−a)
        P(x_p > 0, x_q > 0) = Φ(a_p) Φ(a_q) + Σ_{n≥1} ρⁿ/n! k_n(p) k_n(q),  k_n = φ(a) He_{n−1}(−a)

    (a = m/s; E[f⁽ⁿ⁾(z)] of each function, Mehler's expansion of the bivariate normal). Returns the
    lists c (n = 1…order) and k (n = 1…order), each of maps like ``m``. A dead position (s = 0) has
    c = k = 0."""
    alive = s > 0
    a = torch.where(alive, m / torch.where(alive, s, torch.ones_like(s)), torch.sign(m) * _A_MAX)
    a = a.clamp(-_A_MAX, _A_MAX)
    phi = _pdf(a) * alive
    he = _hermite_maps(a, order)
    c = [s * _cdf(a)] + [s * phi * he[n - 2] for n in range(2, order + 1)]
    k = [phi * he[n - 1] for n in range(1, order + 1)]
    return c, k


def _series_lag_sums(corr: torch.Tensor, maps: list[torch.Tensor], weight: torch.Tensor | None = None,
                     rest: torch.Tensor | None = None):  # fmt: skip
    """Σ_n ρ(e)ⁿ/n! Σ_p f_n(p) f_n(p+e) for every lag e (one FFT per term), f_n = weight · maps[n−1];
    with ``rest`` r, plus ρ^{N+1} Σ_p r(p) r(p+e) (weighted alike)."""
    T = torch.zeros_like(corr)
    rn = torch.ones_like(corr)
    for n, f in enumerate(maps, start=1):
        rn = rn * corr / n
        f = f if weight is None else f * weight
        T += rn * xcorr(f, f)
    if rest is not None:
        r = rest if weight is None else rest * weight
        T += corr ** (len(maps) + 1) * xcorr(r, r)
    return T


def _law_series(law: Law, order: int = _SERIES_ORDER):
    """Per position of a field with a law: (E[p], E[p²], P(x > 0)) of p = ReLU(x), and the series'
    coefficients c, k (as :func:`relu_series_maps`, of the step functions ReLU(Q(Φ(z))) and its gate)
    with their rests r_c, r_k (Parseval: the variance the N terms leave)."""
    xr = law.x.clamp_min(0)
    mu, e2 = (law.w * xr).sum(-1), (law.w * xr * xr).sum(-1)
    pos = (law.w * (law.x > 0)).sum(-1)
    c = hermite_steps(Law(xr, law.w), order)
    a = _icdf(pos.clamp(1e-15, 1 - 1e-15))
    _, k = relu_series_maps(a, torch.ones_like(a), order)
    k = [kn * ((pos > 0) & (pos < 1)) for kn in k]

    def rest(var, f):
        kept = sum(fn * fn / float(math.factorial(n)) for n, fn in enumerate(f, 1))
        return (var - kept).clamp_min(0).sqrt()

    return mu, e2, pos, c, k, rest((e2 - mu * mu).clamp_min(0), c), rest(pos * (1 - pos), k)


class ReLU:
    """ReLU of the Gaussian field: per position the rectified normal, per lag Mehler's series (to ρ¹²),
    and the bivariate integral where the series converges slowly (|ρ| > 0.5 within ``exact_lags``)."""

    def __init__(self, exact_lags: int = 4) -> None:
        self.R = exact_lags

    def _half_lags(self, H, W):
        R = self.R
        return [
            (a, b)
            for a in range(0, min(R, H - 1) + 1)
            for b in range(-min(R, W - 1), min(R, W - 1) + 1)
            if a > 0 or b >= 0
        ]

    def forward(self, x: Field) -> Field:
        out = self._forward(x)
        if x.law is None:  # the normal's series per channel pair (of b + ReLU(y): of the sum's normal)
            normal = out if self.normal is None else self.normal
            out.chan, out.chan_dc = series_channels(x, self.c, normal, factorial=True)
            if x.parts is None and x.regime is None:
                out.made = activated(x, out, self.c, factorial=True)
        self.normal = None  # read by the line above only
        self.mixed = x.regime is not None and x.law is None
        if x.regime is None:
            return out
        mu, e2, pos, moved = regime.relu_of(x.mean, x.var, x.regime)
        if self.mixed:  # a regime (no law): the mixture's moments and gate, the lags' correlation kept
            self.pos, var = pos, (e2 - mu * mu).clamp_min(0)
            out = _field_from_sums(mu, var, out.corr * xcorr(var.sqrt(), var.sqrt()))
        out.regime = moved
        return out

    def _forward(self, x: Field) -> Field:
        self.x, self.stream_gate, self.rho, self.rest, self.normal = x, None, x.corr, (None, None), None
        if x.law is not None and x.parts is None:
            return self._forward_law(x)
        C, H, W = x.shape
        s = x.var.clamp_min(0).sqrt()
        mu, e2, pos = relu_moments_map(x.mean, x.var)
        var = (e2 - mu * mu).clamp_min(0)
        self.mu, self.pos, self.s = mu, pos, s
        self.c, self.k = relu_series_maps(x.mean, s)
        T = _series_lag_sums(x.corr, self.c)
        # the lags where the series is slow: the bivariate integral, on the channels that need it
        self.pairs = []  # (lag, channels, E[ReLU ReLU], P(both > 0)) over the valid pairs, applied in order
        for dh, dw in self._half_lags(H, W):
            rho = _at_lag(x.corr, dh, dw)
            if dh == 0 and dw == 0:
                idx, e, p = torch.arange(C), e2, pos
            else:
                idx = torch.nonzero(rho.abs() > _SERIES_RHO).flatten()
                if not len(idx):
                    continue
                (m1, m2), (s1, s2) = _valid(x.mean[idx], dh, dw), _valid(s[idx], dh, dw)
                e, p = bivariate_relu(m1, s1, m2, s2, rho[idx][:, None, None].expand_as(m1))
            self.pairs.append(((dh, dw), idx, e, p))
            u1, u2 = _valid(mu[idx], dh, dw)
            t = (e - u1 * u2).sum((1, 2))
            T[idx, H - 1 + dh, W - 1 + dw] = t
            T[idx, H - 1 - dh, W - 1 - dw] = t
        out = _field_from_sums(mu, var, T)  # the ReLU of a normal of x's moments
        if x.parts is not None:  # b + ReLU(y): the skewed sum's own moments; the correlations as above
            self.normal = out  # forward's channel correlations read it
            b, stream = x.parts
            mu, e2, pos, both = relu_of_sum_map(b.mean, b.var, stream)
            sd_gauss, var = var.sqrt(), (e2 - mu * mu).clamp_min(0)
            T = _ratio(T, xcorr(sd_gauss, sd_gauss)) * xcorr(var.sqrt(), var.sqrt())
            self.mu, self.pos = mu, pos
            p_y = stream.positive()
            self.stream_gate = torch.where(
                pos * p_y > 0, both / (pos * p_y).clamp_min(1e-300), torch.ones_like(pos)
            )
            return _field_from_sums(mu, var, T)
        mu_s, e2_s, _, skew, kurt = relu_shape(x.mean, x.var, x.skew, x.kurt)
        if x.skew is not None or x.kurt is not None:  # its own mean and variance (the correlation: normal's)
            out = replace(out, mean=mu_s, var=(e2_s - mu_s * mu_s).clamp_min(0))
        if x.joint is not None:  # neighbours sharing skewed inputs (a depthwise conv's): h_n = c_n
            out = _field_from_sums(out.mean, out.var, out.lag_sums() + joint_lag_sums(x.joint, *self.c[:3]))
        return replace(out, skew=skew, kurt=kurt)

    def _forward_law(self, x: Field) -> Field:
        """The ReLU of a field with a law (see the module): the series in ρ_z; the gates' joint
        P(x_p > 0, x_q > 0) = P(z_p > −a_p, z_q > −a_q) exact (the bivariate normal's, a = Φ⁻¹(P(x > 0)))
        where the series is slow."""
        mu, e2, pos, self.c, self.k, rc, rk = _law_series(x.law)
        self.mu, self.pos, self.s, self.pairs = mu, pos, x.var.clamp_min(0).sqrt(), []
        self.rho, self.rest = latent_corr(x.law, x.corr), (rc, rk)
        a = _icdf(pos.clamp(1e-15, 1 - 1e-15))
        C, H, W = x.shape
        for dh, dw in self._half_lags(H, W):
            rho = _at_lag(self.rho, dh, dw)
            idx = torch.nonzero(rho.abs() > _SERIES_RHO).flatten()
            if (dh, dw) != (0, 0) and len(idx):
                (a1, a2), one = _valid(a[idx], dh, dw), torch.ones_like(_valid(a[idx], dh, dw)[0])
                _, p = bivariate_relu(a1, one, a2, one, rho[idx][:, None, None].expand_as(a1))
                self.pairs.append(((dh, dw), idx, None, p))
        T = _series_lag_sums(self.rho, self.c, rest=rc)
        if x.copula is not None:  # a max pool's neighbours: their joint law, not the Gaussian copula's
            for (dh, dw), idx, e, p in relu_pairs(x.copula, x.law):
                self.pairs.append(((dh, dw), idx, e, p))
                u1, u2 = _valid(mu[idx], dh, dw)
                T[idx, H - 1 + dh, W - 1 + dw] = T[idx, H - 1 - dh, W - 1 - dw] = (e - u1 * u2).sum((1, 2))
        return _field_from_sums(mu, (e2 - mu * mu).clamp_min(0), T)

    @functools.cached_property
    def law(self) -> Law:
        """The law of this ReLU's output per position (atoms): of the normal input's rectification, or,
        after an add b + ReLU(y), of ReLU(b + ReLU(y)) from the stream's own law: the next block's add
        takes it (``Field.parts``), so the stream stays exact however many blocks it passes."""
        if self.x.parts is None and self.x.law is not None:  # 0 carries P(x ≤ 0), as relu_law's
            x, w = self.x.law.x, self.x.law.w
            pos = x > 0
            return Law(torch.cat([torch.zeros_like(x[..., :1]), x.clamp_min(0)], -1),
                       torch.cat([(w * ~pos).sum(-1, keepdim=True), w * pos], -1))  # fmt: skip
        if self.x.parts is None:
            return relu_law(self.x.mean, self.x.var)
        b, stream = self.x.parts
        return relu_of_sum_law(b.mean, b.var, stream)

    def backward(self, g: Field | list[Field]) -> Field:
        """The gradient at the input from the output's (or from its parts, each through the gate on its
        own: a part that knows the gate jointly brings ``pre_relu``). After an add b + ReLU(y) the
        result carries ``stream_gate`` (see :class:`Field`): E[g_y²] = E[g_z²] P(y > 0 | z > 0),
        z = b + ReLU(y), by the skewed sum's quadrature, where independent gates give E[g_z²] P(y > 0)."""
        gs = g if isinstance(g, list) else [g]
        out = functools.reduce(add_grads, [self._weighted(p, self._backward(p)) for p in gs])
        if self.stream_gate is not None:
            out = replace(out, stream_gate=self.stream_gate)
        return out

    def _weighted(self, g: Field, out: Field) -> Field:
        """With a regime (an energy): the gate read against the gradient's per-sample weights,
        E[g² 1[x > 0]] = E[g²] mean_s(w_s P_s) / mean_s(w_s) (:func:`regime.gate_weights`), the gate and the
        weights from the regime's components (a law's P(x > 0) not read), and the input's weights."""
        r = self.x.regime
        joint = g.pre_relu is not None or g.stream_gate is not None  # a gate read jointly elsewhere
        if r is None or r.energy is None or joint:
            return out
        gate, w = regime.gate_weights(self.x.mean, self.x.var, r, g.weight)
        var = g.var * gate
        out = _field_from_sums(out.mean, var, out.corr * xcorr(var.sqrt(), var.sqrt()), out.yy)
        out.weight = w
        return out

    def _backward(self, g: Field) -> Field:
        if g.pre_relu is not None:  # the step after knew the gradient through this ReLU
            return g.pre_relu
        if g.stream_gate is not None:  # through the ReLU after an add, whose gate is not independent
            out = self._backward(replace(g, stream_gate=None))
            var = out.var * g.stream_gate
            return _field_from_sums(out.mean, var, out.corr * xcorr(var.sqrt(), var.sqrt()), out.yy)
        H, W = g.shape[1:]
        sg = g.var.clamp_min(0).sqrt()
        var, dependence = g.var * self.pos, None
        coupling = None
        if self.x.law is None and self.x.parts is None and not self.mixed:  # E[1[x > 0] g²], g depending on y
            ek, dependence = relu_dependence(self.x.mean, self.x.var, g.dependence, self.x.skew, self.x.kurt)
            var = g.var * ek
            z = self.x.mean / self.x.var.clamp_min(1e-300).sqrt()
            phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)  # E[1[x > 0] z]
            coupling = activation_coupling(g, self.pos, phi, self.x.var)
        # Cov(g_p, g_q) P(x_p > 0, x_q > 0) and Cov(g_p, g_q) E[ReLU(x_p) ReLU(x_q)], by the series
        rc, rk = self.rest
        T = g.corr * (xcorr(sg * self.pos, sg * self.pos) + _series_lag_sums(self.rho, self.k, sg, rk))
        YY = g.corr * (xcorr(sg * self.mu, sg * self.mu) + _series_lag_sums(self.rho, self.c, sg, rc))
        for (dh, dw), idx, e, p in self.pairs:
            a, b = _valid(sg[idx], dh, dw)
            cg = a * b * _at_lag(g.corr, dh, dw)[idx, None, None]
            t = (cg * p).sum((1, 2))
            for sgn in (1, -1):
                T[idx, H - 1 + sgn * dh, W - 1 + sgn * dw] = t
                if e is not None:  # a joint table's E[ReLU ReLU] (the latent copula's: the series')
                    YY[idx, H - 1 + sgn * dh, W - 1 + sgn * dw] = (cg * e).sum((1, 2))
        out = _field_from_sums(torch.zeros_like(var), var, T, yy=YY.sum((1, 2)))
        out.dependence, out.coupling = dependence, coupling
        out.centred = centred.through_factor(g, self.pos)
        return out


register_correlated_rule(nn.ReLU, lambda m: ReLU())
