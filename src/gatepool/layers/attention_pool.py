"""Latent attention pooling: a learned query (a latent, not a token) asks every token how much it counts.

Average pooling gives every token the same gate, ``1/T``. Latent attention pooling gives the gate a
score: a learned query q scores each token's key, and the summary is the gated average of values,

    s_j = q · k_j / √d,     g = softmax(s),     out = Σ_j g_j v_j  (then an output projection).

One query gives one summary vector (a drop-in head for a ViT or a CNN: replaces the CLS token or the
global average pool); Q queries give a set of Q summaries. A zero query scores every token 0 and the
gate is the even split: the layer *is* average pooling of the values. The queries start near zero
(N(0, 0.02²): small, so the layer starts close to average pooling; random, so that several queries do
not stay identical), and training moves the gate away from the even split where that helps.

The name follows timm's ``AttentionPoolLatent``. It is not the ``attention`` gate of the pools
(``GatedPool2d(..., gate="attention")``), which weighs the positions of each small window by a score
read from each position's own features; here one learned query attends over all the tokens.

Masks: ``key_mask`` (B, T) bool, **True = a real token** that takes part (the polarity of every mask in
``gatepool.layers.attention``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.layers.attention import MultiHeadAttention
from gatepool.utils.checks import check_int

__all__ = ["AttentionPoolLatent"]


class AttentionPoolLatent(nn.Module):
    """Pool tokens (B, T, D) — or a feature map (B, D, H, W) — with ``num_queries`` learned queries.

    Returns (B, D) when ``num_queries == 1``, else (B, num_queries, D).
    """

    def __init__(self, dim: int, num_queries: int = 1, num_heads: int = 1, *, qkv_bias: bool = False) -> None:
        super().__init__()
        check_int(num_queries, "num_queries")
        self.dim, self.num_queries = dim, num_queries
        self.attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias)
        self.queries = nn.Parameter(torch.randn(num_queries, dim) * 0.02)  # (Q, D): ≈ average pool at init

    def forward(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Args: x (B, T, D) or (B, D, H, W); key_mask (B, T) bool, True = a real token (takes part).

        Returns the summary, and with ``return_weights`` also the gates (B, heads, Q, T).
        """
        if x.ndim == 4:
            x = x.flatten(2).transpose(1, 2)  # (B, D, H, W) -> (B, H·W, D)
        if x.ndim != 3 or x.shape[-1] != self.dim:
            d = self.dim
            raise ValueError(f"x must have shape (B, T, {d}) or (B, {d}, H, W), got {tuple(x.shape)}")
        q = self.queries.expand(x.shape[0], -1, -1)  # (B, Q, D)
        res = self.attn(q, context=x, key_mask=key_mask, return_weights=return_weights)
        out, weights = res if return_weights else (res, None)
        if self.num_queries == 1:
            out = out[:, 0]  # (B, D)
        return (out, weights) if return_weights else out
