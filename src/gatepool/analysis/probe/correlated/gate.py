"""A product of the signal with a gate computed from it: y = x · s, s a (C, 1, 1) value per sample and
channel (squeeze-and-excitation's σ(fc(mean_p x)): EfficientNet, MobileNetV3), taken independent of x
(s sees x only through its mean over all positions and, through the fc layers, over all channels); the
gradient g at y is not: see ∂L/∂s below.

forward   E[y_p] = E[s] m_p;  E[y_p y_q] = E[s²] E[x_p x_q]:
          Var y_p = E[s²](v_p + m_p²) − E[s]² m_p²,   T_y(e) = E[s²](T(e) + M(e)) − E[s]² M(e),
          M(e) = Σ_p m_p m_{p+e}
backward  ∂L/∂x = s g:  E[s²] Cov(g_p, g_q);
          ∂L/∂s = Σ_p g_p x_p:  E[(∂L/∂s)²] = Σ_{p,q} Cov(g_p, g_q) E[x_p x_q]
                 = Σ_e ρ_g(e) [ρ_x(e) Σ_p (s_g √v)_p (s_g √v)_{p+e} + Σ_p (s_g m)_p (s_g m)_{p+e}],
          s_g = √E[g²];  where the activations after the gate read x through 1 × 1 convs, g responds to x
          (``Field.coupling``): plus 2 E[s] Σ Cov(g⁰_p, Λ_q) m_p v_q + E[s²] Σ Cov(Λ_p, Λ_q) v_p v_q
          (:mod:`coupling`)
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated import centred
from gatepool.analysis.probe.correlated.channels import gate_channels
from gatepool.analysis.probe.correlated.coupling import gate_coupling_term
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr


class Gate:
    """x · s of a (C, H, W) field x and a (C, 1, 1) gate s (either order); both fields of one C."""

    def forward(self, xs: list[Field]) -> Field:
        if len(xs) != 2 or xs[0].shape[0] != xs[1].shape[0]:
            raise ValueError(f"xs must be two fields of one channel count, got {[f.shape for f in xs]}")
        flat = [f.shape[1:] == (1, 1) for f in xs]
        if not any(flat):
            raise ValueError("one of xs must be a (C, 1, 1) gate")
        self.g_at = flat.index(True) if not all(flat) else 1
        x, s = xs[1 - self.g_at], xs[self.g_at]
        self.x, self.s = x, s
        s1, s2 = s.mean, s.var + s.mean**2  # (C, 1, 1) E[s], E[s²]
        M = xcorr(x.mean, x.mean)
        var = s2 * (x.var + x.mean**2) - (s1 * x.mean) ** 2
        out = _field_from_sums(s1 * x.mean, var, s2 * (x.lag_sums() + M) - s1**2 * M)
        out.chan, out.chan_dc = gate_channels(x, s)
        return out

    def backward(self, g: Field) -> list[Field]:
        """The gradients of the two inputs, in the forward's order."""
        x, s = self.x, self.s
        s2 = s.var + s.mean**2
        gx = _field_from_sums(torch.zeros_like(g.var), s2 * g.var, s2 * g.lag_sums())
        sg, sx = g.var.clamp_min(0).sqrt(), x.var.clamp_min(0).sqrt()
        E = g.corr * (x.corr * xcorr(sg * sx, sg * sx) + xcorr(sg * x.mean, sg * x.mean))
        s1 = s.mean
        v = (E.sum((1, 2)) + gate_coupling_term(g, x, s1, s2))[:, None, None].clamp_min(0)
        gx.centred = centred.through_factor(g, s.mean)
        gs = Field(torch.zeros_like(v), v, torch.ones_like(v, dtype=_DT))
        return [gs, gx] if self.g_at == 0 else [gx, gs]
