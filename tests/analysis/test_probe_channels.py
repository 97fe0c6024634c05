"""The channels' correlation (``Field.chan``, :mod:`correlated.channels`) against Monte Carlo: a stem conv
makes its channels of 27 numbers, so they are correlated through its weights, and the next conv's output
variance per channel is wᵀ Σ w. Without the correlation the walk's per-channel variances after the
second conv are 0.82–1.40 of the measurement (seed 0), and NF-RegNet-B0's first squeeze-and-excitation
0.26 (the channels' means' spread)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
from test_probe_correlated import DT, _ramp, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated import channels
from gatepool.analysis.probe.correlated import conv as conv_rule
from gatepool.analysis.probe.correlated_predict import predict_correlated


class _Stem(nn.Module):
    """conv 3 → 13 (3 × 3, stride 2), BN, ReLU, conv 13 → 24 (1 × 1), BN, SiLU, conv 24 → 24 (3 × 3), then
    a squeeze-and-excitation's pool and 1 × 1 conv, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 13, 3, 2, 1, bias=False), nn.BatchNorm2d(13)
        self.act1 = nn.ReLU()
        self.conv2, self.bn2, self.act2 = nn.Conv2d(13, 24, 1, bias=False), nn.BatchNorm2d(24), nn.SiLU()
        self.conv3 = nn.Conv2d(24, 24, 3, padding=1, bias=False)
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Conv2d(24, 8, 1)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h1 = self.act1(self.bn1(self.conv1(x)))  # (B, 13, H/2, W/2)
        y3 = self.conv3(self.act2(self.bn2(self.conv2(h1))))  # (B, 24, H/2, W/2)
        s = self.fc(self.pool(y3))  # (B, 8, 1, 1)
        return self.head(s.flatten(1))


@pytest.fixture(scope="module")
def stem():
    torch.manual_seed(0)
    model = _Stem().double()
    x = torch.randn(4096, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=DT)
    acts = {}

    def keep(m, a, y, n):
        acts[n] = y.detach()

    for name in ("conv1", "act1", "conv2", "act2", "conv3", "pool", "fc", "head"):
        model.get_submodule(name).register_forward_hook(lambda m, a, y, n=name: keep(m, a, y, n))
    with torch.no_grad():
        model(x)
    return model, x, acts


def _per_channel(pred, acts, name):
    """Predicted over measured variance per channel, over the batch and the positions (the spread of the
    channel's mean map over the positions included, as measured)."""
    f = pred[name].field
    measured = acts[name].transpose(0, 1).flatten(1).var(1)
    return (f.var.flatten(1).mean(1) + f.mean.flatten(1).var(1, unbiased=False)) / measured


def test_a_conv_of_correlated_channels_has_each_channels_variance(stem):
    """After the stem, every channel of the 1 × 1 conv within 2% (0.82–1.40 without the correlation, 0.77–1.08
    with the ReLU's left as its input's), of the 3 × 3 conv after a SiLU within 12% (its channels'
    cross-lags from their mean correlation; 0.79–1.20 without)."""
    model, x, acts = stem
    pred = predict_correlated(model, cr.measure_input(x), backward=None)
    r2, r3 = _per_channel(pred, acts, "conv2"), _per_channel(pred, acts, "conv3")
    assert float((r2 - 1).abs().max()) < 0.02, r2
    assert float((r3 - 1).abs().max()) < 0.12, r3


def test_the_stems_channel_correlation_is_the_measured(stem):
    """R of the stem's conv (exact from uncorrelated inputs) and after its norm and ReLU (Mehler's series
    per pair): within 0.04 of the measured correlation matrix, whose off-diagonal entries are ±0.1 rms."""
    model, x, acts = stem
    pred = predict_correlated(model, cr.measure_input(x), backward=None)
    y = acts["conv1"].transpose(0, 1).flatten(1)  # (13, B·H·W)
    assert float((pred["conv1"].field.chan - torch.corrcoef(y)).abs().max()) < 0.02
    R = torch.corrcoef(acts["act1"].transpose(0, 1).flatten(1))
    assert float((R - torch.eye(13, dtype=DT)).pow(2).mean().sqrt()) > 0.05  # not a trivial check
    assert float((pred["act1"].field.chan - R).abs().max()) < 0.04


def _sums_corr(t: torch.Tensor) -> torch.Tensor:
    """The measured correlation of the channels' sums over the map (C, C), over the batch."""
    s = t.sum((2, 3))
    return torch.corrcoef(s.T)


def test_the_channels_sums_correlation_is_the_measured(stem):
    """Q, the correlation of the channels' sums over the map (what a global pool's channels are): after the
    stride-2 stem (its taps' phases), its norm and ReLU, and the 1 × 1 conv within 0.05 rms of the
    measured (whose entries are 0.18–0.31 rms); after the SiLU and the 3 × 3 conv within 0.12 (the
    second order's cross-lags, and the third's on, approximated). The pool's channels are correlated as
    the sums, not as the values (their lag-0 R differs from the pool's by up to 0.77 here)."""
    model, x, acts = stem
    pred = predict_correlated(model, cr.measure_input(x), backward=None)
    for name, bound in (("conv1", 0.05), ("act1", 0.05), ("conv2", 0.05), ("act2", 0.12), ("conv3", 0.12)):
        err = pred[name].field.chan_dc - _sums_corr(acts[name])
        assert float(err.pow(2).mean().sqrt()) < bound, name
    pool = acts["pool"].flatten(1).T
    err = pred["pool"].field.chan - torch.corrcoef(pool)
    assert float(err.pow(2).mean().sqrt()) < 0.12


def test_the_pooled_channels_conv_and_head_hold(stem):
    """The squeeze-and-excitation's 1 × 1 conv of the pooled channels, and the head after it: within 2%
    of the measurement (here within 1.5% without the correlation too: a check of the whole walk, the
    pool's R is the test above's)."""
    model, x, acts = stem
    pred = predict_correlated(model, cr.measure_input(x), backward=None)
    for name in ("fc", "head"):
        assert abs(pred[name].var / float(acts[name].var(unbiased=False)) - 1) < 0.02, (name, pred[name].var)


def test_the_walk_without_the_correlation_misses(stem, monkeypatch):
    """The same walk with every conv's correlation dropped (``conv_channels`` None): the 1 × 1 conv's
    channels are off by over 10% somewhere. What the two tests above guard."""
    model, x, acts = stem
    monkeypatch.setattr(conv_rule, "conv_channels", lambda *a, **k: None)
    pred = predict_correlated(model, cr.measure_input(x), backward=None)
    assert float((_per_channel(pred, acts, "conv2") - 1).abs().max()) > 0.10


def _random_correlation(C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ, R): a random covariance of C channels (seed 0) and its correlation; the generator left seeded."""
    torch.manual_seed(0)
    A = torch.randn(C, C, dtype=DT)
    Sigma = A @ A.T / C + torch.eye(C, dtype=DT)
    s = Sigma.diagonal().sqrt()
    return Sigma, Sigma / s[:, None] / s[None, :]


def test_conv_channels_is_exact_for_a_1x1_conv():
    """A 1 × 1 conv of correlated channels: Σ_out = W Σ Wᵀ exactly, so κ_o = (wᵀ Σ w)/(Σ_a w_a² Σ_aa), and
    the sums' D_out = W D Wᵀ."""
    C, Co = 6, 4
    Sigma, R = _random_correlation(C)
    W = torch.randn(Co, C, 1, 1, dtype=DT)
    x = cr.Field(torch.zeros(C, 3, 3, dtype=DT), Sigma.diagonal()[:, None, None].expand(C, 3, 3).clone(),
                 torch.ones(C, 5, 5, dtype=DT), chan=R, chan_dc=R)  # fmt: skip
    kappa, R_out, Q_out = channels.conv_channels(W, x)
    w = W[:, :, 0, 0]
    full = w @ Sigma @ w.T
    torch.testing.assert_close(kappa, full.diagonal() / ((w**2) @ Sigma.diagonal()))
    d = full.diagonal().sqrt()
    torch.testing.assert_close(R_out, full / d[:, None] / d[None, :])
    torch.testing.assert_close(Q_out, R_out)  # every position's the same: the sums' as the values'


@pytest.mark.parametrize("groups,multiplier", [(3, 1), (6, 1), (6, 2)], ids=["grouped", "depthwise", "x2"])
def test_a_grouped_conv_is_its_dense_form(groups, multiplier):
    """A grouped (or depthwise) conv's κ, R and Q block by block: those of the dense weight with zeros off
    its groups' blocks, at stride 2 over a correlated field."""
    C, H = 6, 7
    _, R = _random_correlation(C)
    var = _ramp(C, H, H, 0.3, 3.0) * torch.linspace(0.5, 2.0, C, dtype=DT)[:, None, None]  # each its own
    x, f = gaussian_field(C=C, H=H, W=H, ell=1.0, var=var)
    f = dataclasses.replace(f, chan=R, chan_dc=R.flip(0).flip(1))
    Co = C * multiplier if groups == C else C
    w = torch.randn(Co, C // groups, 3, 3, dtype=DT)
    dense = torch.zeros(Co, C, 3, 3, dtype=DT)
    og, ig = Co // groups, C // groups
    for g in range(groups):
        dense[g * og : (g + 1) * og, g * ig : (g + 1) * ig] = w[g * og : (g + 1) * og]
    got = channels.conv_channels(w, f, groups, stride=(2, 2))
    want = channels.conv_channels(dense, f, 1, stride=(2, 2))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def _mixed_field(C: int, seed: int, mean: torch.Tensor) -> tuple[torch.Tensor, cr.Field]:
    """(draws (20000, C, 8, 8), the exact Field): a Gaussian field's channels mixed by I + 0.6 Z/√C, so
    correlated alike at every position and lag (its R and Q the same matrix), plus a mean map."""
    draws, f = gaussian_field(C=C, H=8, W=8, seed=seed, batch=20000)
    z = torch.randn(C, C, generator=torch.Generator().manual_seed(seed), dtype=DT)
    L = torch.eye(C, dtype=DT) + 0.6 * z / C**0.5
    cov = L @ L.T
    sd = cov.diagonal().sqrt()
    field = cr.Field(mean, cov.diagonal()[:, None, None].expand(C, 8, 8).clone(), f.corr)
    field.chan = field.chan_dc = cov / sd[:, None] / sd[None, :]
    return torch.einsum("ck,bkhw->bchw", L, draws) + mean, field


def test_a_relu_after_a_residual_add_keeps_the_channels_correlation():
    """ReLU(b + ReLU(y)) (a residual stream's ReLU, ``Field.parts``), b and y of correlated channels: its R
    and Q by the series of a normal of the sum's moments, as its lags are. Within 0.06 of the measured
    (0.047 and 0.057 here; entries 0.12 and 0.14 rms, up to 0.3); the rule had dropped them (None), so a
    conv after a residual stream took its channels as uncorrelated: GerNet-S's stage-2 shortcut conv came
    out 0.45–2.5 of the measurement per channel, its BatchNorm's backward 10% low."""
    from dataclasses import replace

    C = 6
    b, fb = _mixed_field(C, 1, _ramp(C, 8, 8, -0.6, 0.2))
    y, fy = _mixed_field(C, 2, _ramp(C, 8, 8, -0.4, 0.4))
    relu_y, relu = cr.ReLU(), cr.ReLU()
    out = relu.forward(replace(cr.add(fb, relu_y.forward(fy)), parts=(fb, relu_y.law)))
    z = torch.relu(b + torch.relu(y))
    z = z - z.mean(0)  # the correlation over the samples at each position, pooled: not the mean map's
    R, Q = torch.corrcoef(z.transpose(0, 1).flatten(1)), torch.corrcoef(z.sum((2, 3)).T)
    assert float((R - torch.eye(C, dtype=DT)).abs().max()) > 0.2  # not a trivial check
    assert out.chan is not None and out.chan_dc is not None
    assert float((out.chan - R).abs().max()) < 0.06
    assert float((out.chan_dc - Q).abs().max()) < 0.06


def test_stochastic_depth_keeps_the_channels_correlation():
    """y = x · b / q, b ~ Bernoulli(q) a sample (torchvision's ``StochasticDepth`` in "row" mode): a gate
    the same in every channel, so the channels' covariance gains q s² (1 − q) m_a m_b from their means.
    R and Q within 0.02 of the measured (0.006 and 0.013; x's own are 0.24 and 0.72 off); the rule had
    dropped them, and every conv after torchvision's EfficientNet-B0's first dropped block took its channels
    as uncorrelated."""
    from gatepool.analysis.probe.correlated.stochastic_depth import StochasticDepth

    C, q = 6, 0.7
    mean = torch.linspace(-1.0, 1.5, C, dtype=DT)[:, None, None] + _ramp(C, 8, 8, -0.2, 0.2)
    x, fx = _mixed_field(C, 3, mean)
    keep = torch.rand(x.shape[0], 1, 1, 1, generator=torch.Generator().manual_seed(4), dtype=DT) < q
    y = x * keep / q
    out = StochasticDepth(1 - q).forward(fx)
    z = y - y.mean(0)
    R, Q = torch.corrcoef(z.transpose(0, 1).flatten(1)), torch.corrcoef(z.sum((2, 3)).T)
    assert float((fx.chan - R).abs().max()) > 0.1  # the means' share: not x's correlation
    assert float((out.chan - R).abs().max()) < 0.02
    assert float((out.chan_dc - Q).abs().max()) < 0.02
