"""Positional encodings against their formulas written out here."""

from __future__ import annotations

import math

import pytest
import torch

from gatepool.layers.positional import (
    LearnedPositionalEmbedding1d,
    LearnedPositionalEmbedding2d,
    SinusoidalPositionalEncoding1d,
    sinusoidal_encoding,
)


@pytest.mark.parametrize("dim", [8, 7])
def test_sinusoidal_formula(dim):
    table = sinusoidal_encoding(12, dim)
    assert table.shape == (12, dim)
    for pos in (0, 1, 5, 11):
        for i in range(dim):
            angle = pos / 10000 ** (2 * (i // 2) / dim)
            want = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert table[pos, i].item() == pytest.approx(want, abs=1e-6)
    x = torch.randn(2, 5, dim)
    torch.testing.assert_close(SinusoidalPositionalEncoding1d(dim)(x), x + table[:5])


def test_learned_1d_adds_one_vector_per_position():
    pe = LearnedPositionalEmbedding1d(6, 4)
    x = torch.randn(3, 5, 4)
    out = pe(x)
    for t in range(5):
        torch.testing.assert_close(out[:, t], x[:, t] + pe.weight[t])
    out.sum().backward()
    assert (pe.weight.grad[:5] == 3).all() and (pe.weight.grad[5] == 0).all()
    with pytest.raises(ValueError, match="num_positions"):
        pe(torch.randn(1, 7, 4))
    with pytest.raises(ValueError, match="x must have shape"):
        pe(torch.randn(1, 5, 3))


def test_learned_2d_is_rows_plus_columns_row_major():
    pe = LearnedPositionalEmbedding2d(3, 4, 5)
    x = torch.randn(2, 12, 5)
    out = pe(x)
    for r in range(3):
        for c in range(4):
            torch.testing.assert_close(out[:, r * 4 + c], x[:, r * 4 + c] + pe.rows[r] + pe.cols[c])
    with pytest.raises(ValueError, match="3×4"):
        pe(torch.randn(2, 11, 5))
    with pytest.raises(ValueError, match="height"):
        LearnedPositionalEmbedding2d(0, 4, 5)


def test_sinusoidal_too_long_raises():
    with pytest.raises(ValueError, match="max_len"):
        SinusoidalPositionalEncoding1d(4, max_len=3)(torch.randn(1, 4, 4))
