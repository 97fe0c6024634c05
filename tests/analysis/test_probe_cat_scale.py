"""Concatenation along channels and products with a constant against Monte Carlo, as the other correlated
rules: Gaussian fields of known correlation (``gaussian_field``) through torch's own ops."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import DT, _ramp, assert_walk_holds, close, gaussian_field

from gatepool.analysis.probe import correlated as cr


def _channel_var(C, H, W, lo, hi):
    """A variance map that differs by channel (lo … hi) and along the map: a wrong channel order shows."""
    return torch.linspace(lo, hi, C, dtype=DT)[:, None, None] * _ramp(C, H, W, 0.5, 1.5)


def test_cat_forward_and_backward_match_monte_carlo():
    mean_a, var_a = _ramp(2, 10, 10, -1.0, 2.0), _channel_var(2, 10, 10, 3.0, 4.0)
    xa, fa = gaussian_field(C=2, mean=mean_a, var=var_a, ell=1.6)
    xb, fb = gaussian_field(C=3, var=_channel_var(3, 10, 10, 0.2, 0.5), ell=0.6, seed=1)
    rule = cr.Cat()
    xa, xb = xa.requires_grad_(), xb.requires_grad_()
    y = torch.cat([xa, xb], dim=1)
    close(rule.forward([fa, fb]), y.detach(), rel=0.02, corr=0.01)
    g, gf = gaussian_field(C=5, var=_channel_var(5, 10, 10, 0.3, 3.0), ell=1.2, seed=2)
    (y * g).sum().backward()
    ga, gb = rule.backward(gf)
    close(ga, xa.grad, rel=0.02, corr=0.01)
    close(gb, xb.grad, rel=0.02, corr=0.01)


def test_cat_refuses_what_it_cannot_stack():
    rule = cr.Cat()
    with pytest.raises(ValueError, match="xs must"):
        rule.forward([])
    with pytest.raises(ValueError, match="map size"):
        rule.forward([gaussian_field(H=10, batch=1)[1], gaussian_field(H=8, batch=1)[1]])
    rule.forward([gaussian_field(C=2, batch=1)[1]] * 2)
    with pytest.raises(ValueError, match="g must have 4"):
        rule.backward(gaussian_field(C=3, batch=1)[1])


@pytest.mark.parametrize(
    "s",
    [
        torch.tensor([-2.5, 0.4], dtype=DT)[:, None, None],  # layer scale γ (C, 1, 1), one sign flipped
        # a map whose sign alternates along H: the lags it spans flip
        (-1.0) ** torch.arange(10, dtype=DT)[None, :, None] * _ramp(1, 10, 10, 0.5, 2.0),
        1 / 3,  # a divide by a number
    ],
    ids=["layer-scale", "map", "number"],
)
def test_scale_forward_and_backward_match_monte_carlo(s):
    x, field = gaussian_field(mean=_ramp(2, 10, 10, -1.0, 2.0), var=_ramp(2, 10, 10, 0.5, 2.0), ell=1.5)
    rule = cr.Scale(s)
    xr = x.clone().requires_grad_()
    y = xr * s
    close(rule.forward(field), y.detach(), rel=0.02, corr=0.01)
    g, gf = gaussian_field(seed=2, ell=1.2, var=_ramp(2, 10, 10, 0.3, 3.0))
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.01)


def test_scale_refuses_a_factor_that_does_not_fit():
    with pytest.raises(ValueError, match="s must broadcast"):
        cr.Scale(torch.ones(3, 1, 1)).forward(gaussian_field(C=2, batch=1)[1])
    with pytest.raises(ValueError, match="s must be finite"):
        cr.Scale(float("inf"))


def _channel_shuffle(x, groups: int):
    """torchvision's ShuffleNetV2 shuffle, as written there."""
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, num_channels, height, width)


class _Branches(torch.nn.Module):
    """A stem, two conv branches of unequal widths concatenated along channels, shuffled twice
    (``nn.ChannelShuffle`` and torchvision's view-transpose-view), a conv, two layer scales (a parameter
    (C, 1, 1), and a (C,) one viewed so by ``.view``), a divide by a number, a cat of one tensor along
    dim −3, the pooled features times a number, the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(4, 24, 3, padding=1)
        self.relu_s = torch.nn.ReLU()
        self.a = torch.nn.Conv2d(24, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(24, 16, 1)
        self.shuffle = torch.nn.ChannelShuffle(3)
        self.mix = torch.nn.Conv2d(24, 24, 3, padding=1)
        with torch.no_grad():  # the cat's two parts get gradients of different sizes: a wrong split shows
            self.mix.weight[:, :8] *= 3
        self.gamma = torch.nn.Parameter(torch.linspace(-2.0, 3.0, 24)[:, None, None])
        self.gamma2 = torch.nn.Parameter(torch.linspace(0.5, 1.5, 24))
        self.relu = torch.nn.ReLU()
        self.fc = torch.nn.Linear(24, 10)

    def forward(self, x):
        x = self.relu_s(self.stem(x))
        x = _channel_shuffle(self.shuffle(torch.cat([self.a(x), self.b(x)], dim=1)), 2)
        x = self.relu(self.mix(x) * self.gamma)
        x = torch.cat((x.mul(self.gamma2.view(-1, 1, 1)) / 2,), dim=-3)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1) * 3.0)


@pytest.mark.slow
def test_the_walk_carries_cat_and_layer_scale_forward_and_backward():
    """Every module of :class:`_Branches` predicted, forward within 10% and backward within 15% of its
    measurement (512 noise images, ∂L/∂logits ~ N(0, 1)), the two branches' gradients split off the cat's.
    At seed 0 (torch 2.13.0, CPU) the ratios are 0.997–1.074 forward and 0.964–1.033 backward; at seeds 1
    and 2 the stem's backward is 1.10 and 1.22 (its two branches' gradients, summed as independent, are
    not quite so at width 24), the rest within 0.89–1.11."""
    torch.manual_seed(0)
    model = _Branches().double()
    x = torch.randn(512, 4, 10, 10, generator=torch.Generator().manual_seed(1), dtype=DT)
    names = ["stem", "relu_s", "a", "b", "shuffle", "mix", "relu", "fc"]
    pred = assert_walk_holds(model, x, names)
    assert pred["(input)"].grad is not None


def test_channel_shuffle_forward_and_backward_match_monte_carlo():
    """Each channel's state moves with it (channels of different means, variances and correlations)."""
    C = 6
    mean, var = _channel_var(C, 10, 10, -1.0, 2.0), _channel_var(C, 10, 10, 0.2, 3.0)
    x, field = gaussian_field(C=C, mean=mean, var=var, ell=0.5)
    field.corr[::2] = gaussian_field(C=C, ell=1.8, batch=1)[1].corr[::2]  # half the channels more correlated
    x[:, ::2] = gaussian_field(C=C, mean=field.mean, var=field.var, ell=1.8)[0][:, ::2]
    rule = cr.ChannelShuffle(3)
    xr = x.clone().requires_grad_()
    y = torch.nn.ChannelShuffle(3)(xr)
    close(rule.forward(field), y.detach(), rel=0.02, corr=0.01)
    g, gf = gaussian_field(C=C, var=_channel_var(C, 10, 10, 0.3, 3.0), ell=1.2, seed=2)
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.01)
    with pytest.raises(ValueError, match="groups must be"):
        cr.ChannelShuffle(0)


class _Shuffled(torch.nn.Module):
    """conv → a channel shuffle written one of four ways (or ``"none"``, or a view that is not one) → conv."""

    def __init__(self, how: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.how = how
        self.conv1 = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.module = torch.nn.ChannelShuffle(2)
        self.conv2 = torch.nn.Conv2d(6, 6, 3, padding=1)

    def forward(self, x):
        x = self.conv1(x)
        n, c, h, w = x.shape
        if self.how == "module":
            x = self.module(x)
        elif self.how == "torchvision":
            x = _channel_shuffle(x, 2)
        elif self.how == "permute":
            x = x.reshape(x.shape[0], 2, -1, h, w).permute(0, 2, 1, 3, 4).flatten(1, 2)
        elif self.how == "functional":
            x = torch.nn.functional.channel_shuffle(x, 2)
        elif self.how == "not-a-shuffle":
            x = x.view(n, 2, c // 2, h, w).transpose(1, 2).sum(1)
        return self.conv2(x)


def test_the_walk_recognises_a_channel_shuffle_only_whole():
    """The four ways of writing ShuffleNet's shuffle give the module's prediction, which differs from no
    shuffle; a view into groups that is not undone is left without a prediction where the groups are
    read (the sum over them: the view and transpose only regroup the map's positions and channels)."""
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    stats = cr.measure_input(torch.randn(64, 4, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT))

    def predict(how):  # conv2's field and conv1's gradient (through the shuffle's backward)
        pred = predict_correlated(_Shuffled(how).double(), stats)
        return pred["conv2"], pred["conv1"].grad

    out, grad = predict("module")
    for how in ("torchvision", "permute", "functional"):
        got, got_grad = predict(how)
        assert torch.allclose(got.field.var, out.field.var) and torch.allclose(got_grad.var, grad.var), how
    plain, plain_grad = predict("none")
    assert not torch.allclose(plain.field.var, out.field.var) and not torch.allclose(plain_grad.var, grad.var)
    refused = predict("not-a-shuffle")[0]
    assert refused.field is None and "sum of a map's regrouped" in refused.note, refused.note


class _Constants(torch.nn.Module):
    """A cat with a parameter (a class token's kind), and a product with a parameter changed in place."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.extra = torch.nn.Parameter(torch.ones(1, 2, 8, 8))
        self.count = torch.nn.Parameter(torch.ones(()), requires_grad=False)
        self.after_cat = torch.nn.Conv2d(8, 6, 1)
        self.after_mul = torch.nn.Identity()

    def forward(self, x):
        x = self.conv(x)
        return self.after_cat(torch.cat([x, self.extra], 1)) + self.after_mul(x * self.count.add_(1))


def test_the_walk_leaves_what_is_not_a_field_or_would_change_the_model():
    """A cat that includes a parameter is not a stack of fields: no prediction; an in-place op on a
    parameter is never evaluated (the parameter keeps its value), and what uses it has no prediction."""
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    model = _Constants().double()
    stats = cr.measure_input(torch.randn(64, 4, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT))
    pred = predict_correlated(model, stats)
    assert pred["conv"].field is not None
    assert pred["after_cat"].field is None and "not all fields" in pred["after_cat"].note
    assert pred["after_mul"].field is None and "add_" in pred["after_mul"].note
    assert float(model.count) == 1.0
