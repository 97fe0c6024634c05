"""Concatenation along channels and products with a constant against Monte Carlo, as the other correlated
rules: Gaussian fields of known correlation (``gaussian_field``) through torch's own ops."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import DT, _ramp, close, gaussian_field

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
