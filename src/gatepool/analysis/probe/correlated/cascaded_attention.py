"""Cascaded group attention in one window (EfficientViT-M's ``LocalWindowAttention`` and its
``CascadedGroupAttention``, timm's ``efficientvit_msra``) on a (C, H, W) map.

window    a map no larger than the window (ws × ws) is padded with zeros at its bottom and right to one
          window, attended, and cropped back (two fixed maps of the positions, exact on the whole
          covariance, :class:`resample.PositionMap`); the padded zeros enter the BatchNorms' statistics
          as they do timm's. A map of several windows has no rule here
cascade   the channels split into h heads' x_0 … x_{h−1}; head i's input u_i = x_i + o_{i−1} (u_0 = x_0), the
          two independent (the state's channels); q, k, v = ConvNorm(u_i) (a 1×1 conv and a BatchNorm),
          q through a depthwise ConvNorm, then o_i = softmax(c q kᵀ + B_i) v over the window's T positions,
          B_i the head's relative-position bias (its table read at the offsets' index: zeros at init)
          and c = key_dim^−½; the heads' outputs stacked, then the projection (ReLU, ConvNorm)
attention o_i's moments over draws of (q, k, v) from the state (:mod:`drawn_attention`): T = 49 or 16
          positions of which most are the pad's (q, k, v there the BatchNorms' shifts alone), no
          near-uniform expansion
backward  in reverse: o_i's gradient the stacked outputs' slice plus u_{i+1}'s (the two added as
          independent), back through the attention, the depthwise ConvNorm and the qkv ConvNorm to u_i,
          which is x_i's gradient and o_{i−1}'s
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.add import add, add_grads
from gatepool.analysis.probe.correlated.cat import Cat
from gatepool.analysis.probe.correlated.drawn_attention import DrawnAttention
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.linear_attention import module_steps
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.resample import PositionMap


def _rows(f: Field, lo: int, hi: int) -> Field:
    return Field(f.mean[lo:hi], f.var[lo:hi], f.corr[lo:hi])


class SoftmaxAttention(DrawnAttention):
    """o = softmax(c q kᵀ + B) v of one head (q, k of d_k channels, v of d_v), B (T, T) a fixed bias."""

    def __init__(self, dk: int, dv: int, scale: float, bias: torch.Tensor) -> None:
        self.scale, self.bias = float(scale), bias.detach().to("cpu", _DT)
        super().__init__((dk, dk, dv), self._attend)

    def _attend(self, q, k, v):
        return torch.softmax(self.scale * q @ k.transpose(-1, -2) + self.bias, -1) @ v


class CascadedGroupAttention:
    """timm's ``CascadedGroupAttention`` on a map of its window's size, from its modules' steps."""

    def __init__(self, m: nn.Module) -> None:
        self.h, self.dk, self.dv = m.num_heads, m.key_dim, m.val_dim
        biases = m.attention_biases.detach()[:, m.attention_bias_idxs]  # (heads, T, T)
        self.qkvs = [module_steps(q) for q in m.qkvs]
        self.dws = [module_steps(d) for d in m.dws]
        self.attn = [SoftmaxAttention(self.dk, self.dv, m.scale, b) for b in biases]
        self.proj = module_steps(m.proj)
        self.res = m.resolution

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        if (H, W) != (self.res, self.res) or C % self.h:
            raise ValueError(f"x must be (C, {self.res}, {self.res}), the heads dividing C: got {x.shape}")
        self.w, outs, o = C // self.h, [], None
        for i in range(self.h):
            u = _rows(x, self.w * i, self.w * (i + 1))
            u = u if o is None else add(u, o)
            f = self.qkvs[i].forward(u)
            q = self.dws[i].forward(_rows(f, 0, self.dk))
            o = self.attn[i].forward(Cat().forward([q, _rows(f, self.dk, f.shape[0])]))
            outs.append(o)
        self.cat = Cat()
        return self.proj.forward(self.cat.forward(outs))

    def backward(self, g: Field) -> Field:
        parts, gx, up = self.cat.backward(self.proj.backward(g)), [], None
        for i in reversed(range(self.h)):
            go = parts[i] if up is None else add_grads(parts[i], up)
            ga = self.attn[i].backward(go)
            gq = self.dws[i].backward(_rows(ga, 0, self.dk))
            up = self.qkvs[i].backward(Cat().forward([gq, _rows(ga, self.dk, ga.shape[0])]))
            gx.append(up)
        return Cat().forward(gx[::-1])


def _embed(hw: tuple[int, int], ws: int) -> torch.Tensor:
    """(ws², H·W): the positions of an H × W map at the top left of a ws × ws window (zeros elsewhere)."""
    H, W = hw
    rows = torch.arange(ws * ws).reshape(ws, ws)[:H, :W].flatten()
    M = torch.zeros((ws * ws, H * W), dtype=_DT)
    M[rows, torch.arange(H * W)] = 1.0
    return M


class LocalWindowAttention:
    """timm's ``LocalWindowAttention`` on a map that fits one window: pad, attend, crop."""

    def __init__(self, m: nn.Module) -> None:
        self.attn, self.ws = CascadedGroupAttention(m.attn), m.attn.resolution

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        if H > self.ws or W > self.ws:
            raise NotImplementedError(f"LocalWindowAttention: a {H}×{W} map, windows of {self.ws}: one only")
        M = _embed((H, W), self.ws)
        self.pad, self.crop = PositionMap(M, (self.ws, self.ws)), PositionMap(M.T, (H, W))
        return self.crop.forward(self.attn.forward(self.pad.forward(x)))

    def backward(self, g: Field) -> Field:
        return self.pad.backward(self.attn.backward(self.crop.backward(g)))


@register_named_rule("timm.models.efficientvit_msra.LocalWindowAttention")
def local_window_attention_rule(m: nn.Module) -> LocalWindowAttention:
    return LocalWindowAttention(m)


@register_named_rule("timm.models.efficientvit_msra.CascadedGroupAttention")
def cascaded_group_attention_rule(m: nn.Module) -> CascadedGroupAttention:
    return CascadedGroupAttention(m)
