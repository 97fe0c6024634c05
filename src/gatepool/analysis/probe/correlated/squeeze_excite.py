"""Squeeze-and-excitation as one step, for a block whose rule is the whole block (a re-parameterisable
block's ``se``): y = x · s, s = gate(fc2(act(fc1(mean_p x)))), the walk's own steps in a row.

forward   the global pool (:func:`conv.box_conv` over the whole map), fc1, act, fc2 (1×1 convs), the
          gate's pointwise rule, then :class:`gate.Gate` of x and s (s taken independent of x)
backward  the gate's two gradients: x's direct one and s's back through the same steps to the pool's
          input, the two added as independent (as the walk adds a tensor's two gradients)
"""

from __future__ import annotations

import torch.nn as nn

from gatepool.analysis.probe.correlated.add import add_grads
from gatepool.analysis.probe.correlated.conv import box_conv
from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.gate import Gate
from gatepool.analysis.probe.correlated.registry import rule_for
from gatepool.analysis.probe.correlated.steps import Steps


def _step(m: nn.Module):
    make = rule_for(m)
    if make is None:
        raise NotImplementedError(f"squeeze-and-excitation: no correlated rule for {type(m).__name__}")
    return make(m)


class SqueezeExcite:
    """timm's ``SEModule`` (``fc1``, ``bn``, ``act``, ``fc2``, ``gate``; no max pool) as one step."""

    def __init__(self, m: nn.Module) -> None:
        if getattr(m, "add_maxpool", False):
            raise NotImplementedError("squeeze-and-excitation with a max pool")
        self.parts = [_step(getattr(m, a)) for a in ("fc1", "bn", "act", "fc2", "gate")]

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        self.path = Steps(box_conv(C, (H, W), (H, W), (0, 0)), *self.parts)
        self.gate = Gate()
        return self.gate.forward([x, self.path.forward(x)])

    def backward(self, g: Field) -> Field:
        gx, gs = self.gate.backward(g)
        return add_grads(gx, self.path.backward(gs))
