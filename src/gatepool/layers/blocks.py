"""Transformer blocks: attention mixes tokens, an MLP transforms each token, residuals and norms around both.

Pre-norm (GPT-2, ViT; trains deep stacks without warm-up tricks: the residual stream is never normed)::

    x = x + attn(norm1(x))
    x = x + mlp(norm2(x))                       ... and one final norm after the last block

Post-norm (the original transformer)::

    x = norm1(x + attn(x))
    x = norm2(x + mlp(x))

MLPs: ``gelu``: ``W2 GELU(W1 x)``; ``swiglu``: ``W2 (SiLU(W1 x) ⊙ W3 x)`` (hidden width ⅔ of the GELU
one, so both have about the same parameters). Norms: ``layer`` = LayerNorm (mean and variance over the
features of each token), ``rms`` = RMSNorm (``x / rms(x) · g``, no centring).

``EncoderBlock`` is self-attention + MLP (with ``is_causal=True`` it is also the GPT block: a
decoder-only LM is an ``Encoder`` run with a causal mask). ``DecoderBlock`` adds cross-attention to the
encoder's output between the masked self-attention and the MLP.

Masks have one polarity, **True = takes part** (``gatepool.layers.attention``): ``attn_mask`` True =
attend; ``key_mask`` (B, T) and ``context_mask`` (B, M) True = a real token / context position, False =
padding. torch's ``nn.Transformer*`` layers take ``*_key_padding_mask`` with True = padding: pass its
negation.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers.attention import MultiHeadAttention
from gatepool.utils.checks import check_int, check_number

__all__ = ["MLP", "Decoder", "DecoderBlock", "Encoder", "EncoderBlock", "make_norm"]

MLP_KINDS = ("gelu", "swiglu")
NORMS = ("layer", "rms")


def make_norm(norm: str, dim: int) -> nn.Module:
    """``"layer"`` → ``nn.LayerNorm(dim)``, ``"rms"`` → ``nn.RMSNorm(dim)``."""
    if norm == "layer":
        return nn.LayerNorm(dim)
    if norm == "rms":
        return nn.RMSNorm(dim)
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


class MLP(nn.Module):
    """Per-token feed-forward network, ``kind="gelu"`` or ``"swiglu"``; hidden width ``mlp_ratio · dim``
    (⅔ of that for SwiGLU, rounded up to a multiple of 8) unless ``hidden_dim`` is given."""

    def __init__(
        self,
        dim: int,
        *,
        kind: str = "gelu",
        mlp_ratio: float = 4.0,
        hidden_dim: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if kind not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {kind!r}")
        check_number(mlp_ratio, "mlp_ratio", 0, low_open=True)
        if hidden_dim is None:
            hidden_dim = int(mlp_ratio * dim)
            if kind == "swiglu":
                hidden_dim = -(-int(2 * hidden_dim / 3) // 8) * 8
        check_int(hidden_dim, "hidden_dim")
        self.kind, self.hidden_dim = kind, hidden_dim
        width = 2 * hidden_dim if kind == "swiglu" else hidden_dim  # swiglu: W1 and W3 in one matmul
        self.fc1 = nn.Linear(dim, width)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., D)
        h = self.fc1(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.drop(self.fc2(h))


def _check_options(norm: str, mlp: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if mlp not in MLP_KINDS:
        raise ValueError(f"mlp must be one of {MLP_KINDS}, got {mlp!r}")


class EncoderBlock(nn.Module):
    """Self-attention + MLP with residuals; ``prenorm=True``: ``x + f(norm(x))``, else ``norm(x + f(x))``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp: str = "swiglu",
        mlp_ratio: float = 4.0,
        norm: str = "layer",
        prenorm: bool = True,
        dropout: float = 0.0,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        _check_options(norm, mlp)
        self.prenorm = prenorm
        self.norm1 = make_norm(norm, dim)
        self.attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, dropout=dropout)
        self.norm2 = make_norm(norm, dim)
        self.mlp = MLP(dim, kind=mlp, mlp_ratio=mlp_ratio, dropout=dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # (B, T, D) -> (B, T, D) [, (B, H, T, T)]
        kw = dict(attn_mask=attn_mask, key_mask=key_mask, is_causal=is_causal)
        if self.prenorm:
            a = self.attn(self.norm1(x), return_weights=return_weights, **kw)
            a, w = a if return_weights else (a, None)
            x = x + a
            x = x + self.mlp(self.norm2(x))
        else:
            a = self.attn(x, return_weights=return_weights, **kw)
            a, w = a if return_weights else (a, None)
            x = self.norm1(x + a)
            x = self.norm2(x + self.mlp(x))
        return (x, w) if return_weights else x


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to ``context`` (the encoder output), MLP; each residual."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        context_dim: int | None = None,
        mlp: str = "swiglu",
        mlp_ratio: float = 4.0,
        norm: str = "layer",
        prenorm: bool = True,
        dropout: float = 0.0,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        _check_options(norm, mlp)
        self.prenorm = prenorm
        self.norm1 = make_norm(norm, dim)
        self.self_attn = MultiHeadAttention(dim, num_heads, qkv_bias=qkv_bias, dropout=dropout)
        self.norm2 = make_norm(norm, dim)
        self.cross_attn = MultiHeadAttention(
            dim, num_heads, context_dim=context_dim, qkv_bias=qkv_bias, dropout=dropout
        )
        self.norm3 = make_norm(norm, dim)
        self.mlp = MLP(dim, kind=mlp, mlp_ratio=mlp_ratio, dropout=dropout)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        is_causal: bool = True,
    ) -> torch.Tensor:  # x (B, N, D), context (B, M, Dc) -> (B, N, D)
        self_kw = dict(attn_mask=attn_mask, key_mask=key_mask, is_causal=is_causal)
        if self.prenorm:
            x = x + self.self_attn(self.norm1(x), **self_kw)
            x = x + self.cross_attn(self.norm2(x), context=context, key_mask=context_mask)
            x = x + self.mlp(self.norm3(x))
        else:
            x = self.norm1(x + self.self_attn(x, **self_kw))
            x = self.norm2(x + self.cross_attn(x, context=context, key_mask=context_mask))
            x = self.norm3(x + self.mlp(x))
        return x


class Encoder(nn.Module):
    """``depth`` EncoderBlocks (+ a final norm when pre-norm). Keyword arguments go to every block."""

    def __init__(self, dim: int, depth: int, num_heads: int, **block_kwargs) -> None:
        super().__init__()
        check_int(depth, "depth", 0)
        self.blocks = nn.ModuleList(EncoderBlock(dim, num_heads, **block_kwargs) for _ in range(depth))
        prenorm = block_kwargs.get("prenorm", True)
        self.norm = make_norm(block_kwargs.get("norm", "layer"), dim) if prenorm else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """(B, T, D) -> (B, T, D); with ``return_weights`` also each block's gates (B, H, T, T)."""
        weights = []
        for block in self.blocks:
            x = block(x, attn_mask, key_mask, is_causal, return_weights)
            if return_weights:
                x, w = x
                weights.append(w)
        x = self.norm(x)
        return (x, weights) if return_weights else x


class Decoder(nn.Module):
    """``depth`` DecoderBlocks (+ a final norm when pre-norm). Keyword arguments go to every block."""

    def __init__(self, dim: int, depth: int, num_heads: int, **block_kwargs) -> None:
        super().__init__()
        check_int(depth, "depth", 0)
        self.blocks = nn.ModuleList(DecoderBlock(dim, num_heads, **block_kwargs) for _ in range(depth))
        prenorm = block_kwargs.get("prenorm", True)
        self.norm = make_norm(block_kwargs.get("norm", "layer"), dim) if prenorm else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        is_causal: bool = True,
    ) -> torch.Tensor:  # (B, N, D), (B, M, Dc) -> (B, N, D)
        for block in self.blocks:
            x = block(x, context, attn_mask, key_mask, context_mask, is_causal)
        return self.norm(x)
