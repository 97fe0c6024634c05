"""Stochastic depth (torchvision's ``StochasticDepth``, timm's ``DropPath``): y = x · b · s per sample,
b ~ Bernoulli(q) for the whole sample ("row"; "batch": one b for the batch, the same in expectation),
q = 1 − p, s = 1/q (or 1: timm's ``scale_by_keep=False``).

forward   E[y_p] = q s m_p;  E[y_p y_q] = q s² E[x_p x_q] at every pair, the lags too (one b a sample):
          Var y_p = q s² (v_p + m_p²) − (q s m_p)²,  T_y(e) = q s² (T(e) + M(e)) − (q s)² M(e),
          M(e) = Σ_p m_p m_{p+e}; the channels' correlation (``Field.chan``) as a gate's, the same b in
          every channel (:func:`channels.drop_channels`)
backward  ∂L/∂x = g · b · s with the forward's b: E[(∂L/∂x)_p (∂L/∂x)_q] = q s² Cov(g_p, g_q);
          (∂L/∂x) x = g y, so a norm before it gets the same Σ E[g g y y] (``Field.yy``)
eval      the identity (p = 0 too)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.channels import drop_channels
from gatepool.analysis.probe.correlated.coupling import scaled_coupling
from gatepool.analysis.probe.correlated.field import Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.registry import register_named_rule


class StochasticDepth:
    """A sample's whole input dropped with probability ``p`` (``training=False``: the identity)."""

    def __init__(self, p: float, training: bool = True, scale_by_keep: bool = True) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p must be in [0, 1), got {p}")
        self.q, self.active = 1.0 - p, training and p > 0
        self.s = 1.0 / self.q if scale_by_keep else 1.0

    def forward(self, x: Field) -> Field:
        if not self.active:
            return x
        q, s = self.q, self.s
        M = xcorr(x.mean, x.mean)
        var = q * s * s * (x.var + x.mean**2) - (q * s * x.mean) ** 2
        out = _field_from_sums(q * s * x.mean, var, q * s * s * (x.lag_sums() + M) - (q * s) ** 2 * M)
        out.chan, out.chan_dc = drop_channels(x, q, s)
        return out

    def backward(self, g: Field) -> Field:
        if not self.active:
            return g
        q, s = self.q, self.s
        k = q * s * s
        out = _field_from_sums(torch.zeros_like(g.var), k * g.var, k * g.lag_sums(), g.yy)  # g_x x = g y
        out.coupling = scaled_coupling(g.coupling, q * s**4, q * s**3)
        return out


@register_named_rule("torchvision.ops.stochastic_depth.StochasticDepth", "timm.layers.drop.DropPath")
def drop_path_rule(m: nn.Module) -> StochasticDepth:
    """torchvision's ``StochasticDepth(p, mode)`` or timm's ``DropPath(drop_prob, scale_by_keep)``."""
    p = float(getattr(m, "p", getattr(m, "drop_prob", 0.0)) or 0.0)
    return StochasticDepth(p, m.training, getattr(m, "scale_by_keep", True))
