"""GroupNorm and BatchNorm at the predicted statistics.

GroupNorm the divisor from the predicted group variance: mean over the group of v + m², less µ̄²,
          less the variance of the group mean, (1/(S n²)) Σ_c Σ_e T_c(e), S the samples the
          statistics pool over (GroupNorm: S = 1, the sample's own; BatchNorm: S = B).
          Back: γ/σ · (g − mean(g) − x̂ · mean(g x̂)), the means over the S·n values (exactly, per draw,
          mean(g_x²) = (γ²/σ²)(mean(g²) − mean(g)² − mean(g x̂)²)); over a group E[g_x²] =
          (E[g²] − E[m_g²] − E[t²]) E[1/σ²], E[m_g²] = (1/(S n²)) Σ T_g, E[t²] = (1/(S n²)) Σ_{p,q}
          E[g_p g_q x̂_p x̂_q] (from the ReLU after the norm where there is one: g independent of the
          ReLU's input; the samples' gradients uncorrelated: the unit-noise seed has mean zero), and
          1/σ² → E[1/σ_b²] ≈ 1/(σ̄² (1 − Var(σ_b²)/σ̄⁴)) for the fluctuating divisor (σ_b² as a scaled
          χ²_k of k = 2σ̄⁴/Var(σ_b²) degrees of freedom, Satterthwaite: E[1/χ²_k] = 1/(k − 2))
BatchNorm train: µ_c, σ_c² over the batch and the positions (the variance plus the mean map's spread);
          eval: the running ones; y = γ(x − µ_c)/σ_c + β per channel. Back: γ/σ_c g for an unknown
          batch; with the batch size B, GroupNorm's rule with one channel a group over S = B samples:
          the projections take E[g²]/B of a gradient that is constant over the positions (the
          gradient from a global pool is) but not the part whose batch mean a BatchNorm's backward
          nearer the output already took (``Field.centred``, :mod:`centred`), and E[1/σ_b²] grows
          as B·H·W shrinks
Both keep the input's skewness and excess kurtosis (``Field.skew``, ``kurt``): an affine map per channel
(γ₁'s sign flips with γ's); back, the gradient's dependence on the value (``Field.dependence``: in
standardized units, the same of x and of γ x̂ + β; β₁ and r₁'s sign γ's).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.centred import spatial_mean2, through_factor
from gatepool.analysis.probe.correlated.channels import signed_channels
from gatepool.analysis.probe.correlated.copula import moved
from gatepool.analysis.probe.correlated.coupling import affine_coupling
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.joint import flipped
from gatepool.analysis.probe.correlated.law import reshaped
from gatepool.analysis.probe.correlated.registry import (
    register_correlated_rule,
    register_named_rule,
    rule_for,
)
from gatepool.analysis.probe.correlated.steps import Steps


def _carry_law(x: Field, out: Field, scale: torch.Tensor) -> Field:
    """``out`` with ``x``'s law (if any) moved to its mean and variance and its pairs' joint law
    (``Field.copula``) through the norm's affine map of ``scale`` (C,)."""
    if x.law is None:
        return out
    out.law = reshaped(x.law, out.mean, out.var)
    out.copula = moved(x.copula, scale)
    return out


def _shape(x: Field, scale: torch.Tensor) -> dict:
    """The skewness, excess kurtosis and channel correlations through y = a_c x + b (``Field.skew``'s sign
    is a_c's, ``Field.chan``'s a_a a_b's)."""
    out = {"kurt": x.kurt, "joint": None if x.joint is None else flipped(x.joint, torch.sign(scale)),
           **signed_channels(x, scale)}  # fmt: skip
    if x.skew is not None:
        out["skew"] = x.skew * torch.sign(scale)[:, None, None]
    return out


def _dependence(g: Field, out: Field, scale: torch.Tensor | None) -> Field:
    """``out`` (the gradient at the norm's input) with ``g``'s dependence on the value, through the
    affine map of scale (C,) (None: 1): He₁'s terms change sign with it, He₂'s do not."""
    if g.dependence is not None:
        sign = torch.ones(out.shape[0], dtype=_DT) if scale is None else torch.sign(scale)
        b1, b2, r1, r2 = g.dependence
        odd = sign[:, None, None]
        out.dependence = (b1 * odd, b2, None if r1 is None else r1 * odd, r2)
    return out


class GroupNorm:
    """GroupNorm(G, C) at the predicted statistics; the divisor is one per group (its expectation).

    ``samples``: how many independent samples the statistics pool over (1: GroupNorm's own sample;
    B: a BatchNorm in training, one channel a group).
    """

    def __init__(self, groups: int, weight, bias, eps: float, samples: int = 1) -> None:
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be an int >= 1, got {samples!r}")
        self.G, self.S = groups, samples
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
        S = self.S
        T = x.lag_sums()
        V = self._group(T).sum((1, 2, 3)) / (S * n**2)  # (G,) Var of the group mean
        Vc = V.repeat_interleave(C // self.G)[:, None, None]  # (C, 1, 1)
        s = x.var.clamp_min(0).sqrt()
        # Σ_e ρ(e) s(p+e) = (ρ ⋆ s)(p): a correlation of s with the lag kernel, by FFT
        size = (3 * H - 2, 3 * W - 2)
        conv = torch.fft.irfft2(
            torch.fft.rfft2(s, s=size) * torch.fft.rfft2(torch.flip(x.corr, (-2, -1)), s=size), s=size
        )[:, H - 1 : 2 * H - 1, W - 1 : 2 * W - 1]
        c = s * conv / (S * n)  # (C, H, W) Cov(x_p, µ_g)
        var = (x.var - 2 * c + Vc).clamp_min(0)
        b = T.sum((1, 2))[:, None, None] / (S * n * H * W)  # (C, 1, 1)
        N = xcorr(torch.ones((1, H, W), dtype=_DT), torch.ones((1, H, W), dtype=_DT))
        Tc = T - N * (2 * b - Vc)
        m = self._group(x.mean)
        mu = m.mean((1, 2, 3))  # (G,)
        sigma2 = self._group(var + x.mean**2).mean((1, 2, 3)) - mu * mu + self.eps
        self.sigma2 = sigma2
        # σ_b² fluctuates: E[1/σ_b²] ≈ 1/(σ̄² (1 − Var(σ_b²)/σ̄⁴)) (a scaled χ²), with (Gaussian) Var(σ_b²) =
        # (2 Σ_{p,q} Cov² + 4 Σ_{p,q} m̃_p m̃_q Cov) / (S n²), m̃ = m − µ̄ (the backward's divisor)
        sv = var.sqrt()
        mt = x.mean - mu.repeat_interleave(C // self.G)[:, None, None]
        cov2 = (Tc / xcorr(sv, sv).clamp_min(1e-300)).clamp(-1, 1) ** 2 * xcorr(var, var)
        mcov = (Tc / xcorr(sv, sv).clamp_min(1e-300)).clamp(-1, 1) * xcorr(mt * sv, mt * sv)
        var_s2 = self._group(2 * cov2 + 4 * mcov).sum((1, 2, 3)) / (S * n**2)
        self.jensen = 1 / (1 - var_s2 / sigma2**2).clamp_min(0.1)  # k ≥ 2.2 degrees of freedom
        s2 = sigma2.repeat_interleave(C // self.G)[:, None, None]
        xhat_m = (x.mean - mu.repeat_interleave(C // self.G)[:, None, None]) / s2.sqrt()
        Tc[:, H - 1, W - 1] = var.sum((1, 2))
        self.xhat = _field_from_sums(xhat_m, var / s2, Tc / s2)
        gam = torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma
        bet = torch.zeros(C, dtype=_DT) if self.beta is None else self.beta
        out = Field(
            gam[:, None, None] * self.xhat.mean + bet[:, None, None],
            gam[:, None, None] ** 2 * self.xhat.var,
            self.xhat.corr,
            **_shape(x, gam),
        )
        if self.G != C:  # a group's mean and σ mix its channels: their correlations not kept
            out.chan = out.chan_dc = None
        return _carry_law(x, out, gam)

    def backward(self, g: Field) -> Field:
        C, H, W = g.shape
        n = C // self.G * H * W
        Sn2 = self.S * n**2
        gam = torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma
        g2 = (gam**2)[:, None, None]
        Tg = g.lag_sums() * g2  # of g_x̂ = γ g_y
        kept = Tg.sum((1, 2))  # Σ_e T(e) of g_x̂; a BatchNorm's: less what the batch's mean cancels
        if self.S > 1 and g.centred is not None:  # (Tg at hand: the clamp of centred.cancelled, here)
            kept = (kept - gam**2 * g.centred * (H * W) ** 2).clamp_min(0)
        e_m2 = self._group(kept).sum(1) / Sn2  # E[mean(g_x̂)²]
        beta0 = self.beta is None or bool((self.beta == 0).all())
        if g.yy is not None and beta0:  # g_x̂ x̂ = g_y · y (β = 0): from the ReLU after the norm
            e_t2 = self._group(g.yy).sum(1) / Sn2
        else:  # g independent of x̂: Σ_{p,q} Cov(g_p, g_q) E[x̂_p x̂_q]
            xh = self.xhat
            s, sg = xh.var.clamp_min(0).sqrt(), (g.var * g2).clamp_min(0).sqrt()
            X = xh.corr * xcorr(sg * s, sg * s) + xcorr(sg * xh.mean, sg * xh.mean)
            e_t2 = self._group((g.corr * X).sum((1, 2))).sum(1) / Sn2
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
        out = _dependence(g, _field_from_sums(torch.zeros_like(var), var, T), self.gamma)
        if self.G == C:  # one channel a group (BatchNorm): the affine map γ/σ per channel
            out.coupling = affine_coupling(g.coupling, gam / self.sigma2.sqrt())
            if self.S > 1:  # the batch's mean is out of it
                out.centred = spatial_mean2(out)
        return out


class BatchNorm:
    """BatchNorm over the batch and the positions, per channel: y = γ_c (x − µ_c)/σ_c + β_c.

    Training (``running_mean``/``running_var`` None: the batch's own statistics) with ``batch`` B known:
    :class:`GroupNorm`'s rule with one channel a group over B samples, n = H·W values each. The
    statistics pool B·H·W values, the gradient's too: it loses its mean over them and its projection on
    x̂ (2 of B·H·W degrees of freedom when its positions are independent, but E[g²]/B of a gradient
    constant over the positions, as a global pool's is, and more where x̂'s positions are correlated),
    and the batch's own σ_b² fluctuates (E[1/σ_b²] > 1/E[σ_b²]; at 8 images of 2×2 maps by a sixth).
    ``batch`` None: infinitely many samples, at the expectation: µ_c = mean_p m(c, p), σ_c² = mean_p
    (v + m²) − µ_c² + eps (the positions' variance plus the spread of the mean map), back γ/σ_c g.
    Eval: µ_c, σ_c² + eps the running ones, one affine map per channel either way.
    """

    def __init__(self, weight, bias, eps: float, running_mean=None, running_var=None, batch: int | None = None
                 ) -> None:  # fmt: skip
        def t(v):
            return None if v is None else v.detach().to("cpu", _DT)

        if batch is not None and (not isinstance(batch, int) or batch < 1):
            raise ValueError(f"batch must be None or an int >= 1, got {batch!r}")
        self.gamma, self.beta, self.eps = t(weight), t(bias), eps
        self.rm, self.rv = t(running_mean), t(running_var)
        self.batch = batch

    def forward(self, x: Field) -> Field:
        C = x.shape[0]
        self.norm = None
        if self.rv is None and self.batch is not None:  # the batch's statistics, B samples of them
            self.norm = GroupNorm(C, self.gamma, self.beta, self.eps, samples=self.batch)
            return self.norm.forward(x)
        if self.rv is None:
            mu = x.mean.mean((1, 2))  # (C,)
            sigma2 = (x.var + x.mean**2).mean((1, 2)) - mu * mu + self.eps
        else:
            mu, sigma2 = self.rm, self.rv + self.eps
        a = (torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma) / sigma2.clamp_min(1e-300).sqrt()
        b = (torch.zeros(C, dtype=_DT) if self.beta is None else self.beta) - a * mu
        self.a = a[:, None, None]  # (C, 1, 1)
        return _carry_law(
            x, Field(self.a * x.mean + b[:, None, None], self.a**2 * x.var, x.corr, **_shape(x, a)), a
        )

    def backward(self, g: Field) -> Field:
        if self.norm is not None:
            return self.norm.backward(g)
        out = _dependence(g, Field(torch.zeros_like(g.var), self.a**2 * g.var, g.corr), self.a[:, 0, 0])
        out.coupling = affine_coupling(g.coupling, self.a[:, 0, 0])
        out.centred = through_factor(g, self.a)
        return out


@register_correlated_rule(nn.GroupNorm)
@register_named_rule("timm.layers.norm.GroupNorm", "timm.layers.norm.GroupNorm1")
def groupnorm_rule(m: nn.GroupNorm) -> GroupNorm:
    return GroupNorm(m.num_groups, m.weight if m.affine else None, m.bias if m.affine else None, m.eps)


@register_correlated_rule(nn.modules.batchnorm._BatchNorm)
@register_correlated_rule(nn.SyncBatchNorm)  # its own forward: on one process, BatchNorm's
def batchnorm_rule(m: nn.modules.batchnorm._BatchNorm) -> BatchNorm:
    """Training (or no running statistics): the batch's own; eval: the running ones, an affine map."""
    running = not m.training and m.running_var is not None
    return BatchNorm(
        m.weight if m.affine else None,
        m.bias if m.affine else None,
        m.eps,
        m.running_mean if running else None,
        m.running_var if running else None,
    )


class NormAct(Steps):
    """timm's norm-and-activation modules (``BatchNormAct2d``, ``GroupNormAct``): a norm class whose forward
    also applies its dropout and its activation, so the norm's rule alone would skip them. The three
    steps one after another, forward and backward."""

    def __init__(self, m: nn.Module, norm) -> None:
        rest = []
        for part in (m.drop, m.act):
            make = rule_for(part)
            if make is None:
                raise NotImplementedError(f"{type(m).__name__}: no correlated rule for {type(part).__name__}")
            rest.append(make(part))
        super().__init__(norm, *rest)


register_named_rule("timm.layers.norm_act.BatchNormAct2d", "timm.layers.norm_act.SyncBatchNormAct")(
    lambda m: NormAct(m, batchnorm_rule(m))
)
register_named_rule("timm.layers.norm_act.GroupNormAct", "timm.layers.norm_act.GroupNorm1Act")(
    lambda m: NormAct(m, groupnorm_rule(m))
)
