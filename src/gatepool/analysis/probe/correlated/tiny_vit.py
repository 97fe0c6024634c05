"""TinyViT's attention (timm's ``tiny_vit.Attention``, in its ``TinyVitBlock``) as a window attention on
the block's channels-last map.

module    per token x̂ = LayerNorm(x) over its C channels; one qkv Linear whose output is, head by head,
          the head's key_dim queries, key_dim keys and val_dim values (``view(B, N, heads, −1).split``:
          LeViT's and EfficientFormer's layout); per head the scores q·k/√key_dim plus a bias B_ij of the
          pair's offset (|Δrow|, |Δcol|) inside the window (``attention_biases[:, attention_bias_idxs]``,
          a (heads, w², w²) constant; zeros at init), softmax, o = A v, then proj
the block calls it on the windows' tokens of its (B, H, W, C) map (padded at the bottom and right to
          whole w × w windows, ``view(B, nH, w, nW, w, C).transpose(2, 3).reshape(B·nH·nW, w², C)``, the
          reverse and the crop after: Swin's partition), or on the map's H·W tokens where the map is one
          window (``reshape(B, H·W, C)``, ``view(B, H, W, C)`` after). The walk reads either chain as one
          window attention on the map (``correlated_predict._window_chain``); this rule is its step
forward   x̂ by :class:`layernorm.LayerNorm` on the map's field, then :class:`window_attention.WindowAttention`
          on x̂: q, k, v the qkv rows of each part (queries, keys, values) gathered head after head, the
          bias B; a padding token is zero before the norm, x̂ = β there, so its q, k, v are W β + b
backward  the window rule's gradient at x̂, then the LayerNorm's
row       the module returns the padded map's windows' tokens, the padding's among them (8 × 8 real of
          14 × 14 at a 64 × 64 input's second stage): its row is theirs (the window rule's ``as_module``),
          each padding query's output its cell's mean value plus its weights' noise, the gradient 0 there
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.layernorm import LayerNorm
from gatepool.analysis.probe.correlated.levit import _head_rows
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.window_attention import WindowAttention, _Cells


class NormedWindowAttention(WindowAttention):
    """:class:`WindowAttention` of a LayerNorm over each position's channels (``norm``)."""

    def __init__(self, norm: LayerNorm, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.norm = norm

    def _padded(self, conv, x: Field, c: _Cells):
        """As the window rule's, the padding's tokens the projection of the norm's β (zero before it)."""
        f, m, s, r = super()._padded(conv, x, c)
        beta = self.norm.beta
        if beta is not None:
            at_pad = conv.W[:, :, 0, 0] @ beta + (0.0 if conv.b is None else conv.b)
            m[:, c.H :, :] = at_pad[:, None, None]
            m[:, :, c.W :] = at_pad[:, None, None]
        return f, m, s, r

    def forward(self, x: Field) -> Field:
        return super().forward(self.norm.forward(x))

    def backward(self, g: Field) -> Field:
        return self.norm.backward(super().backward(g))


@register_named_rule("timm.models.tiny_vit.Attention")
def tiny_vit_attention_rule(m: nn.Module) -> NormedWindowAttention:
    """timm's TinyViT ``Attention``: its LayerNorm, its qkv read head by head, the bias of each pair's
    offset, proj; within windows of ``m.resolution`` (the block's window) of the map the walk hands it."""
    h, dk, dv = m.num_heads, m.key_dim, m.val_dim
    C = m.qkv.in_features
    if dk != dv or h * dk != C or m.proj.in_features != C or abs(m.scale - dk**-0.5) > 1e-12:
        raise NotImplementedError("TinyViT Attention whose heads are not the width (attn_ratio ≠ 1)")
    if not isinstance(m.norm, nn.LayerNorm) or len(m.norm.normalized_shape) != 1:
        raise NotImplementedError("TinyViT Attention without its LayerNorm over the channels")
    rows = torch.cat(_head_rows(h, [dk, dk, dv]))  # queries, keys, values, each head after head
    weight = m.qkv.weight.detach()[rows]
    bias = None if m.qkv.bias is None else m.qkv.bias.detach()[rows]
    with torch.no_grad():
        table = m.attention_biases.detach()[:, m.attention_bias_idxs].to("cpu", _DT)  # (heads, w², w²)
    norm = LayerNorm(m.norm.weight if m.norm.elementwise_affine else None, m.norm.bias, m.norm.eps)
    window = tuple(m.resolution)
    return NormedWindowAttention(norm, weight, bias, m.proj.weight, m.proj.bias, table, window, h)
