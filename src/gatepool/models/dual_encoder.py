"""Dual encoder (CLIP, SigLIP): two separate towers, each pooled into one normalized embedding.

    image tower   ViT (CLS pooled; its head LayerNorm → Linear is the projection)   (B, 1, H, W) → (B, E)
    text tower    tokens + positions → causal Encoder → the EOS token → Linear      (B, T) → (B, E)
    e_I, e_T      L2-normalized embeddings; similarity s_ij = ⟨e_I,i, e_T,j⟩ ∈ [−1, 1]

Losses over a batch of B matched pairs (pair i is image i with caption i):

* ``"clip"`` (InfoNCE, symmetric): ``z = exp(τ) · S``;
  ``L = ½ [CE(z, diag) + CE(zᵀ, diag)]``: each image picks its caption among B, and each caption its image.
  τ is learned, initialised at log(1/0.07) and clamped at log 100 (CLIP's).
* ``"siglip"`` (sigmoid): ``z = exp(τ) · S + b``; every pair is its own binary question,
  ``L = −(1/B) Σ_ij log σ(y_ij z_ij)`` with y = +1 on the diagonal, −1 off it; τ initialised at log 10,
  b at −10 (SigLIP's).

The towers share nothing: the text embedding is a function of the text alone, the image embedding of the
image alone; only the loss couples them. Zero-shot classification embeds the ten prompts once and gives
each image the class of its most similar prompt.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers.blocks import Encoder
from gatepool.layers.positional import LearnedPositionalEmbedding1d
from gatepool.models.digit_text import EOS, PROMPTS, VOCAB_SIZE, DigitTokenizer
from gatepool.models.registry import register_model
from gatepool.models.vit import ViT
from gatepool.utils.checks import check_int

__all__ = ["LOSSES", "DualEncoder", "TextEncoder"]

LOSSES = ("clip", "siglip")


class TextEncoder(nn.Module):
    """CLIP's text transformer in miniature: token + learned position embedding → causal Encoder.

    ``forward`` returns every token's feature (B, T, D) (what a UNet cross-attends to); ``pool`` reads
    the EOS token's feature (B, D), which under the causal mask has seen the whole caption and nothing
    after it (the padding).
    """

    def __init__(self, *, vocab_size: int = VOCAB_SIZE, max_len: int = 8, dim: int = 64, depth: int = 2,
                 num_heads: int = 4, mlp_ratio: float = 2.0) -> None:  # fmt: skip
        super().__init__()
        check_int(max_len, "max_len", 3)
        self.max_len, self.dim = max_len, dim
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos_embedding = LearnedPositionalEmbedding1d(max_len, dim)
        self.encoder = Encoder(dim, depth, num_heads, mlp="gelu", mlp_ratio=mlp_ratio)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) → features (B, T, D); position t sees tokens ≤ t."""
        if ids.ndim != 2 or ids.shape[1] > self.max_len:
            raise ValueError(f"ids must be (B, T ≤ {self.max_len}) token ids, got {tuple(ids.shape)}")
        return self.encoder(self.pos_embedding(self.embed(ids)), is_causal=True)

    @staticmethod
    def pool(ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The feature at each caption's first EOS: (B, T), (B, T, D) → (B, D)."""
        is_eos = ids == EOS
        if not bool(is_eos.any(dim=1).all()):
            raise ValueError("every caption needs an EOS token (DigitTokenizer.encode adds it)")
        where = is_eos.int().argmax(dim=1)  # (B,) the first EOS
        return tokens[torch.arange(ids.shape[0], device=ids.device), where]


class DualEncoder(nn.Module):
    """CLIP / SigLIP in miniature: ``encode_image``, ``encode_text``, ``forward`` (the logits), ``loss``.

    Args:
        image_size, patch_size, dim, depth, num_heads: the image tower (a :class:`~gatepool.models.vit.ViT`
            on 1-channel images, CLS pooled, its head projecting to ``embed_dim``).
        text_dim, text_depth, text_heads, max_len: the text tower (:class:`TextEncoder`).
        embed_dim: E, the shared embedding width.
        loss: ``"clip"`` (symmetric InfoNCE) or ``"siglip"`` (pairwise sigmoid).
    """

    def __init__(self, *, image_size: int = 28, patch_size: int = 7, dim: int = 48, depth: int = 2,
                 num_heads: int = 4, text_dim: int = 48, text_depth: int = 2, text_heads: int = 4,
                 max_len: int = 8, embed_dim: int = 32, loss: str = "clip") -> None:  # fmt: skip
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        check_int(embed_dim, "embed_dim", 1)
        self.loss_kind, self.embed_dim, self.max_len = loss, embed_dim, max_len
        self.image_tower = ViT(image_size=image_size, patch_size=patch_size, in_channels=1, dim=dim,
                               depth=depth, num_heads=num_heads, num_classes=embed_dim, pool="cls",
                               mlp="gelu", mlp_ratio=2.0)  # fmt: skip
        self.text_tower = TextEncoder(max_len=max_len, dim=text_dim, depth=text_depth, num_heads=text_heads)
        self.text_proj = nn.Linear(text_dim, embed_dim, bias=False)
        init_scale, init_bias = (math.log(1 / 0.07), 0.0) if loss == "clip" else (math.log(10.0), -10.0)
        self.logit_scale = nn.Parameter(torch.tensor(init_scale))
        self.logit_bias = nn.Parameter(torch.tensor(init_bias)) if loss == "siglip" else None

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 1, H, W) → unit vectors (B, E)."""
        return F.normalize(self.image_tower(images), dim=-1)

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids → unit vectors (B, E)."""
        tokens = self.text_tower(ids)  # (B, T, D)
        return F.normalize(self.text_proj(self.text_tower.pool(ids, tokens)), dim=-1)

    def scale(self) -> torch.Tensor:
        """exp(τ), the temperature's inverse, clamped at 100."""
        return self.logit_scale.clamp(max=math.log(100.0)).exp()

    def logits(self, e_img: torch.Tensor, e_txt: torch.Tensor) -> torch.Tensor:
        """(B, E), (B', E) → (B, B'): exp(τ) ⟨e_I, e_T⟩ (+ b for SigLIP)."""
        z = self.scale() * e_img @ e_txt.T
        return z + self.logit_bias if self.logit_bias is not None else z

    def forward(self, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Images (B, 1, H, W) and captions (B', T) → image-to-text logits (B, B')."""
        return self.logits(self.encode_image(images), self.encode_text(ids))

    def loss(self, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The batch's contrastive loss; pair i = (images[i], ids[i])."""
        if images.shape[0] != ids.shape[0]:
            raise ValueError(f"need as many captions as images, got {ids.shape[0]} and {images.shape[0]}")
        z = self(images, ids)  # (B, B)
        b = z.shape[0]
        if self.loss_kind == "clip":
            target = torch.arange(b, device=z.device)
            return 0.5 * (F.cross_entropy(z, target) + F.cross_entropy(z.T, target))
        y = 2 * torch.eye(b, device=z.device) - 1  # +1 matched, −1 not
        return -F.logsigmoid(y * z).sum() / b

    @torch.no_grad()
    def zero_shot(self, images: torch.Tensor, prompts: tuple[str, ...] = PROMPTS
                  ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Each image's class = its most similar prompt: predictions (B,), similarities (B, P)."""
        ids = DigitTokenizer(self.max_len).encode(list(prompts))
        sim = self.encode_image(images) @ self.encode_text(ids.to(images.device)).T  # (B, P)
        return sim.argmax(dim=1), sim


@register_model("dual_encoder")
def dual_encoder(**kwargs) -> DualEncoder:
    """A CLIP-style dual encoder for digits and digit words (see :class:`DualEncoder`)."""
    return DualEncoder(**kwargs)
