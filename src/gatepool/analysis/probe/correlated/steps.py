"""Steps one after another, and the identity: the two steps that compose the others.

Steps     a conv's uneven padding, then the conv; a norm, its dropout and its activation: forward in
          order, backward in reverse (a ReLU's backward by parts, the list of its output's gradients:
          the users' gradients of the whole when the ReLU is its last step, ``Steps.relu``)
Identity  a module that leaves the field as it is (``nn.Identity``; ``nn.Flatten`` of a (C, 1, 1) map)
"""

from __future__ import annotations

import functools

import torch.nn as nn

from gatepool.analysis.probe.correlated.add import add_grads
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

    @property
    def relu(self) -> ReLU | None:
        """The last step when it is a ReLU (timm's norm-and-activation): the output is that ReLU's."""
        return self.steps[-1] if isinstance(self.steps[-1], ReLU) else None

    def backward(self, g: Field | list[Field]) -> Field:
        """The gradient at the input from the output's, or from the list of its users' gradients: the
        last step takes them by parts if it is a ReLU (each through the gate on its own), else their sum."""
        gs = g if isinstance(g, list) else [g]
        g = gs if self.relu is not None else functools.reduce(add_grads, gs)
        for step in reversed(self.steps):
            g = step.backward(g)  # a ReLU takes one gradient or the list of its parts
        return g


class Identity:
    def forward(self, x):
        return x

    def backward(self, g):
        return g


register_correlated_rule(nn.Flatten, lambda m: Identity())
register_correlated_rule(nn.Identity, lambda m: Identity())
