"""A UNet with cross-attention between its convolutions (Stable Diffusion's denoiser, in miniature).

    text      caption ids (B, T) → TextEncoder → context tokens c (B, T, Dc)
    time      t → sinusoidal features → MLP → τ (B, Dt), added inside every ResBlock
    down      level l: ResBlock(+τ) [→ CrossAttention(c)] → skip; stride-2 conv
    middle    ResBlock → CrossAttention(c) → ResBlock
    up        level l: upsample; concat the skip; ResBlock(+τ) [→ CrossAttention(c)]
    out       GroupNorm → SiLU → 3×3 conv → ε̂ (B, 1, H, W)

A cross-attention block is SD's "spatial transformer": GroupNorm, the C×H×W map as H·W tokens, a
pre-norm transformer block (self-attention over the pixels, cross-attention from the pixels to c, MLP:
:class:`~gatepool.layers.blocks.DecoderBlock` without the causal mask), back to C×H×W through a 1×1
projection initialised at zero, added to the input. The text reaches the image through the
cross-attention's keys and values and nowhere else: zero the cross-attention outputs and ε̂ no longer
depends on the caption (a test, and a claim of ``transformer-variants``).

The diffusion itself (noise schedule, ε-prediction loss, DDIM, guidance) is :mod:`gatepool.models.diffusion`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers.blocks import DecoderBlock
from gatepool.models.digit_text import PAD
from gatepool.models.dual_encoder import TextEncoder
from gatepool.models.registry import register_model
from gatepool.utils.checks import check_int

__all__ = ["CrossAttentionUNet", "ResBlock", "SpatialCrossAttention", "timestep_features"]


def timestep_features(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features of timesteps t (B,) → (B, dim): ``[cos(t ω_k), sin(t ω_k)]``,
    ``ω_k = max_period^(−k/(dim/2))`` (DDPM's, after the transformer's positions)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]  # (B, half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _groups(channels: int) -> int:
    return math.gcd(8, channels)


class ResBlock(nn.Module):
    """``h = conv(SiLU(GN(x))) + Linear(τ)``; ``out = skip(x) + conv(SiLU(GN(h)))``; skip: a 1×1 conv
    where the widths differ."""

    def __init__(self, in_ch: int, out_ch: int, time_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(_groups(in_ch), in_ch)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.time = nn.Linear(time_dim, out_ch)
        self.norm2 = nn.GroupNorm(_groups(out_ch), out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:  # (B, Ci, H, W), (B, Dt)
        h = self.conv1(F.silu(self.norm1(x))) + self.time(F.silu(temb))[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))  # (B, Co, H, W)


class SpatialCrossAttention(nn.Module):
    """Pixels as tokens through a transformer block that cross-attends to the context; residual out.

    ``x + proj_out(block(proj_in(GN(x)) as (B, HW, C), context))``; ``proj_out`` starts at zero.
    """

    def __init__(self, channels: int, context_dim: int, num_heads: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(_groups(channels), channels)
        self.proj_in = nn.Conv2d(channels, channels, 1)
        self.block = DecoderBlock(channels, num_heads, context_dim=context_dim, mlp="gelu", mlp_ratio=2.0)
        self.proj_out = nn.Conv2d(channels, channels, 1)
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)

    def forward(self, x: torch.Tensor, context: torch.Tensor, context_mask: torch.Tensor | None = None
                ) -> torch.Tensor:  # fmt: skip
        b, c, h, w = x.shape
        tokens = self.proj_in(self.norm(x)).flatten(2).transpose(1, 2)  # (B, HW, C)
        tokens = self.block(tokens, context, context_mask=context_mask, is_causal=False)
        return x + self.proj_out(tokens.transpose(1, 2).reshape(b, c, h, w))


class CrossAttentionUNet(nn.Module):
    """The text-conditioned denoiser ε̂(x_t, t, caption); see the module docstring.

    Args:
        image_size: side of the square input; divisible by ``2^(len(channels) − 1)``.
        channels: widths per level, top (full resolution) first.
        attn_levels: the levels (0 = top) whose ResBlocks are followed by cross-attention; the middle
            always has one.
        num_heads: heads of every attention.
        text_dim, text_depth, max_len: the caption encoder
            (:class:`~gatepool.models.dual_encoder.TextEncoder`).
    """

    def __init__(self, *, image_size: int = 16, channels: tuple[int, ...] = (32, 64),
                 attn_levels: tuple[int, ...] = (1,), num_heads: int = 4, text_dim: int = 32,
                 text_depth: int = 1, max_len: int = 8) -> None:  # fmt: skip
        super().__init__()
        channels, attn_levels = tuple(channels), tuple(attn_levels)
        if not channels or any(not isinstance(c, int) or c < 1 for c in channels):
            raise ValueError(f"channels must be positive ints, got {channels}")
        levels = len(channels)
        check_int(image_size, "image_size", 2 ** (levels - 1))
        if image_size % 2 ** (levels - 1):
            raise ValueError(f"image_size={image_size} must be divisible by 2^(len(channels) − 1) = "
                             f"{2 ** (levels - 1)}")
        if any(not 0 <= a < levels for a in attn_levels):
            raise ValueError(f"attn_levels must be in 0..{levels - 1}, got {attn_levels}")
        self.image_size, self.channels, self.attn_levels = image_size, channels, attn_levels
        time_dim = 4 * channels[0]
        self.time_dim = time_dim
        self.time_mlp = nn.Sequential(nn.Linear(channels[0], time_dim), nn.SiLU(),
                                      nn.Linear(time_dim, time_dim))  # fmt: skip
        self.text = TextEncoder(max_len=max_len, dim=text_dim, depth=text_depth, num_heads=num_heads)

        def xattn(level: int) -> nn.Module | None:
            if level not in attn_levels:
                return None
            return SpatialCrossAttention(channels[level], text_dim, num_heads)

        self.conv_in = nn.Conv2d(1, channels[0], 3, padding=1)
        self.down_res, self.down_attn, self.downsample = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        prev = channels[0]
        for level, ch in enumerate(channels):
            self.down_res.append(ResBlock(prev, ch, time_dim))
            self.down_attn.append(xattn(level) or nn.Identity())
            self.downsample.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1) if level < levels - 1
                                   else nn.Identity())  # fmt: skip
            prev = ch
        self.mid_res1 = ResBlock(prev, prev, time_dim)
        self.mid_attn = SpatialCrossAttention(prev, text_dim, num_heads)
        self.mid_res2 = ResBlock(prev, prev, time_dim)
        self.up_res, self.up_attn, self.upsample = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for level in reversed(range(levels)):
            ch = channels[level]
            self.upsample.append(nn.Upsample(scale_factor=2, mode="nearest") if level < levels - 1
                                 else nn.Identity())  # fmt: skip
            self.up_res.append(ResBlock(prev + ch, ch, time_dim))
            self.up_attn.append(xattn(level) or nn.Identity())
            prev = ch
        self.out = nn.Sequential(nn.GroupNorm(_groups(prev), prev), nn.SiLU(),
                                 nn.Conv2d(prev, 1, 3, padding=1))  # fmt: skip

    def cross_attentions(self) -> list[nn.Module]:
        """Every cross-attention layer (the only modules that read the caption's tokens)."""
        return [m.cross_attn for m in self.modules() if isinstance(m, DecoderBlock)]

    def encode_text(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Caption ids (B, T) → context tokens (B, T, Dc) and their mask (B, T), True = a real token."""
        return self.text(ids), ids != PAD

    def forward(self, x: torch.Tensor, t: torch.Tensor, ids: torch.Tensor | None = None, *,
                context: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:  # fmt: skip
        """ε̂ for noisy images x (B, 1, H, W) at timesteps t (B,), given caption ids (B, T) or an already
        encoded ``context`` = :meth:`encode_text` (ids)."""
        s = self.image_size
        if x.ndim != 4 or tuple(x.shape[1:]) != (1, s, s):
            raise ValueError(f"x must be (B, 1, {s}, {s}), got {tuple(x.shape)}")
        if (ids is None) == (context is None):
            raise ValueError("give exactly one of ids and context")
        ctx, mask = self.encode_text(ids) if context is None else context
        if t.shape != (x.shape[0],) or ctx.shape[0] != x.shape[0]:
            raise ValueError(f"t must be ({x.shape[0]},) and the context's batch {x.shape[0]}, got t "
                             f"{tuple(t.shape)} and context {tuple(ctx.shape)}")  # fmt: skip
        temb = self.time_mlp(timestep_features(t, self.channels[0]))  # (B, Dt)

        def attend(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
            return layer(h, ctx, mask) if isinstance(layer, SpatialCrossAttention) else h

        h = self.conv_in(x)
        skips = []
        for res, attn, down in zip(self.down_res, self.down_attn, self.downsample):
            h = attend(attn, res(h, temb))
            skips.append(h)
            h = down(h)
        h = self.mid_res2(self.mid_attn(self.mid_res1(h, temb), ctx, mask), temb)
        for up, res, attn in zip(self.upsample, self.up_res, self.up_attn):
            h = attend(attn, res(torch.cat([up(h), skips.pop()], dim=1), temb))
        return self.out(h)  # (B, 1, H, W)


@register_model("cross_attention_unet")
def cross_attention_unet(**kwargs) -> CrossAttentionUNet:
    """A text-conditioned UNet denoiser for digits (see :class:`CrossAttentionUNet`)."""
    return CrossAttentionUNet(**kwargs)
