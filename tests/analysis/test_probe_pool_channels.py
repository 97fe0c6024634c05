"""The channels' correlation through a max pool and a cat of branches of one source (SqueezeNet's Fire)
against Monte Carlo. A conv's output channels are correlated at every lag as its weights make them, not
as at lag 0 times a mean correlation, and a max pool's window reads its neighbours; two convs of one
input (the Fire's 1 × 1 and 3 × 3 expands) are correlated across, and their cat's cross-blocks follow
from the one source (:class:`channels.Made`). Without them torchvision's SqueezeNet's forward drifted
to 1.2× from its second max pool on (27 of 69 modules within 10%)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_probe_channels import _mixed_field
from test_probe_correlated import DT, _ramp

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated import channels


def _corr(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The measured (R, Q): over the samples at each position, pooled; of the sums over the map."""
    z = t - t.mean(0)
    return torch.corrcoef(z.transpose(0, 1).flatten(1)), torch.corrcoef(z.sum((2, 3)).T)


@pytest.fixture(scope="module")
def fire():
    """A source of 6 correlated channels (8 × 8), its 1 × 1 and 3 × 3 convs to 8 channels each, their
    ReLUs: draws and the rules' fields."""
    x, fx = _mixed_field(6, 5, _ramp(6, 8, 8, -0.3, 0.3))
    g = torch.Generator().manual_seed(6)
    w1 = torch.randn(8, 6, 1, 1, generator=g, dtype=DT) / 6**0.5
    w3 = torch.randn(8, 6, 3, 3, generator=g, dtype=DT) / 54**0.5
    y1, y3 = cr.Conv(w1, None, (1, 1), (0, 0)).forward(fx), cr.Conv(w3, None, (1, 1), (1, 1)).forward(fx)
    draws = {"y1": F.conv2d(x, w1), "y3": F.conv2d(x, w3, padding=1)}
    return draws, {"y1": y1, "y3": y3, "r1": cr.ReLU().forward(y1), "r3": cr.ReLU().forward(y3)}


def test_a_cat_of_branches_of_one_source_has_their_cross_correlation(fire):
    """cat(ReLU(conv1 x), ReLU(conv3 x)): R within 0.05 of the measured (0.023), whose cross-block reaches
    0.54; Q within 0.12 (0.086: the series' second order over the lags approximated, as for one ReLU).
    The cat had dropped both (its pieces' cross-blocks unknown)."""
    draws, f = fire
    out = cr.Cat().forward([f["r1"], f["r3"]])
    R, Q = _corr(torch.relu(torch.cat([draws["y1"], draws["y3"]], 1)))
    assert float(R[:8, 8:].abs().max()) > 0.3  # the cross-block: not a trivial check
    assert out.chan is not None and out.chan_dc is not None
    assert float((out.chan - R).abs().max()) < 0.05
    assert float((out.chan_dc - Q).abs().max()) < 0.12


def test_a_max_pool_of_a_convs_relu_keeps_the_channels_correlation(fire, monkeypatch):
    """maxpool(ReLU(conv3 x)), 3 × 3 at stride 2 (the pool draws the ReLU's input): R within 0.06 of the
    measured (0.042: Stein's first order, the conv's channels at the window's lags from its source), Q
    within 0.12 (0.095: the ReLU output's); with the lags taken as lag 0's times the channels' mean
    correlation, R is 0.13 off."""
    draws, f = fire
    pool = cr.MaxPool((3, 3), (2, 2), (1, 1))
    R, Q = _corr(F.max_pool2d(torch.relu(draws["y3"]), 3, 2, 1))
    out = pool.forward(f["r3"], pre=f["y3"])
    assert float((R - torch.eye(8, dtype=DT)).abs().max()) > 0.3
    assert float((out.chan - R).abs().max()) < 0.06
    assert float((out.chan_dc - Q).abs().max()) < 0.12
    monkeypatch.setattr(channels, "made_lag_corr", lambda *a: None)
    worse = cr.MaxPool((3, 3), (2, 2), (1, 1)).forward(f["r3"], pre=f["y3"])
    assert float((worse.chan - R).abs().max()) > 0.1


def test_an_average_pool_of_a_scaled_activation_of_a_conv_has_its_channels_lags(fire, monkeypatch):
    """avgpool₂ₓ₂(β · SiLU(conv3 x)) (NF-RegNet's shortcut: ``DownsampleAvg`` after ``act1(x) * beta``): R
    from the SiLU's channels at the window's lags (the conv's, through Mehler's series) within 0.06 of the
    measured (0.045: the coefficients' products pooled over the positions, the border left out); the pool
    had kept its input's lag-0 R, 0.12 off here (NF-RegNet-B0's first shortcut pool: 0.08 rms, 0.006 with
    the lags, and its pooled maps' channel means 0.68 of the measured spread, the SE and head rows
    0.78–0.90 of the measured variance)."""
    from gatepool.analysis.probe.correlated.adaptive import AvgPool2dStep

    draws, f = fire
    beta = 0.7
    act = cr.Scale(beta).forward(cr.Pointwise("silu").forward(f["y3"]))
    R, _ = _corr(F.avg_pool2d(beta * F.silu(draws["y3"]), 2))
    out = AvgPool2dStep(torch.nn.AvgPool2d(2)).forward(act)
    assert float((act.chan - R).abs().max()) > 0.1  # the input's R: not the pool's
    assert float((out.chan - R).abs().max()) < 0.06
    monkeypatch.setattr(channels, "made_of", lambda f: None)
    assert float((AvgPool2dStep(torch.nn.AvgPool2d(2)).forward(act).chan - R).abs().max()) > 0.1


def test_a_conv_of_a_convs_activation_reads_its_channels_lags(fire, monkeypatch):
    """conv3'(ReLU(conv3 x)), 3 × 3 on 3 × 3: each output channel's variance (wᵀ Σ w over the taps' pairs,
    which span lags 1 and 2 of the ReLU's channels) within 3.5% of the measured (0.970–1.012); with the
    cross-lags as lag 0's R times the channels' mean correlation, 0.913–1.057."""
    draws, f = fire
    w = torch.randn(5, 8, 3, 3, generator=torch.Generator().manual_seed(7), dtype=DT) / 72**0.5
    measured = F.conv2d(torch.relu(draws["y3"]), w, padding=1).transpose(0, 1).flatten(1).var(1)

    def ratio():
        y = cr.Conv(w, None, (1, 1), (1, 1)).forward(cr.ReLU().forward(f["y3"]))
        return (y.var.flatten(1).mean(1) + y.mean.flatten(1).var(1, unbiased=False)) / measured

    assert float((ratio() - 1).abs().max()) < 0.035
    monkeypatch.setattr(channels, "made_lags", lambda *a: None)
    assert float((ratio() - 1).abs().max()) > 0.06
