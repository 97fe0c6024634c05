"""ViT: an image as a sequence of patches, read by a transformer encoder.

    patchify   Conv2d(C, D, kernel = stride = p): a token per p×p patch   (B, C, H, W) → (B, N, D), N = HW/p²
    cls        a learned token prepended (pool="cls")                     (B, 1 + N, D)
    positions  learned 1-D embedding (or 2-D, sinusoidal, none)           (B, 1 + N, D)
    encoder    depth × pre-norm EncoderBlock, final norm                  (B, 1 + N, D)
    pool       the CLS token | the token mean | a learned latent query    (B, D)
    head       LayerNorm → Linear(D, classes)                             (B, classes)

Less is built in than in a CNN: the only image prior is the patch grid (no locality inside the encoder,
no translation equivariance beyond the patch stride), so positions must be learned from data.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn

from gatepool.layers.attention_pool import AttentionPoolLatent
from gatepool.layers.blocks import Encoder
from gatepool.layers.positional import (
    LearnedPositionalEmbedding1d,
    LearnedPositionalEmbedding2d,
    SinusoidalPositionalEncoding1d,
)
from gatepool.layers.tokens import Tokens
from gatepool.models.registry import register_model
from gatepool.utils.checks import check_int

__all__ = ["ViT"]

POOLS = ("cls", "avg", "latent")
POSITIONS = ("learned", "learned-2d", "sinusoidal", "none")


class ViT(nn.Module):
    """Vision transformer; submodules ``patchify``, ``pos_embedding``, ``encoder``, ``pool``, ``head``.

    Args:
        image_size: side of the (square) input; must be divisible by ``patch_size``.
        patch_size: side of a patch = the patchify conv's kernel and stride.
        in_channels, num_classes: input channels and classes.
        dim, depth, num_heads: token width, number of blocks, heads per block.
        pool: ``"cls"`` (classify the CLS token), ``"avg"`` (mean of the patch tokens) or
            ``"latent"`` (one learned query attends over the tokens,
            :class:`~gatepool.layers.attention_pool.AttentionPoolLatent`).
        mlp, mlp_ratio, norm, dropout: passed to each :class:`~gatepool.layers.blocks.EncoderBlock`.
        pos: ``"learned"`` (1-D over CLS + patches), ``"learned-2d"`` (rows + columns of the patch
            grid; CLS gets none), ``"sinusoidal"`` or ``"none"``.
    """

    def __init__(
        self,
        *,
        image_size: int,
        patch_size: int,
        in_channels: int,
        dim: int,
        depth: int,
        num_heads: int,
        num_classes: int,
        pool: str = "cls",
        mlp: str = "gelu",
        mlp_ratio: float = 4.0,
        norm: str = "layer",
        pos: str = "learned",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
        if pos not in POSITIONS:
            raise ValueError(f"pos must be one of {POSITIONS}, got {pos!r}")
        check_int(patch_size, "patch_size")
        if image_size % patch_size != 0:
            raise ValueError(f"image_size={image_size} must be a multiple of patch_size={patch_size}")
        side = image_size // patch_size
        self.image_size, self.patch_size, self.grid = image_size, patch_size, (side, side)
        self.num_patches, self.pool_kind = side * side, pool
        self.patchify = nn.Sequential(
            OrderedDict(conv=nn.Conv2d(in_channels, dim, patch_size, stride=patch_size), tokens=Tokens())
        )
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02) if pool == "cls" else None
        n_tokens = self.num_patches + (pool == "cls")
        if pos == "learned":
            self.pos_embedding = LearnedPositionalEmbedding1d(n_tokens, dim)
        elif pos == "learned-2d":
            self.pos_embedding = LearnedPositionalEmbedding2d(side, side, dim)
        elif pos == "sinusoidal":
            self.pos_embedding = SinusoidalPositionalEncoding1d(dim, max_len=n_tokens)
        else:
            self.pos_embedding = nn.Identity()
        self.pos_kind = pos
        self.drop = nn.Dropout(dropout)
        block = dict(mlp=mlp, mlp_ratio=mlp_ratio, norm=norm, dropout=dropout)
        self.encoder = Encoder(dim, depth, num_heads, **block)
        self.pool = AttentionPoolLatent(dim, 1, num_heads) if pool == "latent" else None
        self.head = nn.Sequential(OrderedDict(norm=nn.LayerNorm(dim), fc=nn.Linear(dim, num_classes)))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) → input tokens (B, [1 +] N, D) with positions."""
        if x.ndim != 4 or tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            s = self.image_size
            raise ValueError(f"x must be images (B, C, {s}, {s}), got {tuple(x.shape)}")
        t = self.patchify(x)  # (B, N, D)
        if self.pos_kind == "learned-2d":
            t = self.pos_embedding(t)  # the 2-D table covers the patches only
        if self.cls_token is not None:
            t = torch.cat([self.cls_token.expand(t.shape[0], -1, -1), t], dim=1)  # (B, 1 + N, D)
        if self.pos_kind != "learned-2d":
            t = self.pos_embedding(t)
        return self.drop(t)

    def forward_features(
        self, x: torch.Tensor, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Images → encoded tokens (B, [1 +] N, D); with ``return_weights`` also each block's gates."""
        return self.encoder(self.embed(x), return_weights=return_weights)

    def forward(
        self, x: torch.Tensor, return_weights: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """(B, C, H, W) → logits (B, classes); with ``return_weights`` also a list of (B, H, T, T) gates."""
        res = self.forward_features(x, return_weights=return_weights)
        t, weights = res if return_weights else (res, None)
        if self.pool_kind == "cls":
            z = t[:, 0]
        elif self.pool_kind == "avg":
            z = t.mean(dim=1)
        else:
            z = self.pool(t)
        logits = self.head(z)
        return (logits, weights) if return_weights else logits


@register_model("vit")
def vit(**kwargs) -> ViT:
    """A ViT with every argument given (see :class:`ViT`)."""
    return ViT(**kwargs)


@register_model("vit_mnist")
def vit_mnist(**kwargs) -> ViT:
    """A small ViT for 28×28 digits: 4×4 patches (49 tokens + CLS), width 64, 4 blocks of 4 heads,
    GELU MLP of width 128; about 0.14 M parameters. Any :class:`ViT` argument overrides a default."""
    defaults = dict(
        image_size=28, patch_size=4, in_channels=1, dim=64, depth=4, num_heads=4, num_classes=10,
        pool="cls", mlp="gelu", mlp_ratio=2.0,
    )  # fmt: skip
    return ViT(**{**defaults, **kwargs})
