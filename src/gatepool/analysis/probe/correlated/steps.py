"""Steps one after another, and the identity: the two steps that compose the others.

Steps     a conv's uneven padding, then the conv; a norm, its dropout and its activation: forward in
          order, backward in reverse (a ReLU's backward by parts, the list of its output's gradients)
Identity  a module that leaves the field as it is (``nn.Identity``; ``nn.Flatten`` of a (C, 1, 1) map)
"""

from __future__ import annotations

import torch.nn as nn

from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.registry import register_correlated_rule
from gatepool.analysis.probe.correlated.relu import ReLU


class Steps:
    """Steps one after another (a conv's uneven padding, then the conv; a norm, its dropout and its
    activation), forward and backward."""

    def __init__(self, *steps) -> None:
        self.steps = steps

    def forward(self, x: Field) -> Field:
        for step in self.steps:
            x = step.forward(x)
        return x

    def backward(self, g: Field) -> Field:
        for step in reversed(self.steps):
            g = step.backward([g]) if isinstance(step, ReLU) else step.backward(g)  # ReLU: by parts
        return g


class Identity:
    def forward(self, x):
        return x

    def backward(self, g):
        return g


register_correlated_rule(nn.Flatten, lambda m: Identity())
register_correlated_rule(nn.Identity, lambda m: Identity())
