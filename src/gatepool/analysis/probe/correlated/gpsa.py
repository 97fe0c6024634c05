"""Gated positional self-attention (ConViT's ``GPSA``): per head h, with g_h = σ(gating_h),

    A = (1 − g) softmax_j(q_i · k_j/√d) + g P,      P = softmax_j(pos_proj(r_ij))      o_i = Σ_j A_ij v_j

P a constant (T, T) matrix per head: ``pos_proj`` of the relative offsets r_ij (Δx, Δy, Δx² + Δy²) of the
tokens' grid, computed (never predicted); both softmaxes sum to 1 over j, so the renormalisation by
Σ_j A_ij divides by 1. The patch part is the attention rule with its weights scaled by 1 − g after the
softmax (talking heads with L = I, W = diag(1 − g): mean weight m = (1 − g)/S, K = (1 − g)² κ, the queries'
and keys' gradients scaled by (1 − g)²); the positional part is a linear map of the values, exact on
their whole covariance. With ε the patch weights' fluctuation, independent of v:

forward   E[o] = m Σ_j E[v_j] + g P E[v];  per channel (its head's P and g), E[v vᵀ] = R,
          E[o oᵀ] = R_A + g² P R Pᵀ + X + Xᵀ,  X_ii' = m g (1ᵀ R Pᵀ)_i' (the patch part's mean weight
          against the positional part), R_A the attention rule's (its variance and its covariance at
          every lag, the same for every pair of tokens)
backward  the queries' and keys' as the attention rule's with the weights above (the positional part
          is constant, and the renormalisation's gradient is a constant per query, which the softmax
          takes away); the values' ∂L/∂v = A_patchᵀ G + g Pᵀ G:  E[gv gvᵀ] = the rule's + g² Pᵀ E[G Gᵀ] P
          + Y + Yᵀ, Y_jj' = m g (1ᵀ E[G Gᵀ] P)_j'
ConViT's last blocks' ``MHSA`` is the attention rule itself.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.adaptive import _MAX_POSITIONS
from gatepool.analysis.probe.correlated.attention import Attention, check_plain
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.positions import covariance, from_covariance
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.talking_heads import TalkingHeads


class GatedPositional(TalkingHeads):
    """:class:`TalkingHeads` with L = I and W = diag(1 − g) (the patch part), plus g P v per head, P given
    by ``positional(T)`` (heads, T, T) for T tokens."""

    def __init__(self, in_weight, in_bias, out_weight, out_bias, num_heads: int, gate, positional) -> None:
        g = gate.detach().to(_DT)
        eye = torch.eye(num_heads, dtype=_DT)
        super().__init__(in_weight, in_bias, out_weight, out_bias, num_heads, eye, torch.diag(1 - g))
        self.g, self.positional = g, positional

    def _per_channel(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.dv, 0)

    def mixed(self, x: Field) -> Field:
        patch = super().mixed(x)  # the patch part's (the weights scaled by 1 − g)
        D, _, T = x.shape
        if T > _MAX_POSITIONS:
            raise NotImplementedError(f"GPSA over {T} tokens: at most {_MAX_POSITIONS}")
        self.pos = self._per_channel(self.positional(T).to(_DT))  # (D_v, T, T)
        self.gc = self._per_channel(self.g)[:, None, None]
        fv = self.v.forward(x)
        mv = fv.mean[:, 0, :, None]  # (D_v, T, 1)
        R = covariance(fv) + mv @ mv.mT
        m = self.m[:, None, None]
        PR = self.pos @ R
        X = m * self.gc * PR.sum(2)[:, None, :].expand_as(R)  # m g (1ᵀ R Pᵀ)_i'
        ma = patch.mean[:, 0, :, None]
        mean = ma + self.gc * (self.pos @ mv)
        second = covariance(patch) + ma @ ma.mT + self.gc**2 * PR @ self.pos.mT + X + X.mT
        return from_covariance(mean[:, None, :, 0], second - mean @ mean.mT)

    def grads(self, G: Field) -> tuple[Field, Field, Field]:
        gq, gk, gv = super().grads(G)
        mg = G.mean[:, 0, :, None]
        E = covariance(G) + mg @ mg.mT  # E[G Gᵀ] (D_v, T, T)
        EP = E @ self.pos
        Y = self.m[:, None, None] * self.gc * EP.sum(1)[:, None, :].expand_as(E)  # m g (1ᵀ E P)_j'
        full = covariance(gv) + self.gc**2 * self.pos.mT @ EP + Y + Y.mT
        return gq, gk, from_covariance(torch.zeros_like(gv.mean), full)


def _positional(m: nn.Module):
    """T ↦ (heads, T, T): GPSA's softmax of ``pos_proj`` of the tokens' relative offsets, as its forward
    computes it (``get_rel_indices``), without touching the module."""

    def P(T: int) -> torch.Tensor:
        with torch.no_grad():
            rel = m.get_rel_indices(T).to(torch.float64)  # (1, T, T, 3)
            w, b = m.pos_proj.weight.double(), m.pos_proj.bias
            score = rel @ w.T + (0 if b is None else b.double())
            return score.permute(0, 3, 1, 2)[0].softmax(-1)

    return P


@register_named_rule("timm.models.convit.GPSA")
def gpsa_rule(m: nn.Module) -> GatedPositional:
    """timm's ConViT ``GPSA``: qk (queries then keys, heads one after another) and v Linears, the gate
    σ(gating_param) per head, pos_proj of the relative offsets, proj."""
    dim, heads = m.dim, m.num_heads
    if abs(m.scale - (dim // heads) ** -0.5) > 1e-12 or m.attn_drop.p or m.proj_drop.p:
        raise NotImplementedError("GPSA with its own scale or dropout")
    in_weight = torch.cat((m.qk.weight, m.v.weight))
    bias = None if m.qk.bias is None else torch.cat((m.qk.bias, m.v.bias))
    gate = torch.sigmoid(m.gating_param.detach())
    return GatedPositional(in_weight, bias, m.proj.weight, m.proj.bias, heads, gate, _positional(m))


@register_named_rule("timm.models.convit.MHSA")
def convit_mhsa_rule(m: nn.Module) -> Attention:
    """timm's ConViT ``MHSA`` (its last blocks, with the class token): timm's ``Attention`` by another name,
    a fused qkv Linear read (3, heads, head_dim) and proj."""
    check_plain(m, m.qkv.in_features)
    return Attention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, m.num_heads)
