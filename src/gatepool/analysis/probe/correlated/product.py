"""A product of two fields of one shape, taken independent: y = a · b (StarNet's star ``act(f1(x)) ·
f2(x)``, MambaOut's gated ``act(g) · cat(i, c)``: two maps from one input through two layers of their own
weights, whose channels are uncorrelated as every two channels of the state are).

forward   E[y_p] = m_a m_b;  E[y_p y_q] = E[a_p a_q] E[b_p b_q],  E[a_p a_q] = ρ_a(q − p) s_a s_a' + m_a m_a':
          Var y_p = (v_a + m_a²)(v_b + m_b²) − m_a² m_b², and at every lag e (sums over the valid p)
          T_y(e) = ρ_a ρ_b Σ (s_a s_b)(s_a s_b)' + ρ_a Σ (s_a m_b)(s_a m_b)' + ρ_b Σ (m_a s_b)(m_a s_b)'
          (the Σ (m_a m_b)(m_a m_b)' of E[y y'] is the means' product, taken off)
backward  ∂L/∂a = g b, g independent of b (the gradient's mean 0):
          T(e) = ρ_g ρ_b Σ (s_g s_b)(s_g s_b)' + ρ_g Σ (s_g m_b)(s_g m_b)',  and ∂L/∂b = g a alike

The law of y is not normal (a product); its skewness and kurtosis are not carried (None).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import Field, _field_from_sums, xcorr


def _sd(f: Field) -> torch.Tensor:
    return f.var.clamp_min(0).sqrt()


def _times(g: Field, b: Field) -> Field:
    """The field of g · b, g of mean 0 (a gradient), the two independent."""
    sg, sb = _sd(g), _sd(b)
    T = g.corr * (b.corr * xcorr(sg * sb, sg * sb) + xcorr(sg * b.mean, sg * b.mean))
    return _field_from_sums(torch.zeros_like(g.var), g.var * (b.var + b.mean**2), T)


class Product:
    """a · b of two independent (C, H, W) fields of one shape; :meth:`backward` gives each its gradient."""

    def forward(self, xs: list[Field]) -> Field:
        if len(xs) != 2 or xs[0].shape != xs[1].shape:
            raise ValueError(f"xs must be two fields of one shape, got {[f.shape for f in xs]}")
        a, b = self.xs = xs
        sa, sb = _sd(a), _sd(b)
        mean = a.mean * b.mean
        var = (a.var + a.mean**2) * (b.var + b.mean**2) - mean**2
        T = (a.corr * b.corr * xcorr(sa * sb, sa * sb) + a.corr * xcorr(sa * b.mean, sa * b.mean)
             + b.corr * xcorr(a.mean * sb, a.mean * sb))  # fmt: skip
        return _field_from_sums(mean, var, T)

    def backward(self, g: Field) -> list[Field]:
        """The gradients of the two inputs, in the forward's order."""
        a, b = self.xs
        return [_times(g, b), _times(g, a)]
