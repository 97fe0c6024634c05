"""timm's ``SplitAttn`` (ResNeSt's split attention, radix 2), whole: a grouped conv to 2C channels, its norm
and ReLU, X = (X₀, X₁) its two halves; a gate per sample and channel from their sum's mean over the map,
a = σ(L₀ − L₁) (the radix softmax of two logits L = fc2(h), h = ReLU(bn1(fc1(mean_p(X₀ + X₁))))); and

    out = a X₀ + (1 − a) X₁

L₀ − L₁ is one conv of h (fc2's two rows of a channel subtracted: two functions of one h, which the state's
uncorrelated channels would take as independent).

X₀ and X₁ are two channels of the state (uncorrelated), the gate taken independent of them (it sees them
only through their mean over every position and, through fc1 and fc2, over every channel: as
squeeze-and-excitation's :mod:`gate`). With α = E[a], β = E[a²] per channel and m₀, m₁ the halves' mean maps:

forward   E[out] = α m₀ + (1 − α) m₁
          T_out(e) = β T₀(e) + (1 − 2α + β) T₁(e) + Var(a) Σ_p d_p d_{p+e},  d = m₀ − m₁
          (the cross terms E[a(1 − a)] m₀ m₁ and the product of the means leave Var(a) d d)
backward  ∂L/∂X₀ = a g + ∂L/∂gap, ∂L/∂X₁ = (1 − a) g + ∂L/∂gap: E[a²] Cov(g), E[(1 − a)²] Cov(g);
          ∂L/∂a = Σ_p g_p (X₀ − X₁)_p (:class:`gate.Gate`'s of the difference), back through σ, the
          logit's conv, the ReLU, bn1, fc1 and the mean to gap = X₀ + X₁; the three parts at X
          independent, then the front's ReLU, norm and conv.

Radix 1 (``x · σ(L)``) is the gate alone; a radix above 2 (a softmax over more logits) has no rule.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.add import add, add_grads
from gatepool.analysis.probe.correlated.cat import Cat
from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.field import Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.gate import Gate
from gatepool.analysis.probe.correlated.pointwise import Pointwise
from gatepool.analysis.probe.correlated.registry import register_named_rule, rule_for
from gatepool.analysis.probe.correlated.scale import Scale
from gatepool.analysis.probe.correlated.split import ChannelSlice
from gatepool.analysis.probe.correlated.steps import Steps


def _step(m: nn.Module):
    make = rule_for(m)
    if make is None:
        raise NotImplementedError(f"SplitAttn: no correlated rule for {type(m).__name__}")
    return make(m)


def _parts(step) -> list:
    """The steps inside ``step``, flattened (the walk gives each BatchNorm the batch size)."""
    if isinstance(step, Steps):
        return [p for s in step.steps for p in _parts(s)]
    return [step]


class _GlobalMean:
    """The mean over the positions, (C, H, W) → (C, 1, 1): Var = Σ_e T(e) / (H·W)²; back, the gradient
    g / (H·W) at every position, correlated 1 at every lag (the box filter's rule takes every pair of its
    H·W taps: 16 × 16 maps of 128 channels need 4 GB)."""

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        self.hw = (H, W)
        var = x.lag_sums().sum((1, 2)) / (H * W) ** 2
        one = torch.ones((C, 1, 1), dtype=x.mean.dtype)
        return Field(x.mean.mean((1, 2), keepdim=True), var[:, None, None], one)

    def backward(self, g: Field) -> Field:
        C, (H, W) = g.shape[0], self.hw
        var = (g.var / (H * W) ** 2).expand(C, H, W).clone()
        return Field(torch.zeros_like(var), var, torch.ones((C, 2 * H - 1, 2 * W - 1), dtype=var.dtype))


class SplitAttn:
    """timm's ``SplitAttn`` of radix 2 (or 1) as one step."""

    def __init__(self, m: nn.Module) -> None:
        if m.radix not in (1, 2):
            raise NotImplementedError(f"SplitAttn of radix {m.radix}: a softmax over more than two logits")
        self.radix = m.radix
        self.front = Steps(*(_step(p) for p in (m.conv, m.bn0, m.drop, m.act0)))
        self.attn = Steps(_GlobalMean(), *(_step(p) for p in (m.fc1, m.bn1, m.act1)), self._logit(m))
        self.steps = tuple(_parts(self.front) + _parts(self.attn))

    def _logit(self, m: nn.Module) -> Conv:
        """The gate's logit as one conv of fc1's activation h: fc2 (radix 1), or L₀ − L₁ = (w₀ − w₁) h +
        b₀ − b₁ (radix 2), the two rows of each channel's logits: two functions of one h, which the
        state's uncorrelated channels would take as independent. RadixSoftmax's order: fc2's channels
        (cardinality, radix, rest), its softmax over the radix."""
        w, b = m.fc2.weight.detach(), m.fc2.bias
        b = torch.zeros(w.shape[0], dtype=w.dtype) if b is None else b.detach()
        if self.radix == 1:
            return Conv(w, b, (1, 1), (0, 0), m.fc2.groups)
        card = m.rsoftmax.cardinality
        rows = torch.arange(w.shape[0]).reshape(card, 2, -1)  # (cardinality, radix, rest)
        i0, i1 = rows[:, 0].reshape(-1), rows[:, 1].reshape(-1)
        return Conv(w[i0] - w[i1], b[i0] - b[i1], (1, 1), (0, 0), m.fc2.groups)

    def forward(self, x: Field) -> Field:
        X = self.front.forward(x)  # (R·C, H, W)
        C = X.shape[0] // self.radix
        xs = [ChannelSlice(r * C, (r + 1) * C).forward(X) for r in range(self.radix)]
        gap = xs[0] if self.radix == 1 else add(xs[0], xs[1])
        self.sigmoid = Pointwise("sigmoid")
        self.a = a = self.sigmoid.forward(self.attn.forward(gap))  # (C, 1, 1)
        self.gate = Gate()
        if self.radix == 1:
            return self.gate.forward([xs[0], a])
        alpha, beta = a.mean, a.var + a.mean**2
        x0, x1 = xs
        dm = x0.mean - x1.mean
        mean = alpha * x0.mean + (1 - alpha) * x1.mean
        var = beta * x0.var + (1 - 2 * alpha + beta) * x1.var + a.var * dm**2
        T = beta * x0.lag_sums() + (1 - 2 * alpha + beta) * x1.lag_sums() + a.var * xcorr(dm, dm)
        self.gate.forward([add(x0, Scale(-1.0).forward(x1)), a])  # ∂L/∂a: of the difference X₀ − X₁
        return _field_from_sums(mean, var, T)

    def backward(self, g: Field) -> Field:
        a = self.a
        through, g_a = self.gate.backward(g)
        g_gap = self.attn.backward(self.sigmoid.backward(g_a))  # (C, H, W)
        if self.radix == 1:
            return self.front.backward(add_grads(through, g_gap))
        e2 = [a.var + a.mean**2, (1 - a.mean) ** 2 + a.var]  # E[a²], E[(1 − a)²]
        parts = [_field_from_sums(torch.zeros_like(g.var), s * g.var, s * g.lag_sums()) for s in e2]
        return self.front.backward(Cat().forward([add_grads(p, g_gap) for p in parts]))


register_named_rule("timm.layers.split_attn.SplitAttn")(SplitAttn)
