"""The correlated rules against Monte Carlo: Gaussian random fields of known correlation through each rule.

Every field is x = m(p) + √v(p) · z(p), z a stationary Gaussian field (white noise smoothed by a kernel
k, so ρ(e) = Σ_u k(u) k(u+e) / Σ k²: known exactly); the rule gets that exact Field, the Monte Carlo
pushes 4000 draws through torch's own module and measures them (``measure_field``).
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated_predict import predict_correlated

B = 4000
DT = torch.float64


def _kernel(ell: float, k: int = 5) -> torch.Tensor:
    ax = torch.arange(k, dtype=DT) - k // 2
    g = torch.exp(-(ax[:, None] ** 2 + ax[None, :] ** 2) / (2 * ell**2))
    return g / g.pow(2).sum().sqrt()


def gaussian_field(C=2, H=10, W=10, ell=1.0, mean=None, var=None, seed=0, batch=B):
    """(draws (B, C, H, W), the exact Field): ρ the kernel's autocorrelation, any mean and variance map."""
    g = torch.Generator().manual_seed(seed)
    k = _kernel(ell)
    z = torch.randn(batch * C, 1, H + 4, W + 4, generator=g, dtype=DT)
    z = F.conv2d(z, k[None, None]).reshape(batch, C, H, W)
    rho = cr.autocorr(k[None, None])[0, 0]  # (9, 9), lags |e| ≤ 4
    corr = torch.zeros((C, 2 * H - 1, 2 * W - 1), dtype=DT)
    corr[:, H - 5 : H + 4, W - 5 : W + 4] = rho
    mean = torch.zeros((C, H, W), dtype=DT) if mean is None else mean
    var = torch.ones((C, H, W), dtype=DT) if var is None else var
    return mean + var.sqrt() * z, cr.Field(mean, var, corr)


def _ramp(C, H, W, lo, hi):
    return torch.linspace(lo, hi, H * W, dtype=DT).reshape(1, H, W).expand(C, H, W).clone()


def close(pred: cr.Field, draws: torch.Tensor, *, rel=0.03, corr=0.02):
    """The rule's Field against the Monte Carlo ``draws`` (B, C, H, W): pooled variance within ``rel``,
    every element of the mean and variance maps within 5 of its own Monte Carlo standard errors plus
    ``rel`` of its value, lags 1 and 2 within ``corr``."""
    mc = cr.measure_field(draws)
    d = draws.detach().double()
    pv, mv = float(pred.var.mean()), float(mc.var.mean())
    assert abs(pv - mv) <= rel * mv, (pv, mv)
    se_mean = d.std(0) / B**0.5
    assert bool(((pred.mean - mc.mean).abs() <= 5 * se_mean + rel * mc.mean.abs() + 1e-12).all())
    se_var = (d - d.mean(0)).pow(2).std(0) / B**0.5
    err = (pred.var - mc.var).abs() / (5 * se_var + rel * mc.var + 1e-12)
    assert float(err.max()) <= 1.0, float(err.max())
    for lag in (1, 2):
        p, m = cr.neighbour_corr(pred, lag), cr.neighbour_corr(mc, lag)
        assert abs(p - m) <= corr, (lag, p, m)


def test_measure_field_recovers_the_known_correlation():
    x, exact = gaussian_field(mean=_ramp(2, 10, 10, -1, 1))
    mc = cr.measure_field(x)
    assert torch.allclose(mc.mean, exact.mean, atol=0.1)
    for lag in (1, 2, 3):
        assert abs(cr.neighbour_corr(mc, lag) - cr.neighbour_corr(exact, lag)) < 0.01
    assert cr.neighbour_corr(exact, 1) > 0.5  # a strongly correlated field: the test can tell


def _conv_and_rule():
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    return conv, cr.Conv(conv.weight, conv.bias, (1, 1), (1, 1))


def test_conv_forward_matches_monte_carlo():
    conv, rule = _conv_and_rule()
    x, f = gaussian_field(mean=_ramp(2, 10, 10, 0, 1), var=_ramp(2, 10, 10, 0.5, 2.0))
    with torch.no_grad():
        close(rule.forward(f), conv(x))  # the maps element by element: the border included


def test_conv_backward_matches_monte_carlo():
    conv, rule = _conv_and_rule()
    rule.forward(gaussian_field(batch=1)[1])
    # an independent gradient field at the output, through convᵀ
    g, gf = gaussian_field(C=3, ell=1.3, seed=1)
    xr = torch.zeros((B, 2, 10, 10), dtype=DT, requires_grad=True)
    (conv(xr) * g).sum().backward()
    close(rule.backward(gf), xr.grad)


def test_strided_conv_and_avg_pool():
    torch.manual_seed(1)
    conv = nn.Conv2d(2, 2, 3, stride=2, padding=1, bias=False).double()
    x, f = gaussian_field(ell=1.5)
    with torch.no_grad():
        close(cr.Conv(conv.weight, None, (2, 2), (1, 1)).forward(f), conv(x))
        close(cr.box_conv(2, (2, 2), (2, 2), (0, 0)).forward(f), F.avg_pool2d(x, 2))


def test_relu_forward_and_backward_match_monte_carlo():
    x, f = gaussian_field(mean=_ramp(2, 10, 10, -0.4, 1.2), ell=1.2)
    rule = cr.ReLU(4)
    close(rule.forward(f), torch.relu(x), rel=0.02, corr=0.01)
    g, gf = gaussian_field(seed=2, ell=1.5)
    close(rule.backward(gf), g * (x > 0), rel=0.02, corr=0.01)


def test_bivariate_relu_is_the_arccos_kernel_at_zero_mean():
    r = torch.tensor([-0.9, -0.3, 0.0, 0.5, 0.99], dtype=DT)
    one, zero = torch.ones_like(r), torch.zeros_like(r)
    e, p = cr.bivariate_relu(zero, one, zero, one, r)
    arccos = ((1 - r * r).sqrt() + (torch.pi - torch.arccos(r)) * r) / (2 * torch.pi)
    assert torch.allclose(e, arccos, atol=1e-7)
    assert torch.allclose(p, 0.25 + torch.arcsin(r) / (2 * torch.pi), atol=1e-7)  # the orthant probability


def test_max_pool_forward_and_backward_match_monte_carlo():
    stripes = torch.tensor([0.0, 0.8] * 5, dtype=DT).expand(2, 10, 10).clone()  # odd columns win more
    x, f = gaussian_field(mean=_ramp(2, 10, 10, 0, 0.6) + stripes, ell=1.2)
    rule = cr.MaxPool((2, 2), (2, 2), samples=8192)  # the rule's own draws: P(win) ≈ 0.04 to ±5%
    close(rule.forward(f), F.max_pool2d(x, 2), rel=0.02, corr=0.02)
    # Clark's recursion: exact for two taps, an approximation for four (its Var 4% low for independent taps)
    close(cr.MaxPool((2, 2), (2, 2), method="clark").forward(f), F.max_pool2d(x, 2), rel=0.05, corr=0.02)
    g, gf = gaussian_field(H=5, W=5, seed=3, ell=1.0)
    xr = x.clone().requires_grad_(True)
    (F.max_pool2d(xr, 2) * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.03, corr=0.02)


def test_max_pool_of_independent_taps_is_the_exact_integral():
    from gatepool.analysis.probe.theory import max_of_normals

    H = 8
    corr = torch.zeros((1, 2 * H - 1, 2 * H - 1), dtype=DT)
    corr[0, H - 1, H - 1] = 1.0
    f = cr.Field(torch.zeros((1, H, H), dtype=DT), torch.ones((1, H, H), dtype=DT), corr)
    out = cr.MaxPool((2, 2), (2, 2)).forward(f)
    m, v = max_of_normals(4)  # 1.0294, 0.4917
    assert abs(float(out.mean.mean()) - m) < 0.01 and abs(float(out.var.mean()) - v) < 0.01
    assert abs(cr.neighbour_corr(out, 1)) < 0.03  # independent windows (neighbours: 1024 joint draws)


def test_clark_is_exact_for_two():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(200000, generator=g, dtype=DT)
    b = 0.6 * a + 0.8 * torch.randn(200000, generator=g, dtype=DT)
    x1, x2 = 0.3 + a, -0.2 + 1.5 * b
    m, v, _, _ = cr.clark_max(*(torch.tensor(t, dtype=DT) for t in (0.3, 1.0, -0.2, 2.25, 0.6 * 1.5)))
    mx = torch.maximum(x1, x2)
    assert abs(float(m) - float(mx.mean())) < 0.01 and abs(float(v) - float(mx.var())) < 0.02


def test_groupnorm_forward_and_backward_match_monte_carlo():
    x, f = gaussian_field(C=4, mean=_ramp(4, 10, 10, -1, 1), ell=1.5)
    rule = cr.GroupNorm(2, None, None, 1e-5)
    with torch.no_grad():  # c_p + c_q taken as its mean over the pairs: lag 2 within 0.03
        close(rule.forward(f), F.group_norm(x, 2), corr=0.03)
    g, gf = gaussian_field(C=4, seed=4, ell=1.5)
    xr = x.clone().requires_grad_(True)
    (F.group_norm(xr, 2) * g).sum().backward()
    close(rule.backward(gf), xr.grad, rel=0.04, corr=0.03)


def test_residual_add_of_independent_fields():
    x, f = gaussian_field(ell=1.0)
    y, h = gaussian_field(ell=2.0, seed=5, mean=_ramp(2, 10, 10, 0, 1))
    close(cr.add(f, h), x + y)


# ---------------------------------------------------------------------------------------------------
# the prediction through a model: its inputs are the model and the statistics, never the batch
# ---------------------------------------------------------------------------------------------------


def _small_cnn(width=8):
    from gatepool.models import ResidualCNN

    torch.manual_seed(0)
    return ResidualCNN(pool="max", width=width, groups=2)


def test_predict_takes_only_the_model_and_the_statistics():
    params = list(inspect.signature(predict_correlated).parameters)
    assert params[:2] == ["model", "input_stats"] and set(params[2:]) == {"backward", "exact_lags"}
    model = _small_cnn(width=4)
    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    stats = cr.measure_input(x)

    def refuse(module, args):  # torch.fx calls the modules it traces through with Proxies, never tensors
        if any(isinstance(a, torch.Tensor) for a in args):
            raise AssertionError("the prediction ran a module on data")

    handles = [m.register_forward_pre_hook(refuse) for m in model.modules()]
    pred = predict_correlated(model, stats)  # not one module sees a tensor
    for h in handles:
        h.remove()
    assert pred["block2"].var > 0 and pred["stem"].grad_e2 > 0 and pred["(input)"].grad_e2 > 0
    with pytest.raises(TypeError, match="input_stats"):
        predict_correlated(model, x)


@pytest.mark.slow
def test_predict_matches_the_measurement_on_noise():
    model = _small_cnn()
    x = torch.randn(512, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    pred = predict_correlated(model, cr.measure_input(x))
    acts = {}
    for n, m in model.named_modules():
        if n in ("stem", "pool1", "block1", "pool2", "block2", "head.relu"):
            m.register_forward_hook(lambda mod, a, y, n=n: acts.__setitem__(n, y.detach()))
    with torch.no_grad():
        model(x)
    for n, y in acts.items():
        measured = float(y.double().var(unbiased=False))
        assert abs(pred[n].var / measured - 1) < 0.1, (n, pred[n].var, measured)
