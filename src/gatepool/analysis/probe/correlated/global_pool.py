"""The global average pool, y_c = (1/n) Σ_p x_cp over the n = H·W positions of a (C, H, W) map: the box
filter of the whole map (:func:`conv.box_conv`, one tap a position) in closed form.

forward   m_y = mean of m over the map; Var y = (1/n²) Σ_{p,q} √(v_p v_q) ρ(q − p) = (1/n²) Σ_e T(e), T the
          input's lag sums; a 1 × 1 output (ρ = 1). Its law's cumulants κ_k = (1/n)^k Σ_p γ_k v_p^{k/2}
          (the taps independent, as the conv's shape), and no joint cumulants (no second position).
backward  ∂L/∂x_p = g/n at every p: Var = E[g²]/n² everywhere, every pair of positions fully correlated,
          T(e) = (E[g²]/n²)(H − |e_h|)(W − |e_w|).

The box conv does the same over its n² pairs of taps, its weight dense over channel pairs: (C, C, H, W),
1.6 GB at MaxViT-T's first squeeze-and-excitation (256 channels on 56 × 56), and a loop over the n²
pairs for the joint cumulants. It stays the rule where this form has no term: the input given by
components (the image's), a gradient that depends on the value (``dependence``), a 1 × 1 map.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gatepool.analysis.probe.correlated.conv import box_conv
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums


class GlobalAvgPool:
    """``AdaptiveAvgPool2d(1)`` (and any average of the whole map): the closed form above."""

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        self.x, self.conv = x, None
        if x.components is not None or H * W == 1:
            self.conv = box_conv(C, (H, W), (H, W), (0, 0))
            return self.conv.forward(x)
        n = H * W
        mean = x.mean.mean((1, 2), keepdim=True)
        var = (x.lag_sums().sum((1, 2)) / (n * n)).clamp_min(0)[:, None, None]  # (C, 1, 1)
        self.out_var = var
        out = _field_from_sums(mean, var, var.clone())
        if x.skew is None and x.kurt is None:
            return out
        v = x.var.clamp_min(0)
        ok = var > 1e-300
        den = torch.where(ok, var, torch.ones_like(var))
        shape: dict = {}
        for key, gamma, k in (("skew", x.skew, 3), ("kurt", x.kurt, 4)):
            if gamma is not None:
                kappa = (gamma * v ** (k / 2)).sum((1, 2), keepdim=True) / n**k
                shape[key] = torch.where(ok, kappa / den ** (k / 2), 0.0)
        shape["joint"] = {}  # one output position: no pair of outputs shares an input
        return replace(out, **shape)

    def backward(self, g: Field) -> Field:
        x = self.x
        C, H, W = x.shape
        if self.conv is None and g.dependence is not None:
            self.conv = box_conv(C, (H, W), (H, W), (0, 0))
            self.conv.x, self.conv.out_var = x, self.out_var
        if self.conv is not None:
            return self.conv.backward(g)
        n = H * W
        var = (g.var.clamp_min(0) / (n * n)).expand(C, H, W).clone()  # (C, H, W)
        rows = (H - torch.arange(-(H - 1), H).abs()).to(_DT)
        cols = (W - torch.arange(-(W - 1), W).abs()).to(_DT)
        T = var[:, :1, :1] * (rows[:, None] * cols[None, :])  # (C, 2H − 1, 2W − 1)
        return _field_from_sums(torch.zeros_like(var), var, T)
