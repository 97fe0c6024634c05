"""Cascaded group attention in one window (EfficientViT-M's ``LocalWindowAttention`` and its
``CascadedGroupAttention``, timm's ``efficientvit_msra``) on a (C, H, W) map.

window    a map no larger than the window (ws × ws) is padded with zeros at its bottom and right to one
          window, attended, and cropped back (two fixed maps of the positions, exact on the whole
          covariance, :class:`resample.PositionMap`); the padded zeros enter the BatchNorms' statistics
          as they do timm's. A map of several windows has no rule here
cascade   the channels split into h heads' x_0 … x_{h−1}; head i's input u_i = x_i + o_{i−1} (u_0 = x_0);
          q, k, v = ConvNorm(u_i) (a 1×1 conv and a BatchNorm), q through a depthwise ConvNorm, then
          o_i = softmax(c q kᵀ + B_i) v over the window's T positions, B_i the head's relative-position
          bias (its table read at the offsets' index: zeros at init) and c = key_dim^−½; the heads'
          outputs stacked, then the projection (ReLU, ConvNorm)
draws     all of it up to the projection's ReLU on draws of x from the state (:mod:`drawn_attention`):
          o_{i−1} is a function of x_0 … x_{i−1} whose channels are correlated (one head's weights, its
          values a map of 16 channels), which a state of independent channels per head would drop (the
          later heads' outputs then 0.75 of their measured second moment on EfficientViT-M0's first
          block); T = 49 or 16 positions of which most are the pad's: no near-uniform expansion. The
          BatchNorms at the draws' own statistics (the infinite batch's; their backward through the
          statistics, O(1/(batch·T)), left out), the ReLU's gate beside the values it gates
backward  the projection's ConvNorm by its rule, then through the draws (the gradient at the ReLU's
          output independent of the values, as the walk's)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.drawn_attention import DrawnAttention
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.linear_attention import module_steps
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.resample import PositionMap


class SoftmaxAttention(DrawnAttention):
    """o = softmax(c q kᵀ + B) v of one head (q, k of d_k channels, v of d_v), B (T, T) a fixed bias."""

    def __init__(self, dk: int, dv: int, scale: float, bias: torch.Tensor) -> None:
        self.scale, self.bias = float(scale), bias.detach().to("cpu", _DT)
        super().__init__((dk, dk, dv), self._attend)

    def _attend(self, q, k, v):
        return torch.softmax(self.scale * q @ k.transpose(-1, -2) + self.bias, -1) @ v


def _conv_norm(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm's ``ConvNorm`` (conv, BatchNorm2d) on draws x (n, C, H, W), the norm at the draws' own
    statistics over the draws and the positions (constants: the norm as its affine map)."""
    y = m.conv._conv_forward(x, m.conv.weight.detach().to(_DT), None)
    bn = m.bn
    with torch.no_grad():
        mu, var = y.mean((0, 2, 3)), y.var((0, 2, 3), unbiased=False)
    a = bn.weight.detach().to(_DT) / (var + bn.eps).sqrt()
    return (y - mu[:, None, None]) * a[:, None, None] + bn.bias.detach().to(_DT)[:, None, None]


class CascadedGroupAttention(DrawnAttention):
    """timm's ``CascadedGroupAttention`` on a map of its window's size: the heads, the cascade and the
    projection's ReLU on each draw of x, then the projection's ConvNorm (its rule)."""

    def __init__(self, m: nn.Module) -> None:
        if not isinstance(m.proj, nn.Sequential) or len(m.proj) != 2 or not isinstance(m.proj[0], nn.ReLU):
            raise NotImplementedError("CascadedGroupAttention whose proj is not (ReLU, ConvNorm)")
        if any(c.conv.bias is not None or not c.bn.affine for c in [*m.qkvs, *m.dws]):
            raise NotImplementedError("CascadedGroupAttention with a conv bias or a norm without affine")
        self.m, self.h, self.dk, self.dv, self.res = m, m.num_heads, m.key_dim, m.val_dim, m.resolution
        biases = m.attention_biases.detach()[:, m.attention_bias_idxs]  # (heads, T, T)
        self.heads = [SoftmaxAttention(self.dk, self.dv, m.scale, b) for b in biases]
        self.proj = module_steps(m.proj[1])
        super().__init__((m.qkvs[0].conv.in_channels * self.h,), self._cascade)

    def _cascade(self, x: torch.Tensor) -> torch.Tensor:
        """(n, T, C) draws of the window to (n, T, heads·d_v): ReLU of each head's output."""
        n, T, C = x.shape
        X = x.transpose(1, 2).reshape(n, C, self.res, self.res)
        outs, o = [], None
        for i, (u, head) in enumerate(zip(X.chunk(self.h, 1), self.heads)):
            f = _conv_norm(self.m.qkvs[i], u if o is None else u + o)
            q, k, v = f.split([self.dk, self.dk, self.dv], 1)
            q = _conv_norm(self.m.dws[i], q)
            o = head.attend(*(t.flatten(2).transpose(1, 2) for t in (q, k, v)))  # (n, T, d_v)
            o = o.transpose(1, 2).reshape(n, self.dv, self.res, self.res)
            outs.append(o.relu())
        return torch.cat(outs, 1).flatten(2).transpose(1, 2)

    def forward(self, x: Field) -> Field:
        if x.shape[1:] != (self.res, self.res):
            raise ValueError(f"x must be (C, {self.res}, {self.res}), got {x.shape}")
        return self.proj.forward(super().forward(x))

    def backward(self, g: Field) -> Field:
        return super().backward(self.proj.backward(g))


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
