"""The gradient's dependence on the value through a ReLU (``correlated.relu_dependence``), against Monte
Carlo: the closed forms of the coefficients, the gradient at a ReLU whose output's gradient depends on it,
and MobileNetV3's ReLU blocks (expand → BN → ReLU → depthwise → BN → ReLU)."""

from __future__ import annotations

import pytest
import torch
from test_probe_tv_drifts import _white, block_gradient_ratios

from gatepool.analysis.probe import correlated as cr

DT = torch.float64


def _draws(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, dtype=DT, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("m, s", [(0.2, 1.1), (-0.7, 0.8)])
def test_relu_backward_gives_the_dependence_on_its_input(m, s):
    """k = 1[x > 0], x ~ N(m, s²): β₁ = E[k He₁]/E[k], β₂ = E[k He₂]/(2 E[k]) (k² = k: r the same), the
    closed forms against 10⁶ draws (within 0.01; they are 0.3–1.5)."""
    rule = cr.ReLU()
    rule.forward(_white(1, 2, 2, m, s * s))
    b1, b2, r1, r2 = (float(t.mean()) for t in rule.backward(_white(1, 2, 2)).dependence)
    z = _draws(1_000_000, 0)
    k = (m + s * z > 0).to(DT)
    want = [(k * z).mean() / k.mean(), (k * (z * z - 1)).mean() / (2 * k.mean())]
    for got, w in zip((b1, b2, r1, r2), want * 2):
        assert abs(got - float(w)) < 0.01, ((b1, b2, r1, r2), [float(t) for t in want])
    assert abs(b1) > 0.3  # the test can tell


@pytest.mark.parametrize("beta", [(0.35, 0.3), (-0.4, 0.2)])
def test_relu_reads_the_dependence_of_its_gradient(beta):
    """g with E[g² | y] = 1 + β₁ η + β₂ (η² − 1), η the output's standardized value: E[1[x > 0] g²] within
    0.5% of 10⁶ draws, where taking g independent of y (E[g²] P(x > 0)) is over 10% off; and the input
    gradient's own β₁, β₂ those of K = 1[x > 0] E[g² | y] (within 0.01)."""
    m, s = 0.1, 1.0
    rule = cr.ReLU()
    out = rule.forward(_white(1, 2, 2, m, s * s))
    g = _white(1, 2, 2)
    g.dependence = tuple(torch.full_like(g.var, b) for b in beta) + (None, None)
    back = rule.backward(g)
    got = float(back.var.mean())
    plain = float(rule.backward(_white(1, 2, 2)).var.mean())
    z = _draws(1_000_000, 1)
    x = m + s * z
    y = x.clamp_min(0)
    eta = (y - float(out.mean.mean())) / float(out.var.mean()) ** 0.5
    k = (x > 0).to(DT) * (1 + beta[0] * eta + beta[1] * (eta * eta - 1))
    want = float(k.mean())
    assert abs(got / want - 1) < 0.005, (got, want)
    assert abs(plain / want - 1) > 0.1, (plain, want)
    b1, b2 = (float(t.mean()) for t in back.dependence[:2])
    assert abs(b1 - float((k * z).mean()) / want) < 0.01, b1
    assert abs(b2 - float((k * (z * z - 1)).mean()) / (2 * want)) < 0.01, b2


_DW5_LOSS = (
    "0.970 with ReLU's shape (relu_shape): the 5 × 5 depthwise step on the 4 × 4 map alone loses 2.8% "
    "(0.999 at its output, 0.971 at its input: the dependence's second-order terms left out); the "
    "Gaussian second ReLU's gate, 0.4% high, had offset it (0.973)"
)


@pytest.mark.parametrize(
    "k, dc",
    [(3, 0.0), (3, 0.6), pytest.param(5, 0.6, marks=pytest.mark.xfail(strict=True, reason=_DW5_LOSS))],
)
def test_relu_block_gradient_at_the_expansion(k, dc):
    """4096 draws of 8 channels 4 × 4 through expand (32) → BN → ReLU → depthwise k × k → BN → ReLU, the
    seed gradient with a share ``dc`` constant over the positions (a global pool's): E[g²] at the first
    ReLU's input within 3% with the dependence carried (measured 0.998, 1.012, 0.970: the last a known
    failure, see ``_DW5_LOSS``); g taken independent of u: 0.999, 0.911, 0.843 (ReLU's slope is a step: a
    white seed hardly sees it, a correlated one does)."""
    with_dep, without = block_gradient_ratios("relu", k, dc)
    assert abs(with_dep - 1) < 0.03, (with_dep, without)
    if dc:
        assert without < 0.92 and abs(without - 1) > 2 * abs(with_dep - 1), (with_dep, without)


def test_a_constant_input_gates_as_relu_does():
    """x = m exactly (s = 0): the gate is 1[m > 0], torch's ReLU's slope (0 at m = 0), as the plain rule's."""
    mean = torch.tensor([-1.0, 0.0, 2.0], dtype=DT)
    ek, _ = cr.relu_dependence.relu_dependence(mean, torch.zeros(3, dtype=DT), None)
    assert torch.allclose(ek, torch.tensor([0.0, 0.0, 1.0], dtype=DT), rtol=0, atol=1e-300), ek
