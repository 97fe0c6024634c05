"""The pointwise rule (any activation f of the Gaussian field) against Monte Carlo, as the other correlated
rules: Gaussian fields of known correlation (``gaussian_field``) through torch's own f."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_probe_correlated import DT, _ramp, assert_walk_holds, close, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.pointwise import ACTIVATIONS, series_lag_sums

FNS = {name: f for name, (f, _) in ACTIVATIONS.items()}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_forward_and_backward_match_monte_carlo(name):
    f = FNS[name]
    # a mean ramp across a kink or the bend, a variance ramp, a strongly correlated field (ρ(1) ≈ 0.8)
    x, field = gaussian_field(mean=_ramp(2, 10, 10, -1.5, 2.5), var=_ramp(2, 10, 10, 0.5, 4.0), ell=1.5)
    rule = cr.Pointwise(name)
    close(rule.forward(field), f(x), rel=0.02, corr=0.01)
    g, gf = gaussian_field(seed=2, ell=1.2)
    xr = x.clone().requires_grad_()
    (f(xr) * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.01)


def test_the_series_is_exact_at_rho_one_and_zero():
    """Parseval's remainder makes the lag sum exact where ρ = 1 joins equal distributions (lag 0 always; every
    lag of a field with one mean and one variance), and at ρ = 0 it is 0."""
    m, s = _ramp(1, 6, 6, -2.0, 7.0), _ramp(1, 6, 6, 0.3, 2.0)
    for mean_map, sd_map in ((m, s), (torch.full_like(m, 5.5), torch.full_like(s, 1.3))):
        h = cr.hermite_coefficients(F.relu6, (0.0, 6.0), mean_map, sd_map)["f"]
        mean, e2, _ = h
        one = series_lag_sums(torch.ones((1, 11, 11), dtype=DT), *h)
        sd = (e2 - mean * mean).clamp_min(0).sqrt()
        assert torch.allclose(one[:, 5, 5], (sd * sd).sum((1, 2)), rtol=1e-12)
        assert float(series_lag_sums(torch.zeros((1, 11, 11), dtype=DT), *h).abs().max()) == 0.0
    assert torch.allclose(one, cr.xcorr(sd, sd), rtol=1e-12)


def test_the_quadrature_gives_the_rectified_normal_exactly():
    """ReLU6 far below 6 is ReLU: its moments and its lag-1 covariance are the ReLU rule's (closed forms)."""
    mean, var = _ramp(1, 8, 8, -1.0, 0.5), _ramp(1, 8, 8, 0.2, 0.6)
    field = gaussian_field(C=1, H=8, W=8, mean=mean, var=var, batch=1)[1]
    six, relu = cr.Pointwise("relu6").forward(field), cr.ReLU(0).forward(field)
    assert torch.allclose(six.mean, relu.mean, rtol=1e-9, atol=1e-12)
    assert torch.allclose(six.var, relu.var, rtol=1e-8, atol=1e-12)
    assert abs(cr.neighbour_corr(six, 1) - cr.neighbour_corr(relu, 1)) < 1e-4


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="one of"):
        cr.Pointwise("swishy")


class _Act(torch.nn.Module):
    """conv → BatchNorm → SiLU, (conv, activation) × 3 with functional and module activations, the global pool
    as a function, dropout (training), the classifier."""

    def __init__(self) -> None:
        super().__init__()
        c = 32
        self.stem = torch.nn.Conv2d(1, c, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(c)
        self.silu = torch.nn.SiLU()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.relu6 = torch.nn.ReLU6()
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.gelu = torch.nn.GELU()
        self.conv3 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.drop = torch.nn.Dropout(0.2)
        self.fc = torch.nn.Linear(c, 10)

    def forward(self, x):
        x = self.silu(self.bn(self.stem(x)))
        x = self.relu6(self.conv1(x))
        x = F.hardswish(self.gelu(self.conv2(x)))
        x = torch.sigmoid(self.conv3(x))
        return self.fc(self.drop(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))


@pytest.mark.slow
def test_the_walk_follows_every_activation_forward_and_backward():
    """A net of SiLU, ReLU6, GELU, a functional Hardswish, sigmoid and dropout: every module predicted,
    forward within 10% and backward within 15% of its measurement (512 noise images, ∂L/∂logits ~ N(0, 1);
    at width 32 the finite-width spread is most of the error: 2–12% backward here)."""
    torch.manual_seed(0)
    model = _Act().double()
    x = torch.randn(512, 1, 10, 10, generator=torch.Generator().manual_seed(1), dtype=DT)
    names = [n for n, _ in model.named_children()]
    assert_walk_holds(model, x, names)


@pytest.mark.parametrize("training", [True, False])
def test_dropout_forward_and_backward_match_monte_carlo(training):
    """Dropout's independent masks raise the variance map by 1/q and leave every other lag as it was."""
    x, field = gaussian_field(mean=_ramp(2, 10, 10, -0.5, 1.5), ell=1.5)
    drop = torch.nn.Dropout(0.3).double().train(training)
    rule = cr.Dropout(0.3, training)
    torch.manual_seed(3)
    xr = x.clone().requires_grad_()
    y = drop(xr)
    close(rule.forward(field), y.detach(), rel=0.02, corr=0.01)
    g, gf = gaussian_field(seed=2, ell=1.2)
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.01)
    with pytest.raises(ValueError, match="p must be"):
        cr.Dropout(1.0)
