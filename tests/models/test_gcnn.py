"""p4 group convolutions: each layer's equivariance, the P4CNN's invariance, the plain CNN's lack of it."""

import pytest
import torch

from gatepool.models import create_model
from gatepool.models.gcnn import CohenWellingCNN, P4Conv2d, P4LiftConv2d, p4_max_pool2d, rotation_pool


def turn(x: torch.Tensor, k: int = 1) -> torch.Tensor:
    """k quarter turns of the last two (spatial) axes."""
    return torch.rot90(x, k, dims=(-2, -1))


def on_p4(y: torch.Tensor, k: int = 1) -> torch.Tensor:
    """How a p4 map (B, C, 4, H, W) moves when the input turns k quarter turns: each plane turns, the
    rotation axis shifts by k."""
    return torch.roll(turn(y, k), k, dims=2)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_lifting_and_group_convolutions_are_equivariant(k):
    torch.manual_seed(0)
    lift, conv = P4LiftConv2d(2, 3, 3, padding=1), P4Conv2d(3, 4, 5)
    x = torch.randn(2, 2, 13, 13)
    y = lift(x)
    assert y.shape == (2, 3, 4, 13, 13)
    torch.testing.assert_close(lift(turn(x, k)), on_p4(y, k), rtol=0, atol=1e-5)
    z = conv(y)
    assert z.shape == (2, 4, 4, 9, 9)
    torch.testing.assert_close(conv(on_p4(y, k)), on_p4(z, k), rtol=0, atol=1e-5)
    even = z[..., :8, :8]  # a 2×2 pool keeps the grid's centre on an even size
    torch.testing.assert_close(p4_max_pool2d(on_p4(even, k), 2), on_p4(p4_max_pool2d(even, 2), k))
    torch.testing.assert_close(rotation_pool(on_p4(z, k)), turn(rotation_pool(z), k))


def test_a_plain_convolution_is_not_equivariant():
    """The control for the test above: the same check on a plain Conv2d fails by far more than rounding."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 3, 3, padding=1)
    x = torch.randn(2, 2, 13, 13)
    assert (conv(turn(x)) - turn(conv(x))).abs().max() > 0.1


def _relative_change(model, x, k):
    with torch.no_grad():
        base, turned = model(x), model(turn(x, k))
    return ((turned - base).abs().max() / base.abs().max()).item()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_p4cnn_logits_are_invariant_to_quarter_turns_and_z2cnn_logits_are_not(k):
    torch.manual_seed(0)
    x = torch.randn(16, 1, 28, 28)
    p4, z2 = create_model("p4cnn"), create_model("z2cnn")
    for model in (p4, z2):  # trained-looking batch-norm statistics, not the identity at init
        model.train()
        with torch.no_grad():
            model(x + 0.5)
        model.eval()
    assert _relative_change(p4, x, k) < 1e-5  # float32 rounding
    assert _relative_change(z2, x, k) > 1e-2  # a clear margin: the test tells them apart
    p4.train()  # batch statistics of a batch and of its turned copy are the same
    assert _relative_change(p4, x, k) < 1e-5


def test_the_nets_shapes_and_parameter_counts():
    x = torch.randn(3, 1, 28, 28)
    p4, z2 = create_model("p4cnn"), create_model("z2cnn")
    assert p4(x).shape == z2(x).shape == (3, 10)
    assert sum(p.numel() for p in z2.parameters()) == 21630  # the numbers the docs give
    assert sum(p.numel() for p in p4.parameters()) == 24620
    # "the same width" by weights: a p4 layer of 10 maps holds as many as a plain one of 20
    assert p4.convs[3].weight.numel() == z2.convs[3].weight.numel() == 3600
    assert create_model("p4cnn", channels=4, num_classes=3)(x).shape == (3, 3)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="group"):
        CohenWellingCNN("p5")
    with pytest.raises(ValueError, match="channels"):
        create_model("p4cnn", channels=0)
    with pytest.raises(ValueError, match=r"P4Conv2d expects x of shape \(B, 3, 4, H, W\)"):
        P4Conv2d(3, 2, 3)(torch.randn(1, 2, 4, 8, 8))
