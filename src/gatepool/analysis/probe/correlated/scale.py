"""A product with a constant: y = s · x, s a number or a map of fixed values (C, H, W) broadcast
(layer scale's γ (C, 1, 1), a multiply or a divide by a number).

forward   E[y_p] = s_p E[x_p], Var y_p = s_p² Var x_p, and at every lag
          T_y(e) = Σ_p s_p s_{p+e} Cov(x_p, x_{p+e}) = ρ(e) · Σ_p (s √v)_p (s √v)_{p+e}
          (ρ as it is where s is one number a channel; a sign that changes across the map flips the lags
          it spans)
backward  ∂L/∂x = s · g: the same rule on the gradient; for a norm before it (``Field.yy``) g_x x = g y,
          so the sum is the output's own
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated import centred
from gatepool.analysis.probe.correlated.channels import scaled_made, signed_channels
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr


class Scale:
    """y = s · x with s fixed: a number, or a tensor that broadcasts to the field's (C, H, W)."""

    def __init__(self, s: float | torch.Tensor) -> None:
        s = torch.as_tensor(s).detach().to("cpu", _DT)
        if not bool(torch.isfinite(s).all()):
            raise ValueError("s must be finite")
        self.s = s

    def _map(self, shape) -> torch.Tensor:
        try:
            ok = torch.broadcast_shapes(self.s.shape, shape) == torch.Size(shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"s must broadcast to the field's shape {tuple(shape)}, got {tuple(self.s.shape)}"
            )
        return self.s.expand(shape)

    def _scaled(self, f: Field, mean: torch.Tensor, yy=None) -> Field:
        s = self._map(f.shape)
        ss = s * f.var.clamp_min(0).sqrt()
        return _field_from_sums(mean, f.var * s * s, f.corr * xcorr(ss, ss), yy)

    def forward(self, x: Field) -> Field:
        out = self._scaled(x, x.mean * self._map(x.shape))
        s = self.s
        if s.numel() == 1 or (s.dim() == 3 and s.shape[1:] == (1, 1)):  # one s a channel
            out.chan, out.chan_dc = signed_channels(x, s.reshape(-1)).values()
            out.made = scaled_made(x, s.reshape(-1), out)
        return out

    def backward(self, g: Field) -> Field:
        out = self._scaled(g, torch.zeros_like(g.var), g.yy)
        out.centred = centred.through_factor(g, self._map(g.shape))
        return out
