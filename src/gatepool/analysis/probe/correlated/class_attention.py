"""Class attention (CaiT's ``ClassAttn``, CrossViT's ``CrossAttention``): the class token alone queries
every token,

    o_0 = proj(softmax_j(q(x_0) · k(x_j)/√d) v(x_j))          (one token out)

the attention rule (:class:`attention.Attention`) with its queries the class token's
(:class:`tokens.SelectToken`): the weights over the T keys, its gradient back to token 0 through the
query and to every token through the keys and values. CrossViT's class token is the other branch's,
projected to this branch's width and put before its patch tokens (a cat): the same attention.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.attention import Attention, check_plain
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.tokens import SelectToken


def _class_attention(m, q: nn.Linear, k: nn.Linear, v: nn.Linear) -> Attention:
    """Its q, k and v Linears as the fused in-projection (q read at token 0), ``m.proj`` out."""
    dim, heads = q.in_features, m.num_heads
    check_plain(m, dim)
    in_weight = torch.cat((q.weight, k.weight, v.weight))
    biases = (q.bias, k.bias, v.bias)
    in_bias = (
        None
        if all(b is None for b in biases)
        else torch.cat([torch.zeros(dim, dtype=in_weight.dtype) if b is None else b for b in biases])
    )
    return Attention(in_weight, in_bias, m.proj.weight, m.proj.bias, heads, queries=SelectToken(0))


@register_named_rule("timm.models.cait.ClassAttn")
def class_attention_rule(m) -> Attention:
    """timm's ``ClassAttn`` (``q``, ``k``, ``v``)."""
    return _class_attention(m, m.q, m.k, m.v)


@register_named_rule("timm.models.crossvit.CrossAttention")
def cross_attention_rule(m) -> Attention:
    """timm's ``CrossAttention`` (``wq``, ``wk``, ``wv``)."""
    return _class_attention(m, m.wq, m.wk, m.wv)
