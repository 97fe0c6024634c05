"""The correlated rules against Monte Carlo: Gaussian random fields of known correlation through each rule.

Every field is x = m(p) + √v(p) · z(p), z a stationary Gaussian field (white noise smoothed by a kernel
k, so ρ(e) = Σ_u k(u) k(u+e) / Σ k²: known exactly); the rule gets that exact Field, the Monte Carlo
pushes 4000 draws through torch's own module and measures them (``measure_field``).
"""

from __future__ import annotations

import inspect
import math

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
    rh, rw = min(4, H - 1), min(4, W - 1)  # the stencil's lags that fit the map
    corr[:, H - 1 - rh : H + rh, W - 1 - rw : W + rw] = rho[4 - rh : 5 + rh, 4 - rw : 5 + rw]
    mean = torch.zeros((C, H, W), dtype=DT) if mean is None else mean
    var = torch.ones((C, H, W), dtype=DT) if var is None else var
    return mean + var.sqrt() * z, cr.Field(mean, var, corr)


def _ramp(C, H, W, lo, hi):
    return torch.linspace(lo, hi, H * W, dtype=DT).reshape(1, H, W).expand(C, H, W).clone()


def tokens_of_a_map_ratios(model, rule, C: int, H: int, W: int, ell: float) -> tuple[float, float]:
    """(forward, backward): ``rule``'s pooled variance over Monte Carlo's for ``model(x, (H, W))`` of the
    (B, H·W, C) tokens of a Gaussian (C, H, W) map (a module called with its map's size: PVT's, Twins'),
    and of x's E[g²] from a correlated Gaussian ∂L/∂y; ``rule`` given the size first (``bind``)."""
    x, f = gaussian_field(C=C, H=H, W=W, ell=ell, mean=_ramp(C, H, W, -0.5, 0.5), batch=2000)
    rule.bind((H, W))
    xr = x.clone().requires_grad_()
    y = model(xr.flatten(2).mT, (H, W))  # (B, T, C)
    pred, mc = rule.forward(cr.FlattenPositions().forward(f)), cr.measure_field(y.detach().mT[:, :, None])
    g, gf = gaussian_field(C=C, H=1, W=H * W, seed=2, ell=1.0, var=_ramp(C, 1, H * W, 0.3, 3.0), batch=2000)
    (y * g[:, :, 0].mT).sum().backward()
    fwd = float(pred.var.mean()) / float(mc.var.mean())
    return fwd, float(rule.backward(gf).var.mean()) / float(xr.grad.pow(2).mean())


def close(pred: cr.Field, draws: torch.Tensor, *, rel=0.03, corr=0.02, lags=(1, 2)):
    """The rule's Field against the Monte Carlo ``draws`` (B, C, H, W): pooled variance within ``rel``,
    every element of the mean and variance maps within 5 of its own Monte Carlo standard errors plus
    ``rel`` of its value, the correlation at ``lags`` within ``corr``."""
    mc = cr.measure_field(draws)
    d = draws.detach().double()
    n = d.shape[0]  # the draws' own count sets their standard errors
    pv, mv = float(pred.var.mean()), float(mc.var.mean())
    assert abs(pv - mv) <= rel * mv, (pv, mv)
    se_mean = d.std(0) / n**0.5
    assert bool(((pred.mean - mc.mean).abs() <= 5 * se_mean + rel * mc.mean.abs() + 1e-12).all())
    se_var = (d - d.mean(0)).pow(2).std(0) / n**0.5
    err = (pred.var - mc.var).abs() / (5 * se_var + rel * mc.var + 1e-12)
    assert float(err.max()) <= 1.0, float(err.max())
    for lag in lags:
        p, m = cr.neighbour_corr(pred, lag), cr.neighbour_corr(mc, lag)
        assert abs(p - m) <= corr, (lag, p, m)


def test_measure_field_recovers_the_known_correlation():
    x, exact = gaussian_field(mean=_ramp(2, 10, 10, -1, 1))
    mc = cr.measure_field(x)
    assert torch.allclose(mc.mean, exact.mean, atol=0.1)
    for lag in (1, 2, 3):
        assert abs(cr.neighbour_corr(mc, lag) - cr.neighbour_corr(exact, lag)) < 0.01
    assert cr.neighbour_corr(exact, 1) > 0.5  # a strongly correlated field: the test can tell


def test_measure_field_block_by_block_is_the_whole_batch_at_once():
    """Samples and channels a block at a time (a large output's transforms bounded) give the moments and
    the lag sums of the whole batch at once, to rounding: each block centred by the batch's mean, every
    sample and channel counted once."""
    x = gaussian_field(C=5, H=6, W=7, mean=_ramp(5, 6, 7, -1, 1))[0][:40]
    whole, blocks = cr.measure_field(x), cr.measure_field(x, block=100)  # 2 channels, 2 samples a block
    for a, b in ((whole.mean, blocks.mean), (whole.var, blocks.var), (whole.lag_sums(), blocks.lag_sums())):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def assert_walk_holds(model: nn.Module, x: torch.Tensor, names, fwd: float = 0.10, bwd: float = 0.15):
    """The correlated walk through ``model`` against the measurement on ``x``: every named module's output
    variance within ``fwd`` and its gradient's E[g²] within ``bwd`` (relative), the backward seeded with
    unit-variance noise at the logits as the prediction assumes. Returns the prediction."""
    pred = predict_correlated(model, cr.measure_input(x))
    assert not pred.notes, pred.notes
    acts, grads = {}, {}

    def hook(mod, args, y, n):
        y = y[0] if isinstance(y, tuple) else y  # nn.MultiheadAttention: (output, weights)
        acts[n] = y.detach()
        y.register_hook(lambda g: grads.__setitem__(n, g.detach()))

    handles = [
        model.get_submodule(n).register_forward_hook(lambda m, a, y, n=n: hook(m, a, y, n)) for n in names
    ]
    out = model(x.requires_grad_())
    seed = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=DT)
    (out * seed / seed.pow(2).mean().sqrt()).sum().backward()  # E[g²] = 1 at the logits, as predicted
    for h in handles:
        h.remove()
    assert set(acts) == set(names), set(names) - set(acts)
    for n in names:
        row = pred[n]
        assert row.var is not None and row.grad_e2 is not None, (n, row.note)
        assert abs(row.var / float(acts[n].var(unbiased=False)) - 1) < fwd, (n, row.var)
        assert abs(row.grad_e2 / float(grads[n].pow(2).mean()) - 1) < bwd, (n, row.grad_e2)
    return pred


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
    assert params[:2] == ["model", "input_stats"] and set(params[2:]) == {"backward", "exact_lags", "batch"}
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


def test_a_model_that_ends_in_a_map_gets_its_seed_at_every_position():
    """The unit-noise seed of a map output (a segmentation head, a block alone) is N(0, 1) at each of its
    positions: the input's E[g²] of one 3 × 3 conv is Σ w² over the taps landing inside (the walk had
    seeded a (C, 1, 1) field and its conv backward failed on the map's lags)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, padding=1, bias=False).double()
    pred = predict_correlated(conv, cr.unit_noise(3, (6, 6)))
    inside = F.conv_transpose2d(torch.ones(1, 5, 6, 6, dtype=DT), conv.weight.detach() ** 2, padding=1)
    assert pred["(input)"].grad is not None and pred["(input)"].grad.shape == (3, 6, 6)
    assert torch.allclose(pred["(input)"].grad.var, inside[0], rtol=1e-9)


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


# ---------------------------------------------------------------------------------------------------
# the rules a torchvision ResNet needs: BatchNorm, the padded k3 s2 max pool (of a ReLU's output), the
# strided convs' backward, the global pool of a map with a pattern of means, the ReLU after a residual add
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, s, p, H", [(7, 2, 3, 12), (1, 2, 0, 10), (3, 2, 1, 9)])
def test_strided_conv_backward_matches_monte_carlo(k, s, p, H):
    torch.manual_seed(2)
    conv = nn.Conv2d(2, 3, k, stride=s, padding=p, bias=False).double()
    rule = cr.Conv(conv.weight, None, (s, s), (p, p))
    rule.forward(gaussian_field(H=H, W=H, batch=1)[1])
    Ho = (H + 2 * p - k) // s + 1
    g, gf = gaussian_field(C=3, H=Ho, W=Ho, ell=1.3, seed=1)
    xr = torch.zeros((B, 2, H, H), dtype=DT, requires_grad=True)
    (conv(xr) * g).sum().backward()
    # a 1×1 stride-2 conv's input gradient is 0 at every other position: lag 1 has no correlation
    close(rule.backward(gf), xr.grad, lags=(2,) if k == 1 else (1, 2))


def test_batchnorm_train_and_eval_match_monte_carlo():
    # channel 0 has a strong pattern of means over the positions: the batch statistics' divisor is
    # the positions' variance plus that pattern's spread (without it the output Var would be 1.6×)
    mean = torch.stack([_ramp(1, 10, 10, -1.5, 1.5)[0], torch.full((10, 10), 0.4, dtype=DT)])
    x, f = gaussian_field(mean=mean, var=_ramp(2, 10, 10, 0.5, 2.0), ell=1.5)
    bn = nn.BatchNorm2d(2).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.5, 0.7]))
        bn.bias.copy_(torch.tensor([0.2, -0.3]))
    rule = cr.BatchNorm(bn.weight, bn.bias, bn.eps)
    with torch.no_grad():
        close(rule.forward(f), bn.train()(x))
    g, gf = gaussian_field(seed=6, ell=1.2)
    xr = x.clone().requires_grad_(True)
    (bn.train()(xr) * g).sum().backward()
    close(rule.backward(gf), xr.grad)  # the batch-mean and x̂ projections: 1/(B·H·W) of E[g²]
    bn.eval()  # running statistics: one affine map per channel
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.3, -0.2]))
        bn.running_var.copy_(torch.tensor([2.0, 0.5]))
        rule = cr.BatchNorm(bn.weight, bn.bias, bn.eps, bn.running_mean, bn.running_var)
        close(rule.forward(f), bn(x))


def test_padded_max_pool_k3_s2_p1_matches_monte_carlo():
    x, f = gaussian_field(mean=_ramp(2, 10, 10, -0.5, 0.8), ell=1.2)
    rule = cr.MaxPool((3, 3), (2, 2), (1, 1))
    # lag 2: windows two apart are first order in their cross-covariance (Stein's lemma on each side),
    # 0.02 low in this field (0.154 against 0.174); lag 1 is drawn jointly
    close(rule.forward(f), F.max_pool2d(x, 3, 2, 1), rel=0.02, corr=0.03)
    g, gf = gaussian_field(H=5, W=5, seed=3, ell=1.0)
    xr = x.clone().requires_grad_(True)
    (F.max_pool2d(xr, 3, 2, 1) * g).sum().backward()
    # windows overlap: a position that wins two windows gets both gradients (E[g²] 2 P(both) Cov more);
    # lag 2 pairs windows two apart, whose winners are taken as independent: 0.154 against 0.174 here
    close(rule.backward(gf), xr.grad, rel=0.03, corr=0.03)


def test_max_pool_of_a_relu_draws_the_pre_activation():
    y, f = gaussian_field(mean=_ramp(2, 10, 10, -0.8, 0.5), ell=1.2)
    relu, rule = cr.ReLU(), cr.MaxPool((3, 3), (2, 2), (1, 1))
    r = relu.forward(f)
    out = rule.forward(r, pre=f)
    mc = F.max_pool2d(torch.relu(y), 3, 2, 1)
    # lag 2 first order as above; with the ReLU's kink the second order shows more (0.11 predicted,
    # 0.14 here)
    close(out, mc, rel=0.02, corr=0.04)
    gauss = cr.MaxPool((3, 3), (2, 2), (1, 1)).forward(r)  # a max of normals of the ReLU's moments
    assert float(gauss.var.mean()) < 0.8 * float(mc.var())  # is far from it: why pre is drawn
    g, gf = gaussian_field(H=5, W=5, seed=3, ell=1.0)
    yr = y.clone().requires_grad_(True)
    ry = torch.relu(yr)
    ry.retain_grad()
    (F.max_pool2d(ry, 3, 2, 1) * g).sum().backward()
    at_relu = rule.backward(gf)  # torch's winner of an all-zero window: its first tap
    close(at_relu, ry.grad, rel=0.03, corr=0.03)  # lag 2: windows two apart, as above
    close(relu.backward(at_relu), yr.grad, rel=0.03, corr=0.03)  # the ReLU's gate, jointly


def test_global_pool_keeps_the_pattern_of_means():
    # each channel a fixed pattern of means over its 4×4 positions, averaging to 0.5: the pool averages
    # the pattern away; positions treated as independent would keep 1/16 of the pattern's variance
    pattern = _ramp(2, 4, 4, -1.0, 2.0)
    pattern[1] = pattern[1].flip(-1)
    x, f = gaussian_field(H=4, W=4, mean=pattern, var=_ramp(2, 4, 4, 0.3, 1.0), ell=1.5)
    model = nn.Sequential(nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten())
    pred = predict_correlated(model, f, backward=None)
    measured = model(x).double()  # (B, 2)
    mv = float(measured.pow(2).mean() - measured.mean() ** 2)
    assert pred["0"].var == pytest.approx(mv, rel=0.03)
    within = float((f.var + f.mean**2).mean() - f.mean.mean() ** 2)  # the input's pooled Var
    assert abs(within / 16 - mv) > 0.1 * mv  # the independent rule would miss it


def test_relu_series_is_the_bivariate_integral_up_to_half():
    g = torch.Generator().manual_seed(0)
    m1, m2 = (1.5 * torch.randn(500, generator=g, dtype=DT) for _ in range(2))
    s1, s2 = (0.2 + torch.rand(500, generator=g, dtype=DT) for _ in range(2))
    r = (2 * torch.rand(500, generator=g, dtype=DT) - 1) * 0.5
    e, p = cr.bivariate_relu(m1, s1, m2, s2, r)
    (c1, k1), (c2, k2) = cr.relu_series_maps(m1, s1), cr.relu_series_maps(m2, s2)
    mu1, _, p1 = cr.relu_moments_map(m1, s1**2)
    mu2, _, p2 = cr.relu_moments_map(m2, s2**2)
    fact = [math.factorial(n) for n in range(1, len(c1) + 1)]
    cov = sum(r**n / f * a * b for n, f, a, b in zip(range(1, 99), fact, c1, c2))
    both = p1 * p2 + sum(r**n / f * a * b for n, f, a, b in zip(range(1, 99), fact, k1, k2))
    assert float((e - mu1 * mu2 - cov).abs().max()) < 1e-5 and float((p - both).abs().max()) < 1e-5


def test_relu_of_a_residual_sum_matches_monte_carlo():
    from dataclasses import replace

    from gatepool.analysis.probe.theory import relu_of_sum

    b, fb = gaussian_field(mean=_ramp(2, 10, 10, -0.6, 0.4), ell=1.0, seed=7)
    y, fy = gaussian_field(mean=_ramp(2, 10, 10, -0.5, 0.5), var=_ramp(2, 10, 10, 0.5, 1.5), ell=1.5, seed=8)
    relu_y, relu = cr.ReLU(), cr.ReLU()
    z = replace(cr.add(fb, relu_y.forward(fy)), parts=(fb, relu_y.law))
    out = relu.forward(z)
    mc = torch.relu(b + torch.relu(y))
    close(out, mc, rel=0.02, corr=0.03)
    e, _, e2, pos = relu_of_sum(0.1, 1.0, -0.2, 0.8)  # the quadrature against scipy's
    mb, vb, my, vy = (torch.tensor([v], dtype=DT) for v in (0.1, 1.0, -0.2, 0.8))
    ours = cr.relu_of_sum_map(mb, vb, cr.relu_law(my, vy))
    assert torch.allclose(torch.stack(ours[:3])[:, 0], torch.tensor([e, e2, pos], dtype=DT), atol=1e-9)
    gauss = cr.ReLU().forward(cr.add(fb, relu_y.forward(fy)))  # the sum as a normal of its moments
    assert abs(float(gauss.var.mean()) / float(mc.var(0).mean()) - 1) > 0.03  # is off: why the parts
    # backward: the gradient reaching y through the add and the stream's ReLU passes two gates that are
    # not independent, 1[b + ReLU(y) > 0] and 1[y > 0]
    g, gf = gaussian_field(seed=9, ell=1.2)
    yr = y.clone().requires_grad_(True)
    (torch.relu(b + torch.relu(yr)) * g).sum().backward()
    gz = relu.backward(gf)
    # gz carries the stream's gate: E[g²] per position by the joint gate; the lags take each gate's own
    # correlation (the four-way orthant of two positions' two gates is not carried): 0.59 against 0.64
    close(relu_y.backward(gz), yr.grad, rel=0.03, corr=0.06)
    independent = relu_y.backward(replace(gz, stream_gate=None))
    assert float(independent.var.mean()) < 0.95 * float(yr.grad.var(0).mean())


def test_a_residual_stream_keeps_its_law_block_after_block():
    # z_k = b_k + ReLU(z_{k−1}), six blocks (a ResNet stage's identity blocks): every ReLU skews the
    # stream. Carried as the law of ReLU(z) (atoms), the output's moments hold block after block; a
    # normal fitted to the sum's moments at each block loses variance (0.94, 0.91, … of the measured)
    g = torch.Generator().manual_seed(0)
    n = 400_000
    mb, vb = torch.full((4,), 0.1, dtype=DT), torch.linspace(0.5, 1.5, 4, dtype=DT)  # per position
    z = torch.randn(n, 4, generator=g, dtype=DT) * 2**0.5  # the first block's sum: normal
    law = cr.relu_law(torch.zeros(4, dtype=DT), torch.full((4,), 2.0, dtype=DT))
    m_fit, v_fit = torch.zeros(4, dtype=DT), torch.full((4,), 2.0, dtype=DT)  # the normal fit of the sum
    for _ in range(6):
        z = mb + vb.sqrt() * torch.randn(n, 4, generator=g, dtype=DT) + torch.relu(z)
        mc = torch.relu(z)
        mean, e2, pos, _ = cr.relu_of_sum_map(mb, vb, law)
        assert torch.allclose(mean, mc.mean(0), rtol=0.01)
        assert torch.allclose(e2 - mean**2, mc.var(0), rtol=0.02)
        assert torch.allclose(pos, (z > 0).double().mean(0), atol=0.005)
        law = cr.relu_of_sum_law(mb, vb, law)
        assert torch.allclose(law.w.sum(-1), torch.ones(4, dtype=DT), atol=1e-9)
        rm, re2, _ = cr.relu_moments_map(m_fit, v_fit)
        m_fit, v_fit = mb + rm, vb + re2 - rm**2
    fm, fe2, _ = cr.relu_moments_map(m_fit, v_fit)
    assert float(((fe2 - fm**2) / mc.var(0)).max()) < 0.95  # the normal fit: why the law is carried


def test_the_stream_law_is_the_same_made_a_block_of_positions_at_a_time():
    # relu_of_sum_law takes the positions a chunk at a time (memory) and makes their mixture densities in
    # place a block at a time (cache): one position a block, or three, in chunks of 5, gives the atoms of
    # all at once
    g = torch.Generator().manual_seed(1)
    m, v = torch.randn(7, 5, generator=g, dtype=DT), torch.rand(7, 5, generator=g, dtype=DT) + 0.1
    law = cr.relu_law(m, v)
    mb, vb = torch.randn(7, 5, generator=g, dtype=DT), torch.rand(7, 5, generator=g, dtype=DT)
    vb[0, :2] = 0.0  # a constant branch: the shifted atoms, beside the others
    whole = cr.relu_of_sum_law(mb, vb, law)
    terms = 48 * law.x.shape[-1]  # a position's
    for per_chunk, per_block in ((35, 1), (35, 3), (5, 3)):
        part = cr.relu_of_sum_law(mb, vb, law, chunk=per_chunk * terms, block=per_block * terms)
        assert torch.equal(part.x, whole.x) and torch.equal(part.w, whole.w), (per_chunk, per_block)


def test_input_channels_that_are_copies_fold_into_the_first_conv():
    # a grey image as RGB: three copies of one channel; a conv sums the three filters, which the
    # per-channel state (channels independent) would not: its Var would be Σ_i |W_i|² instead of |Σ_i W_i|²
    y, _ = gaussian_field(C=1, mean=_ramp(1, 10, 10, -0.5, 0.5), ell=1.5)
    x = y.expand(-1, 3, -1, -1)  # (B, 3, H, W)
    stats = cr.measure_input(x)
    mix, z = stats.components
    assert mix.shape == (3, 1) and z.shape == (1, 10, 10)  # one component
    torch.manual_seed(3)
    conv = nn.Conv2d(3, 4, 3, padding=1).double()
    rule = cr.Conv(conv.weight, conv.bias, (1, 1), (1, 1))
    with torch.no_grad():
        out = conv(x)
        close(rule.forward(stats), out)
        per_channel = rule.forward(cr.measure_field(x)).var.mean((1, 2)) / out.var(0).mean((1, 2))
    assert float((per_channel - 1).abs().max()) > 0.2  # the channels as independent: far off


class _MeanHead(nn.Module):
    """A conv net whose head averages the positions by ``x.mean([2, 3])`` (MNASNet's, EfficientNet-style
    heads written without a pool module)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).mean([2, 3]))


def test_a_mean_over_the_positions_is_the_global_pool():
    torch.manual_seed(0)
    model = _MeanHead().double()
    x = torch.randn(512, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT)
    pred = assert_walk_holds(model, x, ["conv", "relu", "fc"])
    assert pred["(input)"].grad is not None  # the backward reached the input through the mean
