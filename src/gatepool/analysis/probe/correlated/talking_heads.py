"""Talking-heads attention (CaiT's ``TalkingHeadAttn``): the heads' scores mixed by a Linear before the
softmax, their weights by another after it:

    s'_g = Σ_f L_gf s_f + b_g      A_g = softmax_j s'_g      A'_h = Σ_g W_hg A_g + c_h      o_h = A'_h v_h

the attention rule (:class:`attention.Attention`) with its weights' statistics mixed over the heads. Over
the keys of one query the scores of heads f are independent with spreads s_f² (``Attention``'s), so the
mixed scores' covariance is Σ' = L diag(s²) Lᵀ (b shifts every key alike: nothing), and with log-normal
weights A_g = (1 + ε_g)/S, E[ε_g ε_g'] = κ_gg' = e^{Σ'_gg'} − 1. Head h's weights then have the mean
m_h = Σ_g W_hg/S + c_h and the fluctuation δ = Σ_g W_hg ε_g/S, S² E[δ²] = K_h = (W κ Wᵀ)_hh (K_c from the
shared part); the gradient at head f's scores gathers every head's through both mixes:
P_q[f, h] = ((W L)_hf)² for the queries' (Σ_j A_ij … near its mean), P[f, h] = Σ_gg' W_hg L_gf (1 + κ_gg')
L_g'f W_hg' for the keys' (E[A_g A_g'] in it). Without the mixes (L = W = I) it is the attention rule.
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.attention import Attention, check_plain, kappa
from gatepool.analysis.probe.correlated.registry import register_named_rule


def _kappas(cov: torch.Tensor, S: int) -> torch.Tensor:
    """κ = e^{Σ'} − 1 of the mixed scores' covariance, each head's own its finite-S spread (``kappa``),
    two heads' bounded by √(κ_g κ_g')."""
    own = kappa(cov.diagonal(), S)
    bound = (own[:, None] * own[None, :]).sqrt()
    k = torch.maximum(torch.minimum(torch.expm1(cov.clamp(max=30)), bound), -bound)
    return k - torch.diag(k.diagonal()) + torch.diag(own)


class TalkingHeads(Attention):
    """:class:`Attention` with the heads' scores mixed by ``L`` (heads, heads) before the softmax and the
    weights by ``W`` (heads, heads) and its bias ``c`` after it."""

    def __init__(self, in_weight, in_bias, out_weight, out_bias, num_heads: int, L, W, c=None) -> None:
        super().__init__(in_weight, in_bias, out_weight, out_bias, num_heads)
        if L.shape != (num_heads, num_heads) or W.shape != (num_heads, num_heads):
            raise ValueError(
                f"L and W must be ({num_heads}, {num_heads}), got {tuple(L.shape)}, {tuple(W.shape)}"
            )
        self.L, self.W = L.detach().double(), W.detach().double()
        self.c = torch.zeros(num_heads, dtype=torch.float64) if c is None else c.detach().double()

    def tilt_heads(self) -> torch.Tensor:
        """Head f's scores move head h's weights by (W L)_hf to first order."""
        return self.W @ self.L

    def first_order(self, t: torch.Tensor) -> torch.Tensor:
        """K to first order in the heads' score spreads t: (W L diag(t) Lᵀ Wᵀ)_hh."""
        M = self.W @ self.L
        return (M * M) @ t

    def weights(self, s2: torch.Tensor, s2c: torch.Tensor, S: int):
        L, W = self.L, self.W
        k = _kappas(L @ torch.diag(s2) @ L.T, S)
        kc = torch.minimum(_kappas(L @ torch.diag(s2c) @ L.T, S), k)
        m = W.sum(1) / S + self.c
        K, Kc = ((W @ t @ W.T).diagonal().clamp_min(0) for t in (k, kc))
        Pq = (W @ L).T ** 2

        def P(t):  # P[f, h] = Σ_gg' W_hg L_gf (1 + κ_gg') L_g'f W_hg'
            return torch.einsum("hg,gf,gk,kf,hk->fh", W, L, 1 + t, L, W)

        return m, K, Kc, Pq, P(k), P(kc)


@register_named_rule("timm.models.cait.TalkingHeadAttn")
def talking_heads_rule(m) -> TalkingHeads:
    """timm's ``TalkingHeadAttn``: its fused qkv Linear, ``proj_l`` before the softmax, ``proj_w`` after
    it, proj out."""
    dim, heads = m.qkv.in_features, m.num_heads
    check_plain(m, dim)
    c = m.proj_w.bias
    return TalkingHeads(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, heads, m.proj_l.weight,
                        m.proj_w.weight, c)  # fmt: skip
