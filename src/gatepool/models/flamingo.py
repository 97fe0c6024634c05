"""A decoder-only LM with gated cross-attention layers inserted between its blocks (Flamingo, in miniature).

    lm        a pretrained, frozen decoder-only LM (:class:`~gatepool.models.seq.DecoderLM`: tokens +
              positions → causal blocks → final norm → next-token head)
    vision    a small CNN over the canvas → a grid of feature tokens with learned 2-D positions (B, M, Dv)
    xattn_l   before LM block l, a gated cross-attention dense block (the only new text-side weights):

        x = x + tanh(α_attn) · CrossAttn(LN(x), vision tokens)
        x = x + tanh(α_ff)   · MLP(LN(x))

The gates α start at 0, so tanh(α) = 0 and at initialisation the model is exactly the text LM: the same
logits, bit for bit, whatever the image (a test, and a claim of ``transformer-variants``). Training then
opens the gates while the LM's own weights stay frozen (``freeze_lm``), so the text model it started from
is never forgotten. One image per caption: every text token attends to all of its canvas's tokens (the
paper's "attend to the last preceding image" with a single image). Flamingo's Perceiver Resampler is left
out: the canvas grid's few dozen tokens are attended to directly.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers.attention import MultiHeadAttention
from gatepool.layers.blocks import MLP
from gatepool.layers.positional import LearnedPositionalEmbedding2d
from gatepool.layers.tokens import Tokens
from gatepool.models.digit_text import BOS, EOS, PAD, VOCAB_SIZE
from gatepool.models.registry import register_model
from gatepool.models.seq import DecoderLM

__all__ = ["CanvasEncoder", "Flamingo", "GatedCrossAttentionBlock", "caption_loss"]


def caption_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of captions ids (B, T) from logits (B, T, V): position t predicts token
    t + 1; PAD targets are left out (mean over the real tokens: the words and EOS)."""
    target = ids[:, 1:].masked_fill(ids[:, 1:] == PAD, -100)
    flat = logits[:, :-1].reshape(-1, logits.shape[-1])  # (B·(T−1), V)
    return F.cross_entropy(flat, target.reshape(-1), ignore_index=-100)


class GatedCrossAttentionBlock(nn.Module):
    """``x + tanh(α_attn) · xattn(LN(x), v)``, then ``+ tanh(α_ff) · MLP(LN(x))``; α's start at 0."""

    def __init__(self, dim: int, vision_dim: int, num_heads: int, mlp_ratio: float = 2.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, num_heads, context_dim=vision_dim)
        self.attn_gate = nn.Parameter(torch.zeros(1))
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, kind="gelu", mlp_ratio=mlp_ratio)
        self.ff_gate = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, vision: torch.Tensor) -> torch.Tensor:  # (B, T, D), (B, M, Dv)
        x = x + torch.tanh(self.attn_gate) * self.attn(self.norm1(x), context=vision)
        return x + torch.tanh(self.ff_gate) * self.mlp(self.norm2(x))


class CanvasEncoder(nn.Module):
    """Stride-2 3×3 convs (GroupNorm, GELU between) over a (1, H, W) canvas → tokens (B, h·w, D) + 2-D
    learned positions, h = H/2^k and w = W/2^k rounded up for k convs."""

    def __init__(self, height: int, width: int, channels: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        layers, prev, h, w = [], 1, height, width
        for i, ch in enumerate(channels):
            layers.append(nn.Conv2d(prev, ch, 3, stride=2, padding=1))
            if i < len(channels) - 1:
                layers += [nn.GroupNorm(8 if ch % 8 == 0 else 1, ch), nn.GELU()]
            prev, h, w = ch, (h + 1) // 2, (w + 1) // 2
        self.convs = nn.Sequential(*layers, Tokens())
        self.grid, self.dim = (h, w), prev
        self.pos_embedding = LearnedPositionalEmbedding2d(h, w, prev)
        self.norm = nn.LayerNorm(prev)

    def forward(self, canvas: torch.Tensor) -> torch.Tensor:  # (B, 1, H, W) -> (B, h·w, D)
        return self.norm(self.pos_embedding(self.convs(canvas)))


class Flamingo(nn.Module):
    """Captions a canvas with a frozen text LM and gated cross-attention (see the module docstring).

    Args:
        canvas_size: (H, W) of the canvases.
        dim, depth, num_heads, max_len: the text LM (a :class:`~gatepool.models.seq.DecoderLM` over the
            digit words).
        vision_channels: the canvas encoder's widths (its last is the vision tokens' width).
    """

    def __init__(self, *, canvas_size: tuple[int, int] = (28, 84), dim: int = 64, depth: int = 2,
                 num_heads: int = 4, max_len: int = 8,
                 vision_channels: tuple[int, ...] = (16, 32, 64)) -> None:  # fmt: skip
        super().__init__()
        self.max_len, self.canvas_size = max_len, tuple(canvas_size)
        self.lm = DecoderLM(vocab_size=VOCAB_SIZE, max_len=max_len, dim=dim, depth=depth, num_heads=num_heads,
                            mlp="gelu", mlp_ratio=2.0)  # fmt: skip
        self.vision = CanvasEncoder(*self.canvas_size, tuple(vision_channels))
        self.xattn = nn.ModuleList(GatedCrossAttentionBlock(dim, self.vision.dim, num_heads)
                                   for _ in range(depth))  # fmt: skip

    def freeze_lm(self) -> Flamingo:
        """Freeze the text LM (Flamingo trains only the vision side and the gated layers)."""
        for p in self.lm.parameters():
            p.requires_grad_(False)
        return self

    def forward(self, ids: torch.Tensor, canvas: torch.Tensor) -> torch.Tensor:
        """Caption ids (B, T) and canvases (B, 1, H, W) → next-token logits (B, T, V)."""
        if ids.ndim != 2 or canvas.ndim != 4 or canvas.shape[0] != ids.shape[0]:
            raise ValueError(f"need ids (B, T) and canvases (B, 1, H, W), got {tuple(ids.shape)} and "
                             f"{tuple(canvas.shape)}")  # fmt: skip
        if tuple(canvas.shape[1:]) != (1, *self.canvas_size):
            raise ValueError(f"canvas must be (B, 1, {self.canvas_size[0]}, {self.canvas_size[1]}), got "
                             f"{tuple(canvas.shape)}")  # fmt: skip
        vision = self.vision(canvas)  # (B, M, Dv)
        h = self.lm.pos_embedding(self.lm.embed(ids))  # (B, T, D)
        for xattn, block in zip(self.xattn, self.lm.blocks.blocks):
            h = block(xattn(h, vision), is_causal=True)  # the gated layer, then the LM's block
        return self.lm.lm_head(self.lm.blocks.norm(h))  # (B, T, V)

    @torch.no_grad()
    def generate(self, canvas: torch.Tensor, max_new: int | None = None) -> torch.Tensor:
        """Greedy captions of canvases (B, 1, H, W): (B, max_len) ids from BOS, PAD after each EOS."""
        b = canvas.shape[0]
        steps = (self.max_len - 1) if max_new is None else max_new
        ids = torch.full((b, 1), BOS, dtype=torch.long, device=canvas.device)
        done = torch.zeros(b, dtype=torch.bool, device=canvas.device)
        for _ in range(steps):
            nxt = self(ids, canvas)[:, -1].argmax(-1)  # (B,)
            nxt = nxt.masked_fill(done, PAD)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            done |= nxt == EOS
            if bool(done.all()):
                break
        return ids


@register_model("flamingo")
def flamingo(**kwargs) -> Flamingo:
    """A Flamingo-style captioner for digit canvases (see :class:`Flamingo`)."""
    return Flamingo(**kwargs)
