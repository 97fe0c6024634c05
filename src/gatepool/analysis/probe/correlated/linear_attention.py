"""ReLU linear attention (EfficientViT-B0's ``LiteMLA``, timm's ``efficientvit_mit``) on a (C, H, W) map.

qkv = W x (a 1×1 conv), its multi-scale copies a_s(qkv) (a depthwise s×s conv, then a 1×1 conv grouped
by each head's q, k or v channels), all stacked (a cat); group g of 3d channels holds a head's q, k, v.
Over the T = H·W positions, per group,

    o_i = Σ_j (q_i·k_j) v_j / (Σ_j q_i·k_j + ε),     q = ReLU(Q), k = ReLU(K)

then the projection (a 1×1 conv and its BatchNorm).

ratio     o_i = Σ_j w_ij v_j with w_ij = q_i·k_j/(q_i·K + ε), K = Σ_j k_j: a ratio of two random sums that
          share q_i, over few positions (T = 16 and 4 at a 64 × 64 input) and d = 16 rectified channels,
          so q_i·K moves by tens of percent from query to query and from sample to sample: neither the
          mean weight 1/T nor a first-order expansion of the ratio holds. Its moments are taken as they
          are, over draws of (Q, K, V) from the state (:mod:`drawn_attention`), forward and backward
          (the ReLUs' gates in the gradient)
LiteMLA   qkv, the multi-scale convs, the cat, the attention and the projection as steps; qkv's two
          gradients (the cat's own slice and the one back through the multi-scale convs) added as
          independent, as the walk adds a tensor's two users'
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.add import add_grads
from gatepool.analysis.probe.correlated.cat import Cat
from gatepool.analysis.probe.correlated.drawn_attention import DRAWS, DrawnAttention
from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.registry import register_named_rule, rule_for
from gatepool.analysis.probe.correlated.steps import Steps


def relu_linear_attention(q, k, v, eps: float) -> torch.Tensor:
    """timm's ``LiteMLA._attn`` on (…, T, d) queries, keys (already rectified) and values: v padded with a
    column of ones, (q (kᵀ v))[…, :−1] / ((q (kᵀ v))[…, −1:] + ε)."""
    v = torch.nn.functional.pad(v, (0, 1), mode="constant", value=1.0)
    out = q @ (k.transpose(-1, -2) @ v)
    return out[..., :-1] / (out[..., -1:] + eps)


class LinearAttention(DrawnAttention):
    """The ReLU linear attention of groups of 3d channels (each a head's Q, K, V before the ReLU) on a
    (groups·3d, H, W) map, to the (groups·d, H, W) map of the heads' outputs: its moments over draws."""

    def __init__(self, dim: int, eps: float, draws: int = DRAWS, seed: int = 0) -> None:
        self.eps = float(eps)
        super().__init__((dim, dim, dim), self._attend, draws, seed)

    def _attend(self, q, k, v):
        return relu_linear_attention(q.relu(), k.relu(), v, self.eps)


def module_steps(m: nn.Module) -> Steps:
    """A module as its rule's step, or a container's children's steps one after another."""
    make = rule_for(m)
    if make is not None:
        return make(m)
    children = list(m.children())
    if not children:
        raise NotImplementedError(f"LiteMLA: no correlated rule for {type(m).__name__}")
    return Steps(*(module_steps(c) for c in children))


class LiteMLA:
    """timm's ``LiteMLA``: qkv, its multi-scale convs, the cat, :class:`LinearAttention`, the projection."""

    def __init__(self, m: nn.Module) -> None:
        if not isinstance(m.kernel_func, nn.ReLU):
            raise NotImplementedError(f"LiteMLA with kernel {type(m.kernel_func).__name__} (ReLU only)")
        self.qkv, self.proj = module_steps(m.qkv), module_steps(m.proj)
        self.aggreg = [module_steps(a) for a in m.aggreg]
        self.attn = LinearAttention(m.dim, m.eps)
        self.cat = Cat()

    def forward(self, x: Field) -> Field:
        qkv = self.qkv.forward(x)
        y = self.cat.forward([qkv, *(a.forward(qkv) for a in self.aggreg)])
        return self.proj.forward(self.attn.forward(y))

    def backward(self, g: Field) -> Field:
        own, *scales = self.cat.backward(self.attn.backward(self.proj.backward(g)))
        for a, gs in zip(self.aggreg, scales):
            own = add_grads(own, a.backward(gs))
        return self.qkv.backward(own)


@register_named_rule("timm.models.efficientvit_mit.LiteMLA")
def lite_mla_rule(m: nn.Module) -> LiteMLA:
    return LiteMLA(m)
