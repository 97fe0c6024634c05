"""Spatial-reduction attention (PVT v2's, Twins' global sub-sampled attention): the queries from the
H·W tokens, the keys and values from their map reduced by a strided conv, then a LayerNorm:

    y = LayerNorm(flatten(conv_{r×r, stride r}(map_{H×W}(x))))       (H, W: the map's size, given
                                                                      with x: PVT's feat_size)
    o = proj(softmax(q(x) k(y)ᵀ/√d) v(y))

the attention rule (:class:`attention.Attention`) with its keys from ``y``: a fixed step of x (the
tokens' map exact, :class:`UnflattenPositions`; the conv's, the flatten's and the LayerNorm's rules) and
its gradient back through it. Without a reduction (sr_ratio 1) the keys are x's own tokens.
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.attention import Attention, check_plain
from gatepool.analysis.probe.correlated.conv import conv_rule
from gatepool.analysis.probe.correlated.layernorm import layernorm_rule
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.steps import Steps
from gatepool.analysis.probe.correlated.tokens import OnMap


class SpatialReductionAttention(Attention):
    """:class:`Attention` whose keys and values are ``norm`` of the tokens of ``reduce`` (a step of x's
    map, :class:`OnMap`); the walk gives it the map's size (:meth:`bind`). Without ``reduce`` the keys
    are x's own tokens."""

    def __init__(self, in_weight, in_bias, out_weight, out_bias, num_heads: int, reduce=None, norm=None):
        self.reduce = None if reduce is None else OnMap(reduce)
        kv = None if reduce is None else Steps(self.reduce, norm)
        super().__init__(in_weight, in_bias, out_weight, out_bias, num_heads, kv)

    def bind(self, size) -> None:
        if self.reduce is not None:
            self.reduce.bind(size)


@register_named_rule("timm.models.pvt_v2.Attention", "timm.models.twins.GlobalSubSampleAttn")
def spatial_reduction_rule(m) -> Attention:
    """timm's PVT v2 ``Attention`` and Twins' ``GlobalSubSampleAttn``: the q and kv Linears as the fused
    in-projection, proj out; with ``sr_ratio`` > 1 the keys and values from the tokens' map reduced
    (``sr``, ``norm``). PVT v2's linear attention (an adaptive pool to 7 × 7 and a GELU before the keys)
    has no rule."""
    if getattr(m, "pool", None) is not None or getattr(m, "act", None) is not None:
        raise NotImplementedError("PVT v2's linear attention (an adaptive pool and a GELU before the keys)")
    check_plain(m, m.q.in_features)
    in_weight = torch.cat((m.q.weight, m.kv.weight))
    in_bias = None if m.q.bias is None else torch.cat((m.q.bias, m.kv.bias))
    reduce, norm = (None, None) if m.sr is None else (conv_rule(m.sr), layernorm_rule(m.norm))
    heads = m.num_heads
    return SpatialReductionAttention(in_weight, in_bias, m.proj.weight, m.proj.bias, heads, reduce, norm)
