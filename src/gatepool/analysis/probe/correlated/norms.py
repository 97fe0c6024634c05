"""GroupNorm and BatchNorm at the predicted statistics.

GroupNorm the divisor from the predicted group variance: mean over the group of v + m², less µ̄²,
          less the variance of the sample's own group mean, (1/n²) Σ_c Σ_e T_c(e).
          Back: γ/σ · (g − mean(g) − x̂ · mean(g x̂)); over a group E[g_x²] = (E[g²] − E[m_g²] −
          E[t²]) / σ², E[m_g²] = (1/n²) Σ T_g, E[t²] = (1/n²) Σ_{p,q} E[g_p g_q x̂_p x̂_q] (from
          the ReLU after the norm where there is one: g independent of the ReLU's input), and
          1/σ² → E[1/σ_b²] ≈ (1 + Var(σ_b²)/σ̄⁴)/σ̄² for the sample's own fluctuating divisor
BatchNorm train: µ_c, σ_c² over the positions (the variance plus the mean map's spread); eval: the
          running ones; y = γ(x − µ_c)/σ_c + β per channel. Back: γ/σ_c g (O(1/B) terms dropped)
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr


class GroupNorm:
    """GroupNorm(G, C) at the predicted statistics; the divisor is one per group (its expectation)."""

    def __init__(self, groups: int, weight, bias, eps: float) -> None:
        self.G = groups
        self.gamma = None if weight is None else weight.detach().to("cpu", _DT)
        self.beta = None if bias is None else bias.detach().to("cpu", _DT)
        self.eps = eps

    def _group(self, t: torch.Tensor) -> torch.Tensor:  # (C, ...) -> (G, C/G, ...)
        return t.reshape(self.G, -1, *t.shape[1:])

    def forward(self, x: Field) -> Field:
        """x − µ_g, the sample's own group mean: Cov(x_p − µ_g, x_q − µ_g) = Cov(p, q) − c_p − c_q + V,
        c_p = Cov(x_p, µ_g) = (1/n) √v_p Σ_e ρ(e) √v_{p+e},  V = Var(µ_g) = (1/n²) Σ_c Σ_e T_c(e);
        over the pairs at lag e, c_p + c_q is taken as its mean 2 b_c (b_c = Σ_e T_c(e) / (n·HW))."""
        self.x = x
        C, H, W = x.shape
        n = C // self.G * H * W
        T = x.lag_sums()
        V = self._group(T).sum((1, 2, 3)) / n**2  # (G,) Var of the sample's group mean
        Vc = V.repeat_interleave(C // self.G)[:, None, None]  # (C, 1, 1)
        s = x.var.clamp_min(0).sqrt()
        # Σ_e ρ(e) s(p+e) = (ρ ⋆ s)(p): a correlation of s with the lag kernel, by FFT
        size = (3 * H - 2, 3 * W - 2)
        conv = torch.fft.irfft2(
            torch.fft.rfft2(s, s=size) * torch.fft.rfft2(torch.flip(x.corr, (-2, -1)), s=size), s=size
        )[:, H - 1 : 2 * H - 1, W - 1 : 2 * W - 1]
        c = s * conv / n  # (C, H, W) Cov(x_p, µ_g)
        var = (x.var - 2 * c + Vc).clamp_min(0)
        b = T.sum((1, 2))[:, None, None] / (n * H * W)  # (C, 1, 1)
        N = xcorr(torch.ones((1, H, W), dtype=_DT), torch.ones((1, H, W), dtype=_DT))
        Tc = T - N * (2 * b - Vc)
        m = self._group(x.mean)
        mu = m.mean((1, 2, 3))  # (G,)
        sigma2 = self._group(var + x.mean**2).mean((1, 2, 3)) - mu * mu + self.eps
        self.sigma2 = sigma2
        # the sample's own σ_b² fluctuates: E[1/σ_b²] ≈ (1 + Var(σ_b²)/σ̄⁴)/σ̄², with (Gaussian)
        # Var(σ_b²) = (2 Σ_{p,q} Cov² + 4 Σ_{p,q} m̃_p m̃_q Cov) / n², m̃ = m − µ̄ (the backward's divisor)
        sv = var.sqrt()
        mt = x.mean - mu.repeat_interleave(C // self.G)[:, None, None]
        cov2 = (Tc / xcorr(sv, sv).clamp_min(1e-300)).clamp(-1, 1) ** 2 * xcorr(var, var)
        mcov = (Tc / xcorr(sv, sv).clamp_min(1e-300)).clamp(-1, 1) * xcorr(mt * sv, mt * sv)
        var_s2 = self._group(2 * cov2 + 4 * mcov).sum((1, 2, 3)) / n**2
        self.jensen = 1 + var_s2 / sigma2**2
        s2 = sigma2.repeat_interleave(C // self.G)[:, None, None]
        xhat_m = (x.mean - mu.repeat_interleave(C // self.G)[:, None, None]) / s2.sqrt()
        Tc[:, H - 1, W - 1] = var.sum((1, 2))
        self.xhat = _field_from_sums(xhat_m, var / s2, Tc / s2)
        gam = torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma
        bet = torch.zeros(C, dtype=_DT) if self.beta is None else self.beta
        return Field(
            gam[:, None, None] * self.xhat.mean + bet[:, None, None],
            gam[:, None, None] ** 2 * self.xhat.var,
            self.xhat.corr,
        )

    def backward(self, g: Field) -> Field:
        C, H, W = g.shape
        n = C // self.G * H * W
        gam = torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma
        g2 = (gam**2)[:, None, None]
        Tg = g.lag_sums() * g2  # of g_x̂ = γ g_y
        e_m2 = self._group(Tg).sum((1, 2, 3)) / n**2  # E[mean(g_x̂)²]
        beta0 = self.beta is None or bool((self.beta == 0).all())
        if g.yy is not None and beta0:  # g_x̂ x̂ = g_y · y (β = 0): from the ReLU after the norm
            e_t2 = self._group(g.yy).sum(1) / n**2
        else:  # g independent of x̂: Σ_{p,q} Cov(g_p, g_q) E[x̂_p x̂_q]
            xh = self.xhat
            s, sg = xh.var.clamp_min(0).sqrt(), (g.var * g2).clamp_min(0).sqrt()
            X = xh.corr * xcorr(sg * s, sg * s) + xcorr(sg * xh.mean, sg * xh.mean)
            e_t2 = self._group((g.corr * X).sum((1, 2))).sum(1) / n**2
        e_g2 = self._group(g.var * g2).mean((1, 2, 3))
        f = ((e_g2 - e_m2 - e_t2) / e_g2.clamp_min(1e-300)).clamp_min(0)  # the projection's share kept
        var = (g.var * g2).reshape(self.G, -1, H, W) * (f * self.jensen / self.sigma2)[:, None, None, None]
        var = var.reshape(C, H, W)
        # the lags: T − N(e) E[m²] − E[t²] Σ_p E[x̂_p x̂_{p+e}], over σ²
        xh = self.xhat
        s = xh.var.clamp_min(0).sqrt()
        X = xh.corr * xcorr(s, s) + xcorr(xh.mean, xh.mean)  # (C, 2H−1, 2W−1)
        N = xcorr(torch.ones((1, H, W), dtype=_DT), torch.ones((1, H, W), dtype=_DT))
        rep = C // self.G
        em2, et2, s2 = (
            t.repeat_interleave(rep)[:, None, None] for t in (e_m2, e_t2, self.sigma2 / self.jensen)
        )
        T = (Tg - N * em2 - X * et2) / s2
        T[:, H - 1, W - 1] = var.sum((1, 2))
        return _field_from_sums(torch.zeros_like(var), var, T)


class BatchNorm:
    """BatchNorm over the batch and the positions, per channel: y = a_c x + b_c, one affine per channel.

    Training (``running_mean``/``running_var`` None: the batch's own statistics), at their expectation:
        µ_c = mean_p m(c, p),   σ_c² = mean_p (v(c, p) + m(c, p)²) − µ_c² + eps
    (the within-channel variance: the positions' variance plus the spread of the position-mean map);
    eval: µ_c, σ_c² + eps the running ones. a_c = γ_c/σ_c, b_c = β_c − a_c µ_c; the mean map becomes
    a m + b, the variance map a² v, the stencil is kept. Back: g_x = a_c g_y. In training the exact
    backward also subtracts the gradient's mean over the batch and positions and its projection on x̂;
    both are O(1/B) of E[g²] (B·H·W values per channel, the samples' gradients independent) and dropped,
    as the batch's own fluctuation of µ_c and σ_c is (the prediction does not know B).
    """

    def __init__(self, weight, bias, eps: float, running_mean=None, running_var=None) -> None:
        def t(v):
            return None if v is None else v.detach().to("cpu", _DT)

        self.gamma, self.beta, self.eps = t(weight), t(bias), eps
        self.rm, self.rv = t(running_mean), t(running_var)

    def forward(self, x: Field) -> Field:
        C = x.shape[0]
        if self.rv is None:
            mu = x.mean.mean((1, 2))  # (C,)
            sigma2 = (x.var + x.mean**2).mean((1, 2)) - mu * mu + self.eps
        else:
            mu, sigma2 = self.rm, self.rv + self.eps
        a = (torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma) / sigma2.clamp_min(1e-300).sqrt()
        b = (torch.zeros(C, dtype=_DT) if self.beta is None else self.beta) - a * mu
        self.a = a[:, None, None]  # (C, 1, 1)
        return Field(self.a * x.mean + b[:, None, None], self.a**2 * x.var, x.corr)

    def backward(self, g: Field) -> Field:
        return Field(torch.zeros_like(g.var), self.a**2 * g.var, g.corr)
