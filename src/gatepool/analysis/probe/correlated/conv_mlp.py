"""timm's VGG head ``ConvMlp``: a map smaller than the kernel adaptively pooled up to k × k (its own ``if``
on the input's size, which torch.fx cannot trace: the module is one node), fc1 (a k × k conv), act1,
drop, fc2 (1 × 1), act2: each part's own rule, one after another (:class:`Steps`), forward and backward.
"""

from __future__ import annotations

import torch.nn as nn

from gatepool.analysis.probe.correlated.adaptive import AdaptiveAvgPool2dStep
from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.registry import register_named_rule, rule_for
from gatepool.analysis.probe.correlated.steps import Identity, Steps


class AtLeast:
    """A (C, H, W) map with H or W under ``k`` adaptively pooled up to (max(k, H), max(k, W)); a larger
    one as it is."""

    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: Field) -> Field:
        H, W = x.shape[1:]
        small = H < self.k or W < self.k
        self.step = AdaptiveAvgPool2dStep(nn.AdaptiveAvgPool2d((max(self.k, H), max(self.k, W)))) if small \
            else Identity()  # fmt: skip
        return self.step.forward(x)

    def backward(self, g: Field) -> Field:
        return self.step.backward(g)


@register_named_rule("timm.models.vgg.ConvMlp")
def conv_mlp_rule(m: nn.Module) -> Steps:
    steps = []
    for name in ("fc1", "act1", "drop", "fc2", "act2"):
        part = getattr(m, name)
        make = rule_for(part)
        if make is None:
            raise NotImplementedError(f"ConvMlp: no correlated rule for {type(part).__name__}")
        steps.append(make(part))
    return Steps(AtLeast(m.input_kernel_size), *steps)
