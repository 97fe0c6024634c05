"""The rules the zoos stopped at, against Monte Carlo on Gaussian fields of known correlation as the other
correlated rules: a max pool in ceil mode (SqueezeNet, GoogLeNet), an adaptive average pool whose windows
overlap or repeat (AlexNet's and VGG's at 64 × 64), a channel split (ShuffleNetV2's ``x.chunk(2, 1)``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_probe_correlated import _ramp, assert_walk_holds, close, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated_predict import predict_correlated


@pytest.mark.parametrize("k, s, p, H", [(3, 2, 0, 10), (3, 2, 1, 10), (2, 2, 0, 9)])
def test_max_pool_in_ceil_mode_matches_monte_carlo(k, s, p, H):
    """The last window runs past the map's far edge: its taps there never win. 16000 draws: a tap that wins
    one draw in 40 (a window's centre) is won about 400 times (of 4000 draws, seed 0's won one such tap 74
    times where 108 are expected: 3.3 standard errors low, beyond the check's 5 for its E[g²])."""
    x, f = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), ell=1.2, batch=16000)
    rule = cr.MaxPool((k, k), (s, s), (p, p), samples=8192, ceil_mode=True)  # win rates to ±5%
    y = F.max_pool2d(x, k, s, p, ceil_mode=True)
    assert y.shape[-1] > F.max_pool2d(x, k, s, p).shape[-1]  # ceil mode adds a window here
    out = rule.forward(f)
    assert out.shape == y.shape[1:]
    close(out, y, rel=0.02, corr=0.03)
    g, gf = gaussian_field(H=y.shape[-2], W=y.shape[-1], seed=3, ell=1.0, batch=16000)
    xr = x.clone().requires_grad_(True)
    (F.max_pool2d(xr, k, s, p, ceil_mode=True) * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.03, corr=0.03)


@pytest.mark.parametrize("H, out", [(2, (7, 7)), (1, (6, 6)), (5, (3, 3)), (7, (4, 6))])
def test_adaptive_pool_with_uneven_or_repeated_windows_matches_monte_carlo(H, out):
    """Up (2 → 7: each input read by three or four outputs), from one position, and down with windows
    that overlap (5 → 3) or are uneven (7 → 4 × 6)."""
    x, f = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), var=_ramp(2, H, H, 0.5, 2.0), ell=1.2)
    rule = cr.AdaptiveAvgPool(out)
    xr = x.clone().requires_grad_(True)
    y = F.adaptive_avg_pool2d(xr, out)
    rel = 0.05 if H == 1 else 0.02  # one position repeated: the Monte Carlo variance of one value, ±2%
    close(rule.forward(f), y.detach(), rel=rel, corr=0.02)
    g, gf = gaussian_field(H=out[0], W=out[1], var=_ramp(2, *out, 0.3, 3.0), seed=3, ell=1.0)
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.02, lags=(1, 2) if H > 2 else (1,) if H > 1 else ())


def test_channel_slice_forward_and_backward_match_monte_carlo():
    """Channels 1 … 3 of five (each its own mean, variance and correlation); the gradient zero elsewhere."""
    C = 5
    var = torch.linspace(0.3, 3.0, C, dtype=torch.float64)[:, None, None] * _ramp(C, 10, 10, 0.5, 1.5)
    x, f = gaussian_field(C=C, mean=_ramp(C, 10, 10, -1.0, 2.0), var=var, ell=1.4)
    rule = cr.ChannelSlice(1, 4)
    xr = x.clone().requires_grad_(True)
    y = xr[:, 1:4]
    close(rule.forward(f), y.detach(), rel=0.02, corr=0.01)
    g, gf = gaussian_field(C=3, var=_ramp(3, 10, 10, 0.3, 3.0), ell=1.0, seed=2)
    (y * g).sum().backward()
    back = rule.backward(gf)
    assert float(back.var[[0, 4]].abs().max()) == 0.0 and float(xr.grad[:, [0, 4]].abs().max()) == 0.0
    close(cr.Field(back.mean[1:4], back.var[1:4], back.corr[1:4]), xr.grad[:, 1:4], rel=0.02, corr=0.01)
    with pytest.raises(ValueError, match="start and stop"):
        cr.ChannelSlice(3, 1)


class _SplitShuffle(torch.nn.Module):
    """ShuffleNetV2's unit (the channels chunked in two, one half through a branch, cat, shuffled), a
    GhostNet-like slice ``x[:, :c]`` of a cat (of two convs: GhostNet's second is computed from the
    first, whose channels the state then takes as uncorrelated), a ``split`` of uneven sections, the
    classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 48, 3, padding=1)
        self.relu = torch.nn.ReLU()
        nn = torch.nn
        self.branch = nn.Sequential(nn.Conv2d(24, 24, 1), nn.BatchNorm2d(24), nn.ReLU())
        self.shuffle = torch.nn.ChannelShuffle(2)
        self.ghost = torch.nn.Conv2d(48, 24, 3, padding=1)
        self.ghost2 = torch.nn.Conv2d(48, 24, 3, padding=1)
        self.mix = torch.nn.Conv2d(40, 48, 3, padding=1)
        self.fc = torch.nn.Linear(48, 10)

    def forward(self, x):
        x1, x2 = self.relu(self.stem(x)).chunk(2, dim=1)
        x = self.shuffle(torch.cat((x1, self.branch(x2)), dim=1))
        x = torch.cat([self.ghost(x), self.ghost2(x) * 0.5], dim=1)[:, :40]
        a, b = x.split([16, 24], dim=1)
        x = self.mix(torch.cat([b, a], 1))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def test_the_walk_carries_splits_and_slices_forward_and_backward():
    torch.manual_seed(0)
    model = _SplitShuffle().double()
    x = torch.randn(512, 3, 10, 10, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    names = ["stem", "relu", "branch.0", "branch.2", "shuffle", "ghost", "ghost2", "mix", "fc"]
    assert_walk_holds(model, x, names)  # seed 0: 0.96–1.01 forward, 0.91–1.07 backward (CPU, torch 2.13.0)


@pytest.mark.parametrize("k, s, p, ceil, include, H", [(2, 2, 0, True, False, 9), (3, 2, 1, False, False, 10),
                                                       (3, 2, 1, True, True, 10)])  # fmt: skip
def test_avg_pool_in_ceil_mode_or_without_the_padding_matches_monte_carlo(k, s, p, ceil, include, H):
    """timm's ResNet-D shortcut (2, 2, ceil mode, count_include_pad=False on an odd map) and the others."""
    x, f = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), var=_ramp(2, H, H, 0.5, 2.0), ell=1.2)
    rule = cr.AvgPoolWindows((k, k), (s, s), (p, p), ceil, include)
    xr = x.clone().requires_grad_(True)
    y = F.avg_pool2d(xr, k, s, p, ceil_mode=ceil, count_include_pad=include)
    close(rule.forward(f), y.detach(), rel=0.02, corr=0.02)
    g, gf = gaussian_field(H=y.shape[-2], W=y.shape[-1], seed=3, ell=1.0)
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.02)


class _Doubled(torch.nn.Conv2d):
    """A conv subclass whose own forward computes something else (twice the conv): not the conv's rule."""

    def forward(self, x):
        return 2 * super().forward(x)


class _Plain(torch.nn.Conv2d):
    """A conv subclass that keeps the conv's forward: the conv's rule."""


def _subclassed_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(_Plain(3, 4, 3, padding=1), torch.nn.ReLU(), _Doubled(4, 4, 3, padding=1))


def test_a_subclass_with_its_own_forward_does_not_get_its_base_rule(monkeypatch):
    """On main the doubled conv was predicted as a plain conv (a quarter of its variance); now its row says
    it has no rule and why, unless a rule is registered for it or its base's is for every subclass."""
    import gatepool.analysis.probe.correlated_predict as cp
    from gatepool.analysis.probe.correlated import registry
    from gatepool.analysis.probe.correlated.conv import conv_rule

    monkeypatch.setattr(registry, "RULES", registry.RULES.copy())
    monkeypatch.setattr(registry, "_FOR_SUBCLASSES", set())
    net = _subclassed_net()
    stats = cr.measure_input(torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(1)))
    pred = cp.predict_correlated(net, stats)
    assert pred["0"].var is not None and pred["1"].var is not None  # no forward of its own: Conv2d's rule
    assert pred["2"].var is None and "_Doubled: its own forward, not Conv2d's" in pred["2"].note
    cp.register_correlated_rule(torch.nn.Conv2d, conv_rule, subclasses=True)  # the conv's rule for all
    assert cp.predict_correlated(net, stats)["2"].var is not None
    cp.register_correlated_rule(torch.nn.Conv2d, conv_rule)  # registered again: for plain subclasses only
    assert cp.predict_correlated(net, stats)["2"].var is None

    def doubled(m):
        return _Chain(conv_rule(m), cr.Scale(2.0))

    cp.register_correlated_rule(_Doubled, doubled)  # its own rule: the prediction is the measurement's
    pred = cp.predict_correlated(net, stats)
    x = torch.randn(4000, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = net(x)
    assert abs(pred["2"].var / float(y.var(unbiased=False)) - 1) < 0.05
    with pytest.raises(TypeError, match="subclasses must be a bool"):
        cp.register_correlated_rule(_Doubled, doubled, subclasses="yes")


class _Chain:
    def __init__(self, *steps):
        self.steps = steps

    def forward(self, x):
        for s in self.steps:
            x = s.forward(x)
        return x

    def backward(self, g):
        for s in reversed(self.steps):
            g = s.backward(g)
        return g


@pytest.mark.parametrize("H", [6, 3])
def test_a_linear_over_a_flattened_map_matches_monte_carlo(H):
    """AlexNet's and VGG's classifier: every output reads every channel at every position, its variance
    through each channel's whole covariance; backward the transposed sum into a correlated map."""
    C, O = 2, 5
    mean, var = _ramp(C, H, H, -0.5, 0.8), _ramp(C, H, H, 0.5, 2.0)
    x, f = gaussian_field(C=C, H=H, W=H, mean=mean, var=var, ell=1.4)
    torch.manual_seed(0)
    lin = torch.nn.Linear(C * H * H, O).double()
    rule = cr.FlatLinear(lin.weight, lin.bias)
    xr = x.clone().requires_grad_(True)
    y = lin(torch.flatten(xr, 1))
    close(rule.forward(f), y.detach()[:, :, None, None], rel=0.02, lags=())
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g = g * torch.linspace(0.5, 2.0, O, dtype=torch.float64)
    gf = cr.Field(torch.zeros(O, 1, 1, dtype=torch.float64), torch.linspace(0.5, 2.0, O, dtype=torch.float64
                  ).pow(2)[:, None, None], torch.ones(O, 1, 1, dtype=torch.float64))  # fmt: skip
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.02, lags=(1, 2) if H > 3 else (1,))
    with pytest.raises(ValueError, match="inputs are not the map's"):
        cr.FlatLinear(lin.weight[:, :-1], None).forward(f)


class _VGGHead(torch.nn.Module):
    """VGG's shape, small: convs, a max pool, an adaptive pool up to 3 × 3, flattened into a classifier
    of Linears (one an ``F.linear`` of a parameter), a dropout."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 24, 3, padding=1), nn.ReLU())  # fmt: skip
        self.avgpool = nn.AdaptiveAvgPool2d((3, 3))
        self.fc1 = nn.Linear(24 * 9, 64)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(0.2)
        self.w2 = nn.Parameter(torch.randn(10, 64) / 8)

    def forward(self, x):
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return F.linear(self.drop(self.relu(self.fc1(x))), self.w2)


def test_the_walk_carries_a_flattened_map_into_a_classifier():
    torch.manual_seed(0)
    model = _VGGHead().double()
    x = torch.randn(1024, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert_walk_holds(model, x, ["features.1", "features.4", "avgpool", "fc1", "relu", "drop"])


def _map_against_monte_carlo(rule, fn, H: int):
    """A rule that maps a field's positions linearly, against ``fn`` on Monte Carlo draws: forward on an
    H × H field with a mean and a variance ramp, backward with a gradient field whose variance ramps too.
    Returns the rule's forward output and ``fn``'s (for the test's own checks)."""
    x, f = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), var=_ramp(2, H, H, 0.5, 2.0), ell=1.2)
    xr = x.clone().requires_grad_(True)
    y = fn(xr)
    out = rule.forward(f)
    close(out, y.detach(), rel=0.02, corr=0.02)
    h, w = y.shape[-2:]
    g, gf = gaussian_field(H=h, W=w, var=_ramp(2, h, w, 0.3, 3.0), seed=3, ell=1.0)
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.02)
    return out, y


@pytest.mark.parametrize("pads, fill", [((0, 1, 0, 1), 0.0), ((2, 1, 0, 3), 0.5)])
def test_a_padded_map_matches_monte_carlo(pads, fill):
    """hgnetv2's ``F.pad(x, (0, 1, 0, 1))`` and an uneven pad with a constant: the padding fixed, the map's
    correlation as it was; the gradient cut back to the map."""
    out, y = _map_against_monte_carlo(cr.Pad(*pads, value=fill), lambda x: F.pad(x, pads, value=fill), 7)
    assert out.shape == y.shape[1:] and float(out.var[:, -1, -1].abs().max()) == 0.0
    assert torch.allclose(out.mean[:, -1, -1], torch.full((2,), fill, dtype=torch.float64))
    with pytest.raises(ValueError, match="ints ≥ 0"):
        cr.Pad(-1, 0, 0, 0)


@pytest.mark.parametrize("k, dilation, padding", [(4, 1, "same"), (3, 1, "same"), (3, 2, 2), (2, 1, "valid")])
def test_conv_given_same_or_valid_padding_or_a_dilation_matches_monte_carlo(k, dilation, padding):
    """``padding='same'`` with an even kernel pads one more row and column after (the map padded first),
    an odd one evenly (convmixer's 9 × 9); a dilated kernel is the kernel with zeros between its taps."""
    from gatepool.analysis.probe.correlated.conv import conv_rule

    H = 9
    x, f = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), var=_ramp(2, H, H, 0.5, 2.0), ell=1.2)
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 3, k, padding=padding, dilation=dilation).double()
    rule = conv_rule(conv)
    xr = x.clone().requires_grad_(True)
    y = conv(xr)
    close(rule.forward(f), y.detach(), rel=0.02, corr=0.02)
    g, gf = gaussian_field(C=3, H=y.shape[-2], W=y.shape[-1], seed=3, ell=1.0)
    (y * g).sum().backward()
    # the uneven pad's gradient, cut out of the padded map's, keeps that map's stationary correlation: its
    # border positions, dropped, had less (lag 1: 0.673 against 0.701 measured on this 9 × 9 map)
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.03 if k % 2 == 0 else 0.02)
    with pytest.raises(NotImplementedError, match="padding_mode 'reflect'"):
        conv_rule(torch.nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"))


class _Functional(torch.nn.Module):
    """Inception's functional pools and hgnetv2's pad: ``F.max_pool2d`` of a ReLU's output,
    ``F.avg_pool2d(x, 3, 1, 1)``, ``F.pad``, a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.relu = torch.nn.ReLU()
        self.conv = torch.nn.Conv2d(16, 16, 2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(self.relu(self.stem(x)), kernel_size=3, stride=2, ceil_mode=True)
        x = self.conv(F.pad(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1), (0, 1, 0, 1)))
        return self.fc(x.mean((2, 3)))


def test_the_walk_carries_functional_pools_and_a_pad():
    torch.manual_seed(0)
    model = _Functional().double()
    x = torch.randn(1024, 3, 12, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert_walk_holds(model, x, ["stem", "relu", "conv", "fc"])


@pytest.mark.parametrize("H, kwargs", [(5, dict(scale_factor=2, mode="nearest")),
                                       (5, dict(scale_factor=2, mode="bilinear", align_corners=False)),
                                       (6, dict(size=(4, 9), mode="bilinear", align_corners=True)),
                                       (4, dict(scale_factor=4, mode="nearest"))])  # fmt: skip
def test_an_interpolated_map_matches_monte_carlo(H, kwargs):
    """HRNet's fuse layers (nearest × 2 and × 4), bilinear up and to a size (down along H): torch's own
    position map A, the whole covariance A Cov Aᵀ."""
    out, y = _map_against_monte_carlo(cr.Interpolate(**kwargs), lambda x: F.interpolate(x, **kwargs), H)
    assert out.shape == y.shape[1:]
    with pytest.raises(ValueError, match="one of size and scale_factor"):
        cr.Interpolate()


@pytest.mark.parametrize("H, kwargs", [(6, dict(size=(15, 13), mode="bicubic", align_corners=False)),
                                       (5, dict(scale_factor=2.5, mode="bilinear", align_corners=False)),
                                       (6, dict(size=(4, 9), mode="bilinear", align_corners=True)),
                                       (5, dict(scale_factor=3, mode="nearest"))])  # fmt: skip
def test_a_map_past_the_dense_limit_is_resized_separably(H, kwargs, monkeypatch):
    """CrossViT's bicubic 64 × 64 → 240 × 240 (57,600 positions): one matrix per axis, the output's lag
    sums and variances from the input's covariance; the dense rule's numbers to 1e-10, Monte Carlo's
    within 2%; no gradient through it."""
    from gatepool.analysis.probe.correlated import resample

    x, f = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), var=_ramp(2, H, H, 0.5, 2.0), ell=1.2)
    dense = cr.Interpolate(**kwargs).forward(f)
    monkeypatch.setattr(resample, "_MAX_POSITIONS", 8)  # every map here past it
    rule = cr.Interpolate(**kwargs)
    out = rule.forward(f)
    assert rule.A is None
    for a, b in ((out.mean, dense.mean), (out.var, dense.var), (out.corr, dense.corr)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10 * float(dense.var.max())), float((a - b).abs().max())
    close(out, F.interpolate(x, **kwargs), rel=0.02, corr=0.02)
    assert rule.backward(out) is None


class _Fuse(torch.nn.Module):
    """HRNet's fuse: a half-resolution branch upsampled (a module and a function) and added to the
    full-resolution stream."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.low = nn.Conv2d(16, 16, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.low2 = nn.Conv2d(16, 16, 1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        low = self.down(x)
        x = x + self.up(self.low(low)) + F.interpolate(self.low2(low), scale_factor=2.0, mode="bilinear")
        return self.fc(x.mean((2, 3)))


def test_the_walk_carries_an_upsampled_branch():
    torch.manual_seed(0)
    model = _Fuse().double()
    x = torch.randn(1024, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert_walk_holds(model, x, ["stem.2", "down.2", "low", "up", "low2"])


@pytest.mark.parametrize("include", [False, True])
def test_a_pool_less_its_input_matches_monte_carlo(include):
    """PoolFormer's token mixer ``pool(x) − x``: one map (A − I) of x (the two terms, both of x, taken as
    independent would add their variances); the gradient to x through (A − I)ᵀ."""
    H = 8
    x, f = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), var=_ramp(2, H, H, 0.5, 2.0), ell=1.2)
    pool = torch.nn.AvgPool2d(3, 1, 1, count_include_pad=include)
    eye = torch.eye(H * H, dtype=torch.float64)
    A = cr.AvgPoolWindows((3, 3), (1, 1), (1, 1), False, include)
    A.forward(f)
    rule = cr.PositionMap(A.A - eye, (H, H))
    xr = x.clone().requires_grad_(True)
    y = pool(xr) - xr
    close(rule.forward(f), y.detach(), rel=0.02, corr=0.02)
    g, gf = gaussian_field(H=H, W=H, var=_ramp(2, H, H, 0.3, 3.0), seed=3, ell=1.0)
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.02)
    with pytest.raises(ValueError, match="matrix must be"):
        cr.PositionMap(eye, (H, H + 1))


class _PoolMixer(torch.nn.Module):
    """PoolFormer's token mixer pool(GroupNorm x) − GroupNorm x, a channel MLP, the difference the other
    way round, a difference with a number (no residual adds: PoolFormer's, with its layer scale 1e-5, are
    independent at init; without it the stream and the mixer, both of x, are not)."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(1, 16)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.mlp = nn.Sequential(nn.Conv2d(16, 32, 1), nn.GELU(), nn.Conv2d(32, 16, 1))
        self.norm2 = nn.GroupNorm(1, 16)
        self.pool2 = nn.AvgPool2d(3, 1, 1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        y = self.norm(self.stem(x))
        y = self.norm2(self.mlp(self.pool(y) - y))
        return self.fc(torch.flatten(y - self.pool2(y) - 0.5, 1))


def test_the_walk_carries_a_pool_less_its_input():
    torch.manual_seed(0)
    model = _PoolMixer().double()
    x = torch.randn(1024, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert_walk_holds(model, x, ["stem", "norm", "pool", "mlp.1", "mlp.2", "norm2", "pool2"])


class _FourierCode(torch.nn.Module):
    """EdgeNeXt's position code: built from ``torch.arange`` and the map's size, projected by a conv (a
    module of constants), added to the tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.proj = torch.nn.Conv2d(4, 8, 1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        B, C, H, W = x.shape
        code = torch.arange(H * W, dtype=torch.float32, device=self.proj.weight.device).reshape(1, 1, H, W)
        pos = self.proj(torch.cat([code.sin(), code.cos(), code / (H * W), code * 0], 1))
        return self.fc((x + pos).mean((2, 3)))


def test_a_module_of_constants_is_evaluated_and_its_row_says_so():
    torch.manual_seed(0)
    model = _FourierCode()
    pred = predict_correlated(model, cr.measure_input(torch.randn(64, 3, 6, 6)))
    assert pred["fc"].var is not None and pred["stem"].grad_e2 is not None
    assert pred["proj"].var is None and "a constant (of parameters alone)" in pred["proj"].note


class _TwoHeads(torch.nn.Module):
    """CrossViT's head: each branch's own Linear of its features, the logits' mean over the branches."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList(torch.nn.Conv2d(3, 8, 3, padding=1) for _ in range(2))
        self.heads = torch.nn.ModuleList(torch.nn.Linear(8 * 36, 5) for _ in range(2))

    def forward(self, x):
        xs = [torch.relu(b(x)).flatten(1) for b in self.branches]
        return torch.mean(torch.stack([h(v) for h, v in zip(self.heads, xs)], dim=0), dim=0)


def test_the_walk_takes_the_mean_of_stacked_logits():
    """The mean of K stacked tensors is their sum over K: the two heads' variances summed over 4, each
    head's gradient half the logits' (the two branches independent, as an add's terms)."""
    torch.manual_seed(0)
    model = _TwoHeads().double()
    x = torch.randn(4096, 3, 6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert_walk_holds(model, x, ["branches.0", "branches.1", "heads.0", "heads.1"])
