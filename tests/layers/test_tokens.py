"""Token formats: a feature map as row-major tokens, and the mean over tokens."""

import pytest
import torch

from gatepool.layers.tokens import MeanTokens, Tokens


def test_tokens_are_row_major_positions():
    x = torch.randn(2, 3, 4, 5, requires_grad=True)  # (B, C, H, W)
    t = Tokens()(x)
    assert t.shape == (2, 20, 3)
    for r, c in [(0, 0), (1, 2), (3, 4)]:
        torch.testing.assert_close(t[:, r * 5 + c], x[:, :, r, c])
    torch.testing.assert_close(t, x.permute(0, 2, 3, 1).reshape(2, 20, 3))
    g = torch.randn(t.shape)
    torch.testing.assert_close(torch.autograd.grad(t, x, g)[0], g.reshape(2, 4, 5, 3).permute(0, 3, 1, 2))


def test_mean_tokens_is_the_global_average_pool():
    x = torch.randn(2, 3, 4, 5)
    want = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)  # (B, C)
    torch.testing.assert_close(MeanTokens()(Tokens()(x)), want)


def test_shape_errors_name_the_format():
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        Tokens()(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"\(B, T, C\)"):
        MeanTokens()(torch.randn(2, 3, 4, 5))
