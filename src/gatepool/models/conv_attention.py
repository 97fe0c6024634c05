"""The lecture's net: a deliberately weak conv stem, then one attention layer that reaches everywhere.

    stem       Conv2d(1, 32, 5) (no padding) → ReLU → max pool 2×2     (B, 1, 28, 28) → (B, 32, 12, 12)
               read as 144 tokens of 32 features, row-major            → X (B, 144, 32), token r·12 + c
    attention  one head, d = 16 (optional):                            (B, 144, 32) → (B, 144, 32)
                   G = softmax(Q Kᵀ / √d),  Q = X W_Q,  K = X W_K      (B, 144, 144)  the gate matrix
                   P = G V W_O,             V = X W_V                  W_Q, W_K, W_V: 32→d, W_O: d→32
    head       mean over the 144 tokens → Linear(32, 10)               (B, 10)

A 5×5 conv unit sees 5×5 pixels, and the stem ends there: each token knows only its 6×6-pixel
neighbourhood (5×5 conv + 2×2 pool), and the average pool throws the positions away. Stacked 5×5 convs
reach ``1 + L(k − 1)`` pixels, so 7 layers would be needed to see all 28; one attention layer lets every
token read every other in one step (G is 144 × 144).

No residual around the attention by default, as in the lecture's equation ``P = softmax(QKᵀ/√d) X Vᵀ``
(``residual=True`` gives ``X + P``). Without attention (``attention=False``, the ``conv_stem`` model) the
attention submodule is the identity and the head pools the stem's tokens directly.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn

from gatepool.layers.attention import MultiHeadAttention
from gatepool.layers.tokens import MeanTokens, Tokens
from gatepool.models.registry import register_model
from gatepool.utils.checks import check_int

__all__ = ["ConvAttentionNet"]


class ConvAttentionNet(nn.Module):
    """Conv stem → (optional) single-head attention over the 144 tokens → average pool → Linear.

    Submodules: ``stem`` (image → tokens X), ``attention`` (tokens → tokens; ``nn.Identity`` when
    ``attention=False``), ``head`` (tokens → logits). ``grid`` is the token grid (12, 12).

    Args:
        attention: include the attention layer.
        d: width of queries, keys and values (16).
        channels: stem channels = token features (32).
        kernel_size: stem conv size (5).
        image_size, in_channels, num_classes: 28, 1, 10 for MNIST.
        residual: ``X + P`` instead of ``P``.
    """

    def __init__(
        self,
        *,
        attention: bool = True,
        d: int = 16,
        channels: int = 32,
        kernel_size: int = 5,
        image_size: int = 28,
        in_channels: int = 1,
        num_classes: int = 10,
        residual: bool = False,
    ) -> None:
        super().__init__()
        side = image_size - kernel_size + 1
        if side < 2:
            raise ValueError(f"image_size={image_size} is too small for kernel_size={kernel_size}")
        check_int(d, "d")
        self.grid = (side // 2, side // 2)
        self.has_attention, self.residual, self.d = attention, residual, d
        self.stem = nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(in_channels, channels, kernel_size),
                relu=nn.ReLU(),
                pool=nn.MaxPool2d(2),
                tokens=Tokens(),
            )
        )
        self.attention = MultiHeadAttention(channels, 1, head_dim=d) if attention else nn.Identity()
        self.head = nn.Sequential(OrderedDict(pool=MeanTokens(), fc=nn.Linear(channels, num_classes)))

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """X: the stem's tokens (B, 144, 32)."""
        if x.ndim != 4:
            raise ValueError(f"x must be images (B, C, H, W), got {tuple(x.shape)}")
        return self.stem(x)

    def mix(
        self, tokens: torch.Tensor, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The token-mixing step alone: X (B, T, C) → P (or X + P), and the gates G (B, T, T) if asked."""
        if not self.has_attention:
            if return_weights:
                raise ValueError("return_weights=True needs attention=True (this model has no attention)")
            return tokens
        res = self.attention(tokens, return_weights=return_weights)
        p, g = res if return_weights else (res, None)
        if self.residual:
            p = tokens + p
        return (p, g[:, 0]) if return_weights else p

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """G = softmax(Q Kᵀ / √d) for a batch of images: (B, 144, 144), rows sum to 1."""
        return self.mix(self.tokens(x), return_weights=True)[1]

    def forward(
        self, x: torch.Tensor, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, 1, 28, 28) → logits (B, 10); with ``return_weights`` also G (B, 144, 144)."""
        res = self.mix(self.tokens(x), return_weights=return_weights)
        p, g = res if return_weights else (res, None)
        logits = self.head(p)
        return (logits, g) if return_weights else logits


@register_model("conv_attention")
def conv_attention(**kwargs) -> ConvAttentionNet:
    """The lecture's net with its attention layer (see :class:`ConvAttentionNet`)."""
    kwargs.setdefault("attention", True)
    return ConvAttentionNet(**kwargs)


@register_model("conv_stem")
def conv_stem(**kwargs) -> ConvAttentionNet:
    """The same net without the attention layer: conv stem → average pool → Linear."""
    kwargs.setdefault("attention", False)
    return ConvAttentionNet(**kwargs)
