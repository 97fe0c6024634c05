"""A Linear over a flattened map: AlexNet's and VGG's classifier after ``torch.flatten(x, 1)`` of their
(C, 6, 6) and (C, 7, 7) maps. With W[o, c, p] the weight of channel c at position p (torch's row-major
flatten, p = h W + w):

forward   m_o = Σ_{c,p} W[o,c,p] m_cp + b_o
          Var y_o = Σ_c Σ_{p,q} W[o,c,p] W[o,c,q] √(v_cp v_cq) ρ_c(q − p)   (channels uncorrelated: the
          state's assumption; positions through each channel's whole covariance)
          the outputs (O, 1, 1) independent, as :class:`Linear`'s
backward  g_cp = Σ_o W[o,c,p] g_o, the g_o independent: Cov(g_cp, g_cq) = Σ_o W[o,c,p] W[o,c,q] E[g_o²],
          the map's variance and lag sums from that covariance

The input's own channels (``Field.components``: x − m = mix (z − m_z)) fold into the weight, as the conv
folds them. The weight is read in blocks of output rows (VGG's is 4096 × 25088): at most
``_BLOCK`` rows in float64 at a time.
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.positions import covariance, from_covariance

_BLOCK = 256  # output rows of the weight in float64 at a time


class FlatLinear:
    """``nn.Linear(C·H·W, O)`` on ``x.flatten(1)`` of a (C, H, W) field: a (O, 1, 1) field."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        if weight.ndim != 2:
            raise ValueError(f"weight must be (out_features, in_features), got {tuple(weight.shape)}")
        self.W = weight.detach()
        self.b = None if bias is None else bias.detach().to("cpu", _DT)

    def _blocks(self, shape):
        """(rows, W[rows] as (o, C, H·W) in float64) over the weight's output rows."""
        C, H, W = shape
        if self.W.shape[1] != C * H * W:
            raise ValueError(f"the weight's {self.W.shape[1]} inputs are not the map's {C}·{H}·{W}")
        for o in range(0, self.W.shape[0], _BLOCK):
            yield slice(o, o + _BLOCK), self.W[o : o + _BLOCK].to("cpu", _DT).reshape(-1, C, H * W)

    def forward(self, x: Field) -> Field:
        self.shape = x.shape
        O = self.W.shape[0]
        mean, var = torch.zeros(O, dtype=_DT), torch.zeros(O, dtype=_DT)
        mix, z = x.components if x.components is not None else (None, x)
        K = covariance(z)  # (C or r, P, P)
        for rows, w in self._blocks(x.shape):  # w (o, C, P)
            mean[rows] = w.flatten(1) @ x.mean.flatten()
            if mix is not None:  # W[o, c, p] mix[c, r]: the weight on z's uncorrelated channels
                w = torch.einsum("ocp,cr->orp", w, mix)
            wt = w.transpose(0, 1)  # (C, o, P)
            var[rows] = ((wt @ K) * wt).sum((0, 2))
        if self.b is not None:
            mean += self.b
        ones = torch.ones((O, 1, 1), dtype=_DT)
        return Field(mean[:, None, None], var.clamp_min(0)[:, None, None], ones)

    def backward(self, g: Field) -> Field:
        C, H, W = self.shape
        K = torch.zeros((C, H * W, H * W), dtype=_DT)
        vg = g.var.reshape(-1)
        for rows, w in self._blocks(self.shape):
            wt = w.transpose(0, 1)  # (C, o, P)
            K += (wt * vg[rows][None, :, None]).transpose(1, 2) @ wt
        return from_covariance(torch.zeros((C, H, W), dtype=_DT), K)
