"""The symmetry tester: transforms and inverses, and the lecture's claims measured with it.

Attention without positions is permutation-equivariant, a mean pool after it is invariant, a positional
encoding breaks both; a conv with circular padding is equivariant to cyclic shifts (zero padding is not).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.symmetry import (
    Compose,
    CyclicShift,
    Flip,
    PermuteTokens,
    Rotate90,
    assert_equivariant,
    assert_invariant,
    default_tolerance,
    equivariance_error,
    invariance_error,
)
from gatepool.layers.attention import MultiHeadAttention
from gatepool.layers.blocks import Encoder
from gatepool.layers.positional import LearnedPositionalEmbedding1d, SinusoidalPositionalEncoding1d

TRANSFORMS = {
    "permute-given": PermuteTokens([2, 0, 3, 1, 4, 5], dim=1),
    "permute-random": PermuteTokens(dim=2, seed=7),
    "shift": CyclicShift((1, -2), dims=(-2, -1)),
    "rot90": Rotate90(1),
    "rot270": Rotate90(3, dims=(1, 2)),
    "flip": Flip((-1, -2)),
    "compose": Compose(CyclicShift(2, dims=-1), Rotate90(1), PermuteTokens(dim=1, seed=1)),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_inverse_undoes_transform(name):
    t = TRANSFORMS[name]
    x = torch.randn(2, 6, 6, 6)
    y = t(x)
    assert not torch.equal(y, x)
    torch.testing.assert_close(t.inverse()(y), x, rtol=0, atol=0)
    torch.testing.assert_close(t(t.inverse()(x)), x, rtol=0, atol=0)


def test_transforms_do_what_they_say():
    x = torch.arange(2 * 4 * 3).reshape(2, 4, 3)
    perm = [3, 0, 2, 1]
    y = PermuteTokens(perm, dim=1)(x)
    for i, p in enumerate(perm):
        assert torch.equal(y[:, i], x[:, p])
    img = torch.arange(9).reshape(3, 3)
    assert CyclicShift((1, 0))(img)[1, 0] == img[0, 0]  # moves down by one, wrapping around
    # an int shift moves every one of the default dims (-2, -1): down and right by one
    assert torch.equal(CyclicShift(1)(img), torch.roll(img, (1, 1), (0, 1)))
    assert torch.equal(CyclicShift(-2, dims=(0, 1)).inverse()(img), torch.roll(img, (2, 2), (0, 1)))
    assert Rotate90(1)(img)[0, 0] == img[0, 2]  # counter-clockwise: the top-right corner comes top-left
    assert Flip(-1)(img)[0, 0] == img[0, 2]
    random = PermuteTokens(dim=0, seed=3)
    assert torch.equal(random.permutation(10), random.permutation(10))  # one permutation per length
    assert sorted(random.permutation(10).tolist()) == list(range(10))


def test_errors_and_tolerance():
    x = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="perm"):
        PermuteTokens([0, 0, 1])
    with pytest.raises(ValueError, match="perm"):
        PermuteTokens([1, 0, 2], dim=1)(x)  # length 3, dim 1 has 4
    with pytest.raises(ValueError, match="shifts"):
        CyclicShift((1, 2), dims=-1)
    with pytest.raises(ValueError, match="dims"):
        Rotate90(1, dims=(0,))
    with pytest.raises(TypeError, match="transform"):
        equivariance_error(torch.relu, x, "flip")
    assert default_tolerance(torch.ones(3, dtype=torch.float64)) < default_tolerance(torch.ones(3))
    assert default_tolerance(torch.ones(3)) < default_tolerance(torch.ones(3, dtype=torch.bfloat16))
    assert default_tolerance(torch.ones(3, dtype=torch.long)) == 0.0


def test_error_is_the_max_abs_difference():
    x = torch.randn(3, 5)
    fn = lambda t: t.cumsum(-1)  # noqa: E731
    t = Flip(-1)
    want = (fn(t(x)) - t(fn(x))).abs().max().item()
    assert equivariance_error(fn, x, t) == pytest.approx(want)
    assert invariance_error(fn, x, t) == pytest.approx((fn(t(x)) - fn(x)).abs().max().item())
    assert equivariance_error(torch.relu, x, t) == 0.0
    with pytest.raises(AssertionError, match="not equivariant"):
        assert_equivariant(fn, x, t)
    # out_transform: a sum over the last axis sends a shift of the input to no change of the output
    assert equivariance_error(lambda t: t.sum(-1), x, CyclicShift(2, -1), out_transform=lambda y: y) < 1e-6


def test_tuple_outputs_need_a_selector():
    attn = MultiHeadAttention(8, 2).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    t = PermuteTokens(dim=1, seed=0)
    fn = lambda x: attn(x, return_weights=True)  # noqa: E731
    with pytest.raises(TypeError, match="output="):
        equivariance_error(fn, x, t)
    assert equivariance_error(fn, x, t, output=0) < 1e-12
    # the gate matrix permutes along both its query and its key axis
    both = Compose(PermuteTokens(dim=2, seed=0), PermuteTokens(dim=3, seed=0))
    assert_equivariant(fn, x, t, out_transform=both, output=lambda r: r[1])


@pytest.mark.parametrize("output", [0, "out"])
def test_index_output_on_a_tensor_result_is_an_error(output):
    x = torch.randn(3, 4)
    double = lambda t: 2 * t  # noqa: E731  equivariant; output=0 would compare only row 0 of the batch
    with pytest.raises(TypeError, match="output="):
        equivariance_error(double, x, PermuteTokens(dim=0), output=output)
    with pytest.raises(TypeError, match="output="):
        assert_invariant(lambda t: t.sum(0), x, PermuteTokens(dim=0), output=output)
    assert equivariance_error(double, x, PermuteTokens(dim=0), output=lambda y: y[:, :2]) == 0.0


def test_attention_without_positions_is_permutation_equivariant_and_mean_pool_invariant():
    torch.manual_seed(0)
    x = torch.randn(2, 10, 16)
    shuffle = PermuteTokens(dim=1, seed=0)
    attn = MultiHeadAttention(16, 4).eval()
    err = assert_equivariant(attn, x, shuffle)
    assert err < 1e-5
    assert_invariant(lambda t: attn(t).mean(dim=1), x, shuffle)
    encoder = Encoder(16, 2, 4).eval()
    assert_equivariant(encoder, x, shuffle)
    assert_invariant(lambda t: encoder(t).mean(dim=1), x, shuffle)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_positional_encoding_breaks_equivariance(pos):
    torch.manual_seed(0)
    x = torch.randn(2, 10, 16)
    shuffle = PermuteTokens(dim=1, seed=0)
    encoder = Encoder(16, 2, 4).eval()
    if pos == "learned":
        p = LearnedPositionalEmbedding1d(10, 16, std=1.0)
    else:
        p = SinusoidalPositionalEncoding1d(16)
    with_pos = lambda t: encoder(p(t))  # noqa: E731
    assert equivariance_error(with_pos, x, shuffle) > 1e-2
    assert invariance_error(lambda t: with_pos(t).mean(dim=1), x, shuffle) > 1e-3
    with pytest.raises(AssertionError):
        assert_equivariant(with_pos, x, shuffle)


def test_conv_is_shift_equivariant_with_circular_padding_only():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12)
    shift = CyclicShift((3, -5), dims=(-2, -1))
    circular = nn.Conv2d(3, 4, 5, padding=2, padding_mode="circular")
    assert_equivariant(circular, x, shift)
    zeros = nn.Conv2d(3, 4, 5, padding=2)
    zeros.load_state_dict(circular.state_dict())
    assert equivariance_error(zeros, x, shift) > 1e-2
    # a 90° turn is a symmetry of a conv only when its kernel is turned too: not for a random kernel
    assert equivariance_error(circular, x, Rotate90(1)) > 1e-2
