"""Linear on features (F, 1, 1).

linear    on (C, 1, 1) features: m_out = W m + b, v_out = W² v, or diag(W Σ Wᵀ) where the features carry their
          correlation (``Field.chan``, :mod:`channels`); back v_g,in = (W²)ᵀ v_g
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.channels import conv_channels
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.registry import register_correlated_rule, register_named_rule


class Linear:
    """y = W x + b on features (F, 1, 1): their correlation where the field carries it, else independent."""

    def __init__(self, weight, bias) -> None:
        self.W = weight.detach().to("cpu", _DT)
        self.b = None if bias is None else bias.detach().to("cpu", _DT)

    def forward(self, x: Field) -> Field:
        if x.shape[1:] != (1, 1):
            raise NotImplementedError("Linear of a map with positions: flatten after a global pool only")
        m = self.W @ x.mean[:, 0, 0] + (0 if self.b is None else self.b)
        v = (self.W**2) @ x.var[:, 0, 0]
        chan = conv_channels(self.W[:, :, None, None], x)
        if chan is not None:
            v = v * chan[0]
        out = Field(m[:, None, None], v[:, None, None], torch.ones((len(m), 1, 1), dtype=_DT))
        out.chan = out.chan_dc = None if chan is None else chan[1]  # one position: the two the same
        return out

    def backward(self, g: Field) -> Field:
        v = (self.W**2).T @ g.var[:, 0, 0]
        return Field(
            torch.zeros_like(v)[:, None, None], v[:, None, None], torch.ones((len(v), 1, 1), dtype=_DT)
        )


register_correlated_rule(nn.Linear, lambda m: Linear(m.weight, m.bias))
register_named_rule("timm.layers.linear.Linear")(lambda m: Linear(m.weight, m.bias))
