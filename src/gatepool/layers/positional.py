"""Positional encodings: what attention needs to know where a token is.

Attention without positions is permutation-equivariant: shuffle the tokens and the outputs shuffle the
same way (``attn(π x) = π attn(x)``), because every score ``q_i · k_j`` depends on contents only. To see
order, add a position vector to each token before the first layer, ``x_i ← x_i + p_i``:

* learned 1-D:     ``p_i`` is a trained vector per position (GPT, ViT);
* sinusoidal 1-D:  ``p_(i, 2k) = sin(i / 10000^(2k/D))``, ``p_(i, 2k+1) = cos(i / 10000^(2k/D))``
  (the original transformer; fixed, defined for any length);
* learned 2-D:     ``p_(r, c) = row_r + col_c`` for image tokens on an H × W grid, read row-major
  (token index ``r · W + c``): H + W vectors instead of H · W.

Each module takes tokens (B, T, D) and returns ``tokens + positions`` of the same shape.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from gatepool.utils.checks import check_int

__all__ = [
    "LearnedPositionalEmbedding1d",
    "LearnedPositionalEmbedding2d",
    "SinusoidalPositionalEncoding1d",
    "sinusoidal_encoding",
]


def _check_tokens(x: torch.Tensor, dim: int) -> None:
    if x.ndim != 3 or x.shape[-1] != dim:
        raise ValueError(f"x must have shape (B, T, {dim}), got {tuple(x.shape)}")


def sinusoidal_encoding(length: int, dim: int, *, base: float = 10000.0) -> torch.Tensor:
    """(length, dim) table: ``sin(i / base^(2k/dim))`` in even columns, ``cos`` in odd ones."""
    check_int(length, "length")
    check_int(dim, "dim")
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (T, 1)
    freq = torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (ceil(D/2),)
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table.float()


class LearnedPositionalEmbedding1d(nn.Module):
    """``x + p[:T]`` with a trained table ``p`` of ``num_positions`` vectors (init N(0, 0.02²))."""

    def __init__(self, num_positions: int, dim: int, *, std: float = 0.02) -> None:
        super().__init__()
        check_int(num_positions, "num_positions")
        check_int(dim, "dim")
        self.num_positions, self.dim = num_positions, dim
        self.weight = nn.Parameter(torch.randn(num_positions, dim) * std)  # (P, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        _check_tokens(x, self.dim)
        if x.shape[1] > self.num_positions:
            raise ValueError(f"sequence length {x.shape[1]} exceeds num_positions={self.num_positions}")
        return x + self.weight[: x.shape[1]]


class SinusoidalPositionalEncoding1d(nn.Module):
    """``x + sinusoidal_encoding(T, D)``; fixed (a buffer, not a parameter), up to ``max_len`` tokens."""

    def __init__(self, dim: int, *, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        self.dim, self.max_len = dim, max_len
        self.register_buffer("table", sinusoidal_encoding(max_len, dim, base=base), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        _check_tokens(x, self.dim)
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} exceeds max_len={self.max_len}")
        return x + self.table[: x.shape[1]].to(x.dtype)


class LearnedPositionalEmbedding2d(nn.Module):
    """``x + (row_r + col_c)`` for H × W image tokens in row-major order (T = H · W)."""

    def __init__(self, height: int, width: int, dim: int, *, std: float = 0.02) -> None:
        super().__init__()
        check_int(height, "height")
        check_int(width, "width")
        check_int(dim, "dim")
        self.height, self.width, self.dim = height, width, dim
        self.rows = nn.Parameter(torch.randn(height, dim) * std)  # (H, D)
        self.cols = nn.Parameter(torch.randn(width, dim) * std)  # (W, D)

    def embedding(self) -> torch.Tensor:
        """(H · W, D) position vectors, row-major."""
        return (self.rows[:, None, :] + self.cols[None, :, :]).reshape(self.height * self.width, self.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H·W, D) -> (B, H·W, D)
        _check_tokens(x, self.dim)
        if x.shape[1] != self.height * self.width:
            raise ValueError(
                f"x must hold {self.height}×{self.width} tokens (row-major), got {x.shape[1]}"
            )
        return x + self.embedding()
