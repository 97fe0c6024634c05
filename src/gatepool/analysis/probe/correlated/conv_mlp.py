"""timm's VGG head ``ConvMlp``: a map smaller than the kernel adaptively pooled up to k × k (its own ``if``
on the input's size, which torch.fx cannot trace: the module is one node), fc1 (a k × k conv), act1,
drop, fc2 (1 × 1), act2: each part's own rule, one after another (:class:`Steps`), forward and backward.

fc1's kernel covers the (pooled, unpadded) map whole: its one output position is Σ_{c,p} W[o,c,p] x_cp + b,
a Linear over the flattened map (:class:`FlatLinear`, the same sums: each channel's whole position
covariance), at O·C·P² a position pair where the conv rule's pairs of taps build O·C·k² maps of
products (VGG-11's 4096 × 512 × 49: 0.8 GB for each of its 49 taps).
"""

from __future__ import annotations

import torch.nn as nn

from gatepool.analysis.probe.correlated.adaptive import AdaptiveAvgPool2dStep
from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.flat_linear import FlatLinear
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


class WholeMap:
    """A conv whose kernel covers its unpadded input map (one output position) as the Linear over the
    flattened map that it is; on any other map its own rule (``make(m)``, built only then: VGG-11's fc1
    in float64 is 0.8 GB)."""

    def __init__(self, m: nn.Conv2d, make) -> None:
        self.m, self.make = m, make

    def forward(self, x: Field) -> Field:
        m = self.m
        whole = m.padding in ("valid", 0, (0, 0)) and tuple(m.kernel_size) == tuple(x.shape[1:])
        plain = m.groups == 1 and tuple(m.dilation) == (1, 1) and m.padding_mode == "zeros"
        self.step = FlatLinear(m.weight.flatten(1), m.bias) if whole and plain else self.make(m)
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
        steps.append(WholeMap(part, make) if name == "fc1" and isinstance(part, nn.Conv2d) else make(part))
    return Steps(AtLeast(m.input_kernel_size), *steps)
