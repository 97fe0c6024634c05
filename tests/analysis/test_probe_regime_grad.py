"""The gradient's per-sample weights of a regime (:mod:`regime`'s gradient side), against Monte Carlo on
a field where the gradient depends strongly on the gate: the inked sparse field of
``test_probe_regime`` (each sample its own ink and stroke share) through a 3×3 conv and a ReLU, a 3×3
conv over 16 channels and a ReLU, both convs with negative biases (the background maps below zero, so
both gates close on it), then the mean over the positions and unit noise on each channel. The gradient
at the first ReLU is then nonzero only near strokes, where its gate is open:
E[g² 1[x > 0]] / (E[g²] P(x > 0)) about 3 (the canvases' first ReLUs: 1.2–1.8)."""

import functools

import torch
import torch.nn.functional as F
from test_probe_regime import H, _corr, _inked

from gatepool.analysis.probe.correlated import measure_field
from gatepool.analysis.probe.correlated import regime as rg


@functools.lru_cache(maxsize=1)
def _sample():
    """(the first ReLU's input's field and regime, its measured gradient (S, C, H, W), the weights
    carried back to it from the second ReLU by the rules)."""
    x = _inked()
    g = torch.Generator().manual_seed(2)
    W1 = torch.randn(16, 1, 3, 3, generator=g, dtype=torch.float64) / 3
    b1 = -0.2 - 0.3 * torch.rand(16, generator=g, dtype=torch.float64)
    W2 = torch.randn(16, 16, 3, 3, generator=g, dtype=torch.float64) * (2 / 144) ** 0.5
    b2 = -0.2 - 0.3 * torch.rand(16, generator=g, dtype=torch.float64)
    y1 = F.conv2d(x, W1, b1, padding=1)
    h1 = F.relu(y1).requires_grad_(True)
    y2 = F.conv2d(h1, W2, b2, padding=1)
    y2.retain_grad()
    noise = torch.randn(len(x), 16, generator=g, dtype=torch.float64)
    (F.relu(y2).mean((2, 3)) * noise).sum().backward()
    f1, f2 = measure_field(y1), measure_field(y2.detach())
    r1 = rg.level(rg.conv(rg.of_input(x), W1, b1, (1, 1), (1, 1)), f1.mean, f1.var)
    r2 = rg.level(rg.conv(rg.relu(r1, f1.mean, f1.var), W2, b2, (1, 1), (1, 1)), f2.mean, f2.var)
    plain, w2 = rg.gate_weights(f2.mean, f2.var, r2, None)  # the pool's gradient: uniform weights
    assert torch.allclose(plain, rg.relu_mixture(f2.mean, f2.var, r2)[2])  # the mixture's P(x > 0)
    w1 = rg.conv_back(w2, (y2.grad**2).mean(0), W2, (1, 1), (1, 1), (H, H))
    return (y1, f1, r1), h1.grad, w1


def test_gradient_weights_against_monte_carlo():
    """At the first ReLU the gate read against the carried weights gives E[g² 1[x > 0]] /
    (E[g²] P(x > 0)) within 15% of Monte Carlo's (about 3 here); the gate independent of the gradient
    (uniform weights: the ratio 1) is more than 50% off. The weights moved back through the ReLU's gate and
    the conv follow the measured per-sample E[g²] (correlation above 0.7; the conv's spread over its taps
    is not what this field tells apart: its centre tap alone gives 2.96 and 0.79 where the rule gives
    2.84 and 0.80 against 3.15, so :func:`test_conv_back_is_the_expectation_over_the_weights` holds it)."""
    (y1, f1, r1), g, w1 = _sample()
    gate = (y1 > 0).double()
    mc = float((g * g * gate).mean(0).sum() / ((g * g).mean(0) * gate.mean(0)).sum())
    assert mc > 1.5  # the dependence at least as strong as the canvases'
    gv = (g * g).mean(0)  # E[g²] at the ReLU's output: the rule's input
    pos = rg.relu_mixture(f1.mean, f1.var, r1)[2]
    gate, _ = rg.gate_weights(f1.mean, f1.var, r1, w1)
    got = float((gv * gate).sum() / (gv * pos).sum())
    assert abs(got / mc - 1) < 0.15
    assert abs(1 / mc - 1) > 0.5
    measured = (g * g).mean(1)
    assert _corr(w1, measured / measured.mean(0).clamp_min(1e-300)) > 0.7


def test_weights_moved_back_keep_their_level():
    """The weights' mean over the samples is 1 wherever any sample has a gradient, through a conv, a
    max pool (its windows shared by their taps) and the sum of two gradients."""
    _, g, w1 = _sample()
    live = w1.mean(0) > 0
    assert torch.allclose(w1.mean(0)[live], torch.ones(int(live.sum()), dtype=torch.float64))
    gv = (g * g).mean(0)
    pooled_w, pooled_v = F.max_pool2d(w1[:, None], 2)[:, 0], F.max_pool2d(gv[None], 2)[0]
    wp = rg.pool_back(pooled_w, pooled_v, (2, 2), (2, 2), (0, 0), (H, H))
    both = rg.join(w1, gv, wp, 2 * gv)
    for w in (wp, both):
        live = w.mean(0) > 0
        assert torch.allclose(w.mean(0)[live], torch.ones(int(live.sum()), dtype=torch.float64))
    assert rg.join(None, gv, wp, gv) is None


def test_conv_back_is_the_expectation_over_the_weights():
    """Two samples' gradients at two neighbouring output positions come back as K_t = mean_i Σ_o W² at
    the taps that read each (the conv's E over its weights of (Σ_o W g)²): at an input position q their
    shares are 2 K(q − p₀) / (K(q − p₀) + K(q − p₁))."""
    W = torch.randn(5, 3, 3, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    w = torch.zeros(2, 6, 6, dtype=torch.float64)
    w[0, 2, 2] = w[1, 2, 3] = 1.0
    back = rg.conv_back(w, torch.ones(5, 6, 6, dtype=torch.float64), W, (1, 1), (1, 1), (6, 6))
    K = (W**2).sum(0).mean(0)
    for q in [(1, 2), (2, 2), (3, 3), (1, 3)]:
        k0, k1 = K[q[0] - 2 + 1, q[1] - 2 + 1], K[q[0] - 2 + 1, q[1] - 3 + 1]
        assert abs(float(back[0][q]) - float(2 * k0 / (k0 + k1))) < 1e-12
    assert float(back[0, 2, 4]) == 0 and float(back[1, 2, 1]) == 0  # beyond each one's taps
