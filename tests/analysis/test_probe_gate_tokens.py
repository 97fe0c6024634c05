"""Squeeze-and-excitation's gate x · s, a sum with a constant, and the token rules (positions flattened
into a sequence, a constant token set beside them, one token taken out) against Monte Carlo, as the other
correlated rules (``gaussian_field``: Gaussian fields of known correlation through torch's own ops)."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import DT, _ramp, close, gaussian_field

from gatepool.analysis.probe import correlated as cr


def test_gate_matches_monte_carlo():
    """x · s with s (C, 1, 1) per sample independent of x, both with non-zero means; s first or second."""
    x, fx_ = gaussian_field(mean=_ramp(2, 10, 10, -1.0, 2.0), var=_ramp(2, 10, 10, 0.5, 2.0), ell=1.5)
    s, fs = gaussian_field(C=2, H=1, W=1, mean=torch.tensor([0.5, -1.0], dtype=DT)[:, None, None],
                           var=torch.tensor([0.3, 2.0], dtype=DT)[:, None, None], seed=3)
    for order in ((0, 1), (1, 0)):
        rule = cr.Gate()
        xr, sr = x.clone().requires_grad_(), s.clone().requires_grad_()
        y = (xr, sr)[order[0]] * (xr, sr)[order[1]]
        close(rule.forward([(fx_, fs)[i] for i in order]), y.detach(), rel=0.03, corr=0.01)
        g, gf = gaussian_field(seed=2, ell=1.2, var=_ramp(2, 10, 10, 0.3, 3.0))
        (y * g).sum().backward()
        grads = dict(zip(order, rule.backward(gf)))
        close(grads[0], xr.grad, rel=0.03, corr=0.01)
        close(grads[1], sr.grad, rel=0.05, lags=())  # Σ_p g_p x_p: a sum of 100 correlated products
    with pytest.raises(ValueError, match="gate"):
        cr.Gate().forward([fx_, fx_])


def test_shift_moves_the_mean_only():
    x, field = gaussian_field(var=_ramp(2, 10, 10, 0.5, 2.0), ell=1.5)
    c = torch.linspace(-1, 1, 20, dtype=DT).reshape(2, 1, 10)
    close(cr.Shift(c).forward(field), x + c, rel=0.02, corr=0.01)
    with pytest.raises(ValueError, match="c must broadcast"):
        cr.Shift(torch.ones(3, 1, 1)).forward(field)


def test_flatten_positions_matches_monte_carlo():
    """(C, H, W) → (C, 1, H·W) row-major, the sequence's lag sums exact from the map's (a correlated,
    non-stationary field: lag 1 along the sequence mixes map lags (0, 1) and (1, 1 − W))."""
    x, field = gaussian_field(mean=_ramp(2, 6, 6, -1.0, 2.0), var=_ramp(2, 6, 6, 0.5, 2.0), H=6, W=6, ell=1.5)
    rule = cr.FlattenPositions()
    xr = x.clone().requires_grad_()
    y = xr.flatten(2)[:, :, None]  # (B, C, 1, 36)
    close(rule.forward(field), y.detach(), rel=0.02, corr=0.01, lags=(1, 2, 6))
    g, gf = gaussian_field(H=1, W=36, seed=2, ell=1.2, var=_ramp(2, 1, 36, 0.3, 3.0))
    (y * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.02, corr=0.02)


def test_token_cat_and_select_match_monte_carlo():
    """A constant class token before the tokens, then the class token and a patch token taken out."""
    mean, var = _ramp(2, 1, 12, -1.0, 2.0), _ramp(2, 1, 12, 0.5, 2.0)
    x, field = gaussian_field(H=1, W=12, mean=mean, var=var, ell=1.5)
    cls = torch.tensor([0.3, -0.7], dtype=DT)[:, None, None]
    cat = cr.TokenCat()
    xr = x.clone().requires_grad_()
    y = torch.cat([cls.expand(x.shape[0], 2, 1, 1), xr], -1)
    fy = cat.forward([cls, field])
    close(fy, y.detach(), rel=0.02, corr=0.01)
    token = cr.SelectToken(0).forward(fy)
    assert torch.equal(token.mean, cls) and float(token.var.abs().max()) == 0.0
    for i in (1, 5):
        pick = cr.SelectToken(i)
        close(pick.forward(fy), y[..., i : i + 1].detach(), rel=0.02, lags=())
    g, gf = gaussian_field(H=1, W=13, seed=2, ell=1.2, var=_ramp(2, 1, 13, 0.3, 3.0))
    (y * g).sum().backward()
    (gx,) = cat.backward(gf)
    close(gx, xr.grad, rel=0.02, corr=0.01)
    gsel = pick.backward(gaussian_field(C=2, H=1, W=1, batch=1)[1])
    assert float(gsel.var[..., 5].min()) == 1.0 and float(gsel.var.sum()) == 2.0
    with pytest.raises(ValueError, match="index must select"):
        cr.SelectToken(13).forward(fy)
