"""Squeeze-and-excitation's gate x · s, a sum with a constant, and the token rules (positions flattened
into a sequence, a constant token set beside them, one token taken out) against Monte Carlo, as the other
correlated rules (``gaussian_field``: Gaussian fields of known correlation through torch's own ops)."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import DT, _ramp, assert_walk_holds, close, gaussian_field

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


class _SqueezeExcite(torch.nn.Module):
    """A stem, BatchNorm and SiLU, torchvision's ``SqueezeExcitation`` as written there (global pool, 1×1
    conv, SiLU, 1×1 conv, sigmoid, ``scale * input``), a conv, the global pool and the classifier."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, C, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(C)
        self.act = torch.nn.SiLU()
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc1 = torch.nn.Conv2d(C, C // 4, 1)
        self.fc2 = torch.nn.Conv2d(C // 4, C, 1)
        self.se_act = torch.nn.SiLU()
        self.gate = torch.nn.Sigmoid()
        self.conv = torch.nn.Conv2d(C, C, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(C, 10)

    def forward(self, x):
        x = self.act(self.bn(self.stem(x)))
        scale = self.gate(self.fc2(self.se_act(self.fc1(self.avgpool(x)))))
        x = self.conv(scale * x)
        return self.fc(torch.flatten(self.pool(x), 1))


@pytest.mark.slow
def test_the_walk_carries_a_squeeze_and_excitation_gate():
    """Every module of :class:`_SqueezeExcite` predicted, forward within 10% and backward within 15% of its
    measurement (512 noise images, ∂L/∂logits ~ N(0, 1)); the signal gets the gradient through the gate's
    product and through the squeeze path. At width 96 and seed 0 (torch 2.13.0, CPU) the ratios are
    0.997–1.006 forward and 0.91–1.02 backward; at width 32 (8 hidden units in the squeeze) the stem's
    backward is 1.12: the two paths' gradients, added as independent, are not quite so where the squeeze's
    fixed weights are few (its Jacobian's diagonal correlates ∂L/∂x̄_c with the direct path's g_c)."""

    torch.manual_seed(0)
    model = _SqueezeExcite(96).double()
    x = torch.randn(512, 3, 12, 12, generator=torch.Generator().manual_seed(1), dtype=DT)
    assert_walk_holds(model, x, [n for n, _ in model.named_children()], fwd=0.10, bwd=0.15)
