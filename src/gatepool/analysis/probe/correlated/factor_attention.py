"""CoaT's factorized attention with its convolutional relative position encoding (timm's
``FactorAttnConvRelPosEnc`` and the ``ConvRelPosEnc`` it shares with its stage) on a (C, 1, N) field of
N = 1 + H·W tokens (a class token, then the H × W map row by row):

    q, k, v = the qkv Linear of x, per head its d = C/h channels          (N, d) each
    factor  o_f = scale · q (softmax_N(k)ᵀ v): the keys softmaxed over the tokens per channel, a d × d
            matrix per head and sample, every token's query through it
    crpe    o_c = q ⊙ DW(v's map), the map's tokens only (the class token's row 0): DW the depthwise convs
            of the heads' splits (windows 3, 5, 7)
    out     proj(o_f + o_c)

The softmax of a sample's whole sequence and the product of two maps of one x have no closed form on the
state: the step is taken over Gaussian draws of x from its state (:class:`draws.Sampled`; the class
token one more token of the sequence's stationary correlation, its own mean and variance), the output,
the crpe's and its convs' outputs (rows of their own: ``crpe1`` and ``crpe1.conv_list.i``, shared by the
stage's blocks) their states over the draws; backward, the output's gradient drawn independent of x and
the gradients at x and at those tensors by autograd.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.draws import Sampled
from gatepool.analysis.probe.correlated.field import Field
from gatepool.analysis.probe.correlated.registry import register_named_rule


def _weights(m: nn.Module) -> dict:
    return {k: None if t is None else t.detach().to(torch.float32) for k, t in m.named_parameters()}


class FactorAttention:
    """CoaT's factorized attention of module ``m`` (its qkv, proj, scale, heads and crpe), called with its
    map's size (:meth:`bind`). :meth:`rows` the crpe's and its convs' (module, field, gradient).
    ``samples`` draws (None: S with S·N·C ≈ 2²⁴ for N tokens of C channels, from 256 to 2048: a row
    pools its N tokens' values, the class token's own (the head's, CoaT-Lite's last stage of 50 tokens)
    from 1,048 draws)."""

    takes_tokens = True  # the walk: a step of (N, T, C) tokens

    def __init__(self, m: nn.Module, samples: int | None = None) -> None:
        if m.attn_drop.p or m.proj_drop.p:
            raise NotImplementedError("FactorAttnConvRelPosEnc with dropout")
        crpe = m.crpe
        if any(c.dilation != (1, 1) or c.stride != (1, 1) for c in crpe.conv_list):
            raise NotImplementedError("ConvRelPosEnc with dilated or strided convs")
        self.m, self.crpe, self.samples, self.hw = m, crpe, samples, None
        self.w = {"qkv": _weights(m.qkv), "proj": _weights(m.proj)}
        self.convs = [(c.weight.detach().float(), None if c.bias is None else c.bias.detach().float(),
                       c.padding, c.groups) for c in crpe.conv_list]  # fmt: skip
        self.splits, self.heads, self.scale = list(crpe.channel_splits), m.num_heads, float(m.scale)

    def bind(self, size) -> None:
        self.hw = tuple(int(v) for v in size)

    def _fn(self, xs: torch.Tensor):
        """timm's forward on a (S, C, 1, N) batch of draws: the output (S, C, 1, N), and the crpe's
        (S, C, 1, N) and its convs' (S, C_i, H, W) outputs."""
        S, C, _, N = xs.shape
        H, W = self.hw
        h, d = self.heads, C // self.heads
        x = xs[:, :, 0].transpose(1, 2)  # (S, N, C)
        qkv = F.linear(x, self.w["qkv"]["weight"], self.w["qkv"].get("bias"))
        q, k, v = qkv.reshape(S, N, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)  # (S, h, N, d)
        factor = q @ (k.softmax(dim=2).transpose(-1, -2) @ v)
        v_img = v[:, :, 1:].transpose(-1, -2).reshape(S, h * d, H, W)
        convs = [F.conv2d(p, w, b, padding=pad, groups=g)
                 for p, (w, b, pad, g) in zip(torch.split(v_img, self.splits, 1), self.convs)]  # fmt: skip
        conv_v = torch.cat(convs, 1).reshape(S, h, d, H * W).transpose(-1, -2)
        crpe = F.pad(q[:, :, 1:] * conv_v, (0, 0, 1, 0, 0, 0))  # (S, h, N, d)
        o = (self.scale * factor + crpe).transpose(1, 2).reshape(S, N, C)
        out = F.linear(o, self.w["proj"]["weight"], self.w["proj"].get("bias"))

        def heads(t):  # (S, h, N, d) → (S, C, 1, N)
            return t.permute(0, 1, 3, 2).reshape(S, C, 1, N)

        return out.transpose(1, 2)[:, :, None], ((crpe, heads), *((c, lambda t: t) for c in convs))

    def forward(self, x: Field) -> Field:
        C, one, N = x.shape
        if self.hw is None or one != 1 or N != 1 + self.hw[0] * self.hw[1]:
            raise NotImplementedError(f"factorized attention on {x.shape} tokens of a map {self.hw}: a class "
                                      "token and the map's")  # fmt: skip
        samples = self.samples or min(2048, max(256, 2**24 // (N * C)))
        chunk = max(2, min(64, 2**22 // (N * 3 * C)))
        self.step = Sampled(self._fn, samples, chunk)
        return self.step.forward(x)

    def backward(self, g: Field) -> Field:
        return self.step.backward(g)

    def rows(self) -> list[tuple[nn.Module, Field, Field | None]]:
        """(module, field, gradient) of the crpe and each of its convs (gradient None before a backward)."""
        fields = getattr(self.step, "inner", None) if hasattr(self, "step") else None
        if fields is None:
            return []
        grads = getattr(self.step, "inner_grads", [None] * len(fields))
        return list(zip([self.crpe, *self.crpe.conv_list], fields, grads))


register_named_rule("timm.models.coat.FactorAttnConvRelPosEnc")(FactorAttention)
