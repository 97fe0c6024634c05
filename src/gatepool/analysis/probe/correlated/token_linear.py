"""A Linear over the tokens: y = W x + b along the sequence of each channel (MLP-Mixer's token MLP and
ResMLP's token Linear: ``linear(x.transpose(1, 2))`` of (N, T, C) tokens), a fixed map of the positions.

forward   per channel m_out = W m + b, Cov_out = W Cov_in Wᵀ (Cov_in(p, q) = √(v_p v_q) ρ(q − p)); the
          variance map its diagonal, the lag sums T(Δ) = Σ_P Cov_out(P, P + Δ) (:class:`PositionMap`)
backward  g_in = Wᵀ g: Cov = Wᵀ Cov_g W, the same sums
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.resample import PositionMap


class TokenLinear(PositionMap):
    """``F.linear(x, weight, bias)`` of a (C, 1, T) field along its T tokens: weight (T_out, T)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if weight.ndim != 2 or (bias is not None and tuple(bias.shape) != (weight.shape[0],)):
            raise ValueError(f"weight must be (T_out, T) and bias (T_out,) or None, got "
                             f"{tuple(weight.shape)} and {None if bias is None else tuple(bias.shape)}")
        super().__init__(weight.detach().to("cpu", _DT), (1, weight.shape[0]))
        self.b = None if bias is None else bias.detach().to("cpu", _DT)

    def forward(self, x: Field) -> Field:
        if x.shape[1] != 1:
            raise NotImplementedError(f"a Linear over the positions of a {x.shape[1:]} map (tokens only)")
        out = super().forward(x)
        if self.b is not None:
            out.mean = out.mean + self.b
        return out
