"""Token formats: a feature map read as a sequence of tokens, and tokens averaged back to one vector.

    Tokens       (B, C, H, W) → (B, H·W, C)    row-major: token r·W + c is position (r, c)
    MeanTokens   (B, T, C)    → (B, C)         global average pool over the tokens
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["MeanTokens", "Tokens"]


class Tokens(nn.Module):
    """(B, C, H, W) feature map → (B, H·W, C) tokens, row-major (token index r·W + c)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4:
            raise ValueError(f"x must be a feature map (B, C, H, W), got {tuple(x.shape)}")
        return x.flatten(2).transpose(1, 2)  # (B, C, H·W) -> (B, H·W, C)


class MeanTokens(nn.Module):
    """(B, T, C) → (B, C): global average pool over tokens."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 3:
            raise ValueError(f"x must be tokens (B, T, C), got {tuple(x.shape)}")
        return x.mean(dim=1)
