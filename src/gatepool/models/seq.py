"""Two transformers on toy sequence tasks: a decoder-only causal LM and an encoder–decoder.

Tasks on sequences of L digits (0–9): ``copy`` (y = x), ``reverse`` (y = x backwards), ``sort``
(y = x sorted). Token 10 is the separator / begin-of-output token ``SEP``.

Decoder-only (GPT): one causal stack reads ``x_1 … x_L SEP y_1 … y_(L−1)`` and is trained to predict
the next token at the last L positions (``y_1 … y_L``); the causal mask keeps output i independent of
tokens after i, so one forward pass trains every position at once (teacher forcing)::

    p(y_t | x, y_<t) = softmax(W_out · Encoder_causal(E[tokens] + P)[L + t − 1])

Encoder–decoder (the original transformer): an encoder reads x with full self-attention; a decoder reads
``SEP y_1 … y_(L−1)`` with masked self-attention and cross-attends to the encoder's output.

Both decode greedily at test time (one token per forward pass); token accuracy is measured on those
greedy outputs for a held-out set, never on teacher-forced predictions. Training is
``gatepool.train.seq.train_seq_demo`` (the one trainer with a batch function and this file's ``loss``):
either model reaches ≥ 99 % token accuracy in well under two minutes on two CPU cores.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers.blocks import Decoder, Encoder
from gatepool.layers.positional import LearnedPositionalEmbedding1d
from gatepool.models.registry import register_model
from gatepool.utils.checks import check_int

__all__ = [
    "ARCHS",
    "SEP",
    "TASKS",
    "VOCAB_SIZE",
    "DecoderLM",
    "EncoderDecoder",
    "make_task_batch",
]

TASKS = ("copy", "reverse", "sort")
ARCHS = ("decoder", "encoder-decoder")
SEP = 10  # separator / begin-of-output token
VOCAB_SIZE = 11


def make_task_batch(
    task: str, batch_size: int, length: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random digit sequences x (B, L) and their targets y (B, L) for ``task`` in copy | reverse | sort."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    check_int(batch_size, "batch_size")
    check_int(length, "length")
    x = torch.randint(0, 10, (batch_size, length), generator=generator)
    if task == "copy":
        y = x.clone()
    elif task == "reverse":
        y = x.flip(1)
    else:
        y = x.sort(dim=1).values
    return x, y


class DecoderLM(nn.Module):
    """Decoder-only causal LM: token + learned position embedding → causal Encoder stack → Linear."""

    def __init__(
        self,
        *,
        vocab_size: int = VOCAB_SIZE,
        max_len: int = 64,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp: str = "gelu",
        mlp_ratio: float = 4.0,
        norm: str = "layer",
    ) -> None:
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos_embedding = LearnedPositionalEmbedding1d(max_len, dim)
        self.blocks = Encoder(dim, depth, num_heads, mlp=mlp, mlp_ratio=mlp_ratio, norm=norm)
        self.lm_head = nn.Linear(dim, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Tokens (B, T) → next-token logits (B, T, V); position t sees tokens ≤ t only."""
        if idx.ndim != 2:
            raise ValueError(f"idx must be (B, T) token ids, got {tuple(idx.shape)}")
        h = self.pos_embedding(self.embed(idx))  # (B, T, D)
        return self.lm_head(self.blocks(h, is_causal=True))  # (B, T, V)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced cross-entropy on the L output positions; also returns their logits (B, L, V)."""
        sep = torch.full_like(x[:, :1], SEP)
        logits = self(torch.cat([x, sep, y[:, :-1]], dim=1))[:, x.shape[1] :]  # (B, L, V)
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), y.reshape(-1)), logits

    @torch.no_grad()
    def generate(self, x: torch.Tensor, length: int) -> torch.Tensor:
        """Greedy: ``length`` tokens after ``x SEP``; (B, L) → (B, length)."""
        seq = torch.cat([x, torch.full_like(x[:, :1], SEP)], dim=1)
        for _ in range(length):
            nxt = self(seq)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            seq = torch.cat([seq, nxt], dim=1)
        return seq[:, -length:]


class EncoderDecoder(nn.Module):
    """Encoder over the input, causal decoder with cross-attention over the encoder's output."""

    def __init__(
        self,
        *,
        vocab_size: int = VOCAB_SIZE,
        max_len: int = 64,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp: str = "gelu",
        mlp_ratio: float = 4.0,
        norm: str = "layer",
    ) -> None:
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        block = dict(mlp=mlp, mlp_ratio=mlp_ratio, norm=norm)
        self.src_embed = nn.Embedding(vocab_size, dim)
        self.src_pos = LearnedPositionalEmbedding1d(max_len, dim)
        self.encoder = Encoder(dim, depth, num_heads, **block)
        self.tgt_embed = nn.Embedding(vocab_size, dim)
        self.tgt_pos = LearnedPositionalEmbedding1d(max_len, dim)
        self.decoder = Decoder(dim, depth, num_heads, **block)
        self.lm_head = nn.Linear(dim, vocab_size)

    def encode(self, src: torch.Tensor) -> torch.Tensor:  # (B, M) -> (B, M, D)
        if src.ndim != 2:
            raise ValueError(f"src must be (B, M) token ids, got {tuple(src.shape)}")
        return self.encoder(self.src_pos(self.src_embed(src)))

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:  # (B, N) -> (B, N, V)
        if tgt_in.ndim != 2:
            raise ValueError(f"tgt_in must be (B, N) token ids, got {tuple(tgt_in.shape)}")
        h = self.tgt_pos(self.tgt_embed(tgt_in))
        return self.lm_head(self.decoder(h, memory, is_causal=True))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, M), decoder input (B, N) → logits (B, N, V)."""
        return self.decode(tgt_in, self.encode(src))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced cross-entropy; also returns the logits (B, L, V)."""
        tgt_in = torch.cat([torch.full_like(y[:, :1], SEP), y[:, :-1]], dim=1)
        logits = self(x, tgt_in)
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), y.reshape(-1)), logits

    @torch.no_grad()
    def generate(self, x: torch.Tensor, length: int) -> torch.Tensor:
        """Greedy: (B, M) → (B, length); the encoder runs once."""
        memory = self.encode(x)
        seq = torch.full_like(x[:, :1], SEP)
        for _ in range(length):
            nxt = self.decode(seq, memory)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
        return seq[:, 1:]


@register_model("seq_decoder")
def seq_decoder(**kwargs) -> DecoderLM:
    """Decoder-only causal LM for the digit tasks (see :class:`DecoderLM`)."""
    return DecoderLM(**kwargs)


@register_model("seq_encoder_decoder")
def seq_encoder_decoder(**kwargs) -> EncoderDecoder:
    """Encoder–decoder transformer for the digit tasks (see :class:`EncoderDecoder`)."""
    return EncoderDecoder(**kwargs)
