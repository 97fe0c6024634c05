"""Bad input: a ValueError (TypeError for a wrong type) that names the argument and the allowed range."""

from __future__ import annotations

import pytest
import torch

from gatepool.layers import (
    GATES,
    GatedPool1d,
    GatedPool2d,
    GatedPool3d,
    SoftPool2d,
    create_pool,
    soft_pool2d,
    soft_pool3d,
)

X = torch.randn(2, 3, 6, 6)


@pytest.mark.parametrize("shape", [(6,), (6, 6), (1, 2, 3, 6, 6)])
def test_wrong_ndim(shape):
    with pytest.raises(ValueError, match=r"input must be 4-D \(N, C, \*spatial\) or 3-D"):
        soft_pool2d(torch.randn(shape), 2)
    with pytest.raises(ValueError, match="input must be"):
        GatedPool2d(2, gate="max")(torch.randn(shape))


def test_wrong_ndim_other_dims():
    with pytest.raises(ValueError, match="input must be 3-D"):
        GatedPool1d(2, gate="avg")(torch.randn(3, 4, 5, 6))
    with pytest.raises(ValueError, match="input must be 5-D"):
        GatedPool3d(2, gate="soft")(torch.randn(6, 6))


def test_not_a_float_tensor():
    with pytest.raises(TypeError, match="floating-point"):
        soft_pool2d(torch.ones(1, 1, 4, 4, dtype=torch.long), 2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        soft_pool2d([[1.0, 2.0]], 2)


@pytest.mark.parametrize("kernel_size,padding", [(7, 0), (9, 1), ((2, 7), 0)])
def test_kernel_larger_than_padded_input(kernel_size, padding):
    with pytest.raises(ValueError, match="kernel_size .* larger than the padded input"):
        soft_pool2d(X, kernel_size, padding=padding)
    with pytest.raises(ValueError, match="larger than the padded input"):
        GatedPool2d(kernel_size, padding=padding, gate="max")(X)


@pytest.mark.parametrize("kernel_size", [0, -1, (2, 0)])
def test_kernel_not_positive(kernel_size):
    with pytest.raises(ValueError, match="kernel_size must be ≥ 1"):
        soft_pool2d(X, kernel_size)
    with pytest.raises(ValueError, match="kernel_size must be ≥ 1"):
        GatedPool2d(kernel_size, gate="avg")


@pytest.mark.parametrize("stride", [0, -2, (1, 0)])
def test_stride_not_positive(stride):
    with pytest.raises(ValueError, match="stride must be ≥ 1"):
        soft_pool2d(X, 2, stride)
    with pytest.raises(ValueError, match="stride must be ≥ 1"):
        create_pool("soft", 2, stride)


@pytest.mark.parametrize("kernel_size,padding", [(2, 2), (3, 2), (3, -1), (4, (1, 3))])
def test_padding_out_of_range(kernel_size, padding):
    with pytest.raises(ValueError, match=r"padding must be in \[0, kernel_size / 2\]"):
        soft_pool2d(X, kernel_size, padding=padding)
    with pytest.raises(ValueError, match="padding must be in"):
        GatedPool2d(kernel_size, padding=padding, gate="max")


@pytest.mark.parametrize("value", [(2, 2, 2), "2", 2.0, (2.0, 2)])
def test_wrong_tuple(value):
    soft_pool2d(X, 2)  # the same geometry with ints, kept: 2.0 == 2 must not find it
    with pytest.raises(ValueError, match="kernel_size must be an int or a tuple of 2 ints"):
        soft_pool2d(X, value)


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("-inf")])
def test_temperature_not_positive(tau):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        soft_pool2d(X, 2, temperature=tau)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        GatedPool2d(2, gate="soft", temperature=tau)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        create_pool("soft-learned", 2, channels=3, temperature=tau)
    # a tensor τ is checked on the device (torch._assert_async: no host sync), which raises RuntimeError
    with pytest.raises(RuntimeError, match="temperature must be > 0"):
        soft_pool2d(X, 2, temperature=torch.tensor([1.0, tau, 1.0]))


def test_temperature_wrong_shape_or_type():
    with pytest.raises(ValueError, match=r"shape \(\) or \(C,\)"):
        soft_pool2d(X, 2, temperature=torch.ones(2))
    with pytest.raises(ValueError, match=r"shape \(\) or \(C,\)"):
        soft_pool2d(X, 2, temperature=torch.ones(3, 1))
    with pytest.raises(TypeError, match="temperature must be a positive float"):
        soft_pool2d(X, 2, temperature="1")


@pytest.mark.parametrize("gate", ["max", "avg", "conv"])
def test_temperature_on_a_gate_without_one(gate):
    with pytest.raises(ValueError, match="temperature applies to the gates"):
        create_pool(gate, 2, channels=3, temperature=0.5)


@pytest.mark.parametrize("name", ["maxpool", "Soft", "", "lp"])
def test_unknown_gate_lists_the_names(name):
    for build in (lambda: create_pool(name, 2), lambda: GatedPool2d(2, gate=name, channels=3)):
        with pytest.raises(ValueError, match="unknown") as err:
            build()
        assert all(repr(g) in str(err.value) for g in GATES)


@pytest.mark.parametrize("gate", ["soft-learned", "attention", "conv"])
def test_channels_missing_for_a_gate_with_weights(gate):
    with pytest.raises(ValueError, match="pass channels=C"):
        create_pool(gate, 2)
    with pytest.raises(ValueError, match="pass channels=C"):
        GatedPool2d(2, gate=gate)


@pytest.mark.parametrize("channels", [0, -3, 2.5, True])
def test_channels_not_a_positive_int(channels):
    with pytest.raises(ValueError, match="channels must be an integer >= 1 or None"):
        create_pool("conv", 2, channels=channels)


def test_channels_mismatch_and_bad_dim():
    with pytest.raises(ValueError, match="channels=4"):
        create_pool("conv", 2, channels=4)(X)
    with pytest.raises(ValueError, match="dim must be 1, 2 or 3"):
        create_pool("max", 2, dim=4)


def test_errors_come_before_any_computation():
    """A bad argument is reported even when the input itself would make the computation fail."""
    x = torch.randn(1, 3, 4, 4, 4)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        soft_pool3d(x, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="padding must be in"):
        soft_pool3d(x[..., :1], 2, padding=2)  # a 1-wide input, and padding larger than half the kernel


@pytest.mark.parametrize("dilation", [0, -1, (1, 0)])
def test_dilation_not_positive(dilation):
    with pytest.raises(ValueError, match="dilation must be ≥ 1"):
        soft_pool2d(X, 2, dilation=dilation)
    with pytest.raises(ValueError, match="dilation must be ≥ 1"):
        GatedPool2d(2, dilation=dilation, gate="max")
    with pytest.raises(ValueError, match="dilation must be ≥ 1"):
        create_pool("max", 2, dilation=dilation)  # checked here, not at torch's first forward


def test_dilated_kernel_larger_than_padded_input():
    with pytest.raises(ValueError, match=r"dilation \(3, 3\) spans \(7, 7\), larger than the padded input"):
        GatedPool2d(3, dilation=3, gate="soft")(X)


def test_gate_is_keyword_only_and_required():
    """The torch-order signature: an old-style ``GatedPool2d("max", 2)`` fails loudly, not as kernel "max"."""
    with pytest.raises(TypeError, match="gate"):
        GatedPool2d(2)
    with pytest.raises(TypeError):
        GatedPool2d("max", 2)


@pytest.mark.parametrize("gate", ["avg", "soft", "soft-learned", "attention", "conv"])
def test_return_indices_is_for_max_only(gate):
    with pytest.raises(ValueError, match="return_indices applies to gate='max' only"):
        GatedPool2d(2, return_indices=True, gate=gate, channels=3)


@pytest.mark.parametrize("gate", ["max", "soft", "soft-learned", "attention", "conv"])
def test_count_include_pad_is_for_avg_only(gate):
    with pytest.raises(ValueError, match="count_include_pad applies to gate='avg' only"):
        GatedPool2d(2, gate=gate, channels=3, count_include_pad=False)


def test_learn_temperature_needs_channels():
    with pytest.raises(ValueError, match="learn_temperature=True .* pass channels=C"):
        SoftPool2d(2, learn_temperature=True)


@pytest.mark.parametrize("shape", [(2, 0, 6, 6), (2, 3, 0, 6), (2, 3, 6, 0), (0, 6, 6)])
def test_empty_channels_or_space_raise_as_torch(shape):
    """Only the batch may be empty (torch's rule): no channels or a zero-size spatial dimension raises."""
    x = torch.randn(shape)
    with pytest.raises(RuntimeError):
        torch.nn.functional.max_pool2d(x, 2)  # torch refuses it too
    with pytest.raises(ValueError, match="only the batch may be empty"):
        soft_pool2d(x, 2)
    for gate in GATES if x.shape[-3] else ["max", "avg", "soft"]:  # gates with weights need channels ≥ 1
        with pytest.raises(ValueError, match="only the batch may be empty"):
            GatedPool2d(2, gate=gate, channels=x.shape[-3] or None)(x)


def test_one_element_tuple_is_repeated_as_torch():
    x = torch.randn(1, 2, 7, 7)
    want = torch.nn.functional.max_pool2d(x, (3,), (2,), (1,))  # torch reads (3,) as (3, 3)
    assert torch.equal(GatedPool2d((3,), (2,), (1,), gate="max")(x), want)
    torch.testing.assert_close(soft_pool2d(x, (3,), (2,), (1,)), soft_pool2d(x, 3, 2, 1))
