"""The gradient's dependence on the value (``Field.dependence``) through an activation, its norm and a
depthwise conv, against Monte Carlo.

A depthwise conv's output reads a few inputs of one channel, so one input x_p moves the activation
after its norm, and the gradient that comes back to x_p through that activation's slope depends on x_p.
The activation before the conv then sees E[f'(u)² g²] ≠ E[f'(u)²] E[g²]: in MobileNetV3-small's blocks
(Hardswish, 5 × 5 depthwise) 1.31× the product, the prediction's gradient 0.73 of the measurement at
every expansion, block after block (0.45 at the early blocks).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import correlated as cr

DT = torch.float64
ACTS = {"hardswish": F.hardswish, "silu": F.silu, "relu6": F.relu6}


def _white(C: int, H: int, W: int, mean: float = 0.0, var: float = 1.0, dc: float = 0.0) -> cr.Field:
    """A field of correlation ``dc`` at every lag but 0 (a part constant over the positions), 1 at 0."""
    corr = torch.full((C, 2 * H - 1, 2 * W - 1), dc, dtype=DT)
    corr[:, H - 1, W - 1] = 1.0
    return cr.Field(torch.full((C, H, W), mean, dtype=DT), torch.full((C, H, W), var, dtype=DT), corr)


def _draws(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, dtype=DT, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(ACTS))
def test_pointwise_backward_gives_the_dependence_on_its_input(name):
    """g = f'(x) G, x ~ N(m, s²): E[f'(x)² | z] ≈ E[f'²](1 + β₁ He₁ + β₂ He₂) and E[f'(x) | z] ∝ 1 + r₁ He₁
    + r₂ He₂, the Hermite projections, against 10⁶ draws (within 0.01; they are 0.1–0.9)."""
    m, s = 0.2, 1.1
    rule = cr.Pointwise(name)
    rule.forward(_white(1, 2, 2, m, s * s))
    b1, b2, r1, r2 = (float(t.mean()) for t in rule.backward(_white(1, 2, 2)).dependence)
    z = _draws(1_000_000, 0)
    x = (m + s * z).requires_grad_()
    (d,) = torch.autograd.grad(ACTS[name](x).sum(), x)
    k = d * d
    he2 = z * z - 1
    want = [(k * z).mean() / k.mean(), (k * he2).mean() / (2 * k.mean()),
            (d * z).mean() / d.mean(), (d * he2).mean() / (2 * d.mean())]  # fmt: skip
    for got, w in zip((b1, b2, r1, r2), want):
        assert abs(got - float(w)) < 0.01, (name, (b1, b2, r1, r2), [float(t) for t in want])
    assert max(abs(b1), abs(r1)) > 0.1  # the test can tell


def test_pointwise_reads_the_dependence_of_its_gradient():
    """g with E[g² | y] = 1 + β₁ η + β₂ (η² − 1), η the output's standardized value: the gradient at the
    input E[f'(x)² g²] within 0.5% of 10⁶ draws, where taking g independent of x is 10% off."""
    m, s, beta = 0.1, 1.0, (0.35, 0.3)
    rule = cr.Pointwise("hardswish")
    out = rule.forward(_white(1, 2, 2, m, s * s))
    g = _white(1, 2, 2)
    g.dependence = tuple(torch.full_like(g.var, b) for b in beta) + (None, None)
    got = float(rule.backward(g).var.mean())
    plain = float(rule.backward(_white(1, 2, 2)).var.mean())
    x = (m + s * _draws(1_000_000, 1)).requires_grad_()
    y = F.hardswish(x)
    (d,) = torch.autograd.grad(y.sum(), x)
    eta = (y.detach() - float(out.mean.mean())) / float(out.var.mean()) ** 0.5
    want = float((d * d * (1 + beta[0] * eta + beta[1] * (eta * eta - 1))).mean())
    assert abs(got / want - 1) < 0.005, (got, want)
    assert abs(plain / want - 1) > 0.1, (plain, want)


class _Expand(nn.Module):
    """MobileNetV3's expansion and depthwise steps: 1×1 conv → BN → f → depthwise k×k → BN → f (f one of
    ``ACTS`` or ReLU)."""

    def __init__(self, c: int, e: int, k: int, act: str) -> None:
        super().__init__()
        self.expand, self.bn1 = nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e)
        self.dw = nn.Conv2d(e, e, k, padding=k // 2, groups=e, bias=False)
        self.bn2, self.act = nn.BatchNorm2d(e), F.relu if act == "relu" else ACTS[act]

    def forward(self, x):
        self.u = self.bn1(self.expand(x))  # the first activation's input (its gradient: the test's)
        self.u.retain_grad()
        return self.act(self.bn2(self.dw(self.act(self.u))))


def _rules(b: _Expand, act: str) -> list:
    def f():
        return cr.ReLU() if act == "relu" else cr.Pointwise(act)

    return [cr.Conv(b.expand.weight, None, (1, 1), (0, 0)), cr.BatchNorm(b.bn1.weight, b.bn1.bias, b.bn1.eps),
            f(), cr.Conv(b.dw.weight, None, (1, 1), b.dw.padding, b.dw.groups),
            cr.BatchNorm(b.bn2.weight, b.bn2.bias, b.bn2.eps), f()]  # fmt: skip


def block_gradient_ratios(act: str, k: int, dc: float) -> tuple[float, float]:
    """E[g²] at the first activation's input of :class:`_Expand`, predicted over measured (4096 draws of 8
    channels 4 × 4, the seed gradient with a share ``dc`` constant over the positions, as a global pool's):
    with the gradient's dependence on the value carried, and without it (g independent of u)."""
    torch.manual_seed(0)
    block = _Expand(8, 32, k, act).double()
    B, H = 4096, 4
    x = torch.randn(B, 8, H, H, dtype=DT, generator=torch.Generator().manual_seed(1))
    y = block(x)  # BatchNorm in training: the batch's statistics (4096 × 16 values per channel)
    gen = torch.Generator().manual_seed(2)
    seed = (1 - dc) ** 0.5 * torch.randn(y.shape, dtype=DT, generator=gen)
    seed = seed + dc**0.5 * torch.randn((B, 32, 1, 1), dtype=DT, generator=gen)
    (y * seed).sum().backward()
    measured = float(block.u.grad.pow(2).mean())

    def predict(carry: bool) -> float:
        rules = _rules(block, act)
        f = _white(8, H, H)
        for r in rules:
            f = r.forward(f)
        g = _white(32, H, H, dc=dc)
        for r in reversed(rules[2:]):  # back to the first activation's input
            g = r.backward(g if carry else replace(g, dependence=None))
        return float(g.var.mean())

    return predict(True) / measured, predict(False) / measured


@pytest.mark.parametrize("act, k, dc", [("hardswish", 5, 0.0), ("hardswish", 5, 0.6), ("silu", 3, 0.6)])
def test_depthwise_block_gradient_at_the_expansion(act, k, dc):
    """4096 draws of 8 channels 4 × 4 through expand (32) → BN → f → depthwise k × k → BN → f, the seed
    gradient with a share ``dc`` constant over the positions (as a global pool's): E[g²] at the first
    activation's input within 3% with the dependence carried (measured 0.997, 0.996, 1.026); without it
    (g independent of u) 0.92, 0.71, 0.81: Hardswish's and SiLU's f'² are convex, so the few taps' gates
    make g² grow with u, the more where the gradient's pairs of positions are correlated."""
    with_dep, without = block_gradient_ratios(act, k, dc)
    assert abs(with_dep - 1) < 0.03, (with_dep, without)
    assert without < 0.94 and abs(without - 1) > 2 * abs(with_dep - 1), (with_dep, without)


def test_dense_conv_carries_no_dependence():
    """A conv whose outputs read several channels moves by O(1/fan-in) per input: none carried."""
    conv = cr.Conv(torch.randn(4, 4, 3, 3, dtype=DT), None, (1, 1), (1, 1))
    conv.forward(_white(4, 4, 4))
    g = _white(4, 4, 4)
    g.dependence = (torch.ones_like(g.var), torch.ones_like(g.var), torch.ones_like(g.var), None)
    assert conv.backward(g).dependence is None
    dw = cr.Conv(torch.randn(4, 1, 3, 3, dtype=DT), None, (1, 1), (1, 1), groups=4)
    dw.forward(_white(4, 4, 4))
    dep = dw.backward(g).dependence
    assert dep is not None and math.isfinite(float(dep[1].abs().max())) and float(dep[1].mean()) > 0


class _FirePool(nn.Module):
    """SqueezeNet's Fire then its max pool: two convs → ReLU each → cat → MaxPool2d(3, 2), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.e1, self.e3 = nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3, padding=1)
        self.r1, self.r3 = nn.ReLU(), nn.ReLU()
        self.pool = nn.MaxPool2d(3, 2)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.head(self.pool(torch.cat([self.r1(self.e1(x)), self.r3(self.e3(x))], 1)))


@pytest.mark.slow
def test_max_pool_of_a_cat_of_relu_outputs_draws_their_inputs():
    """The pool sends the gradient to its windows' winners, nearly always active: through a cat of two
    ReLU outputs the gradient at the ReLUs' inputs is the pool's through their pre-activations (as for a
    pool of one ReLU's output), not E[g²] P(x > 0). 2048 N(0, 1) images of 4 × 11 × 11, seed 0: both convs'
    gradients within 5% of the measurement (0.984, 0.992; as the gate's independent product 0.44, 0.50)."""
    from gatepool.analysis.probe.measure import measure

    torch.manual_seed(0)
    model = _FirePool().double()
    x = torch.randn(2048, 4, 11, 11, dtype=DT, generator=torch.Generator().manual_seed(1))
    report = measure(model, x, correlated=True, prediction=False, samples=0)
    for name in ("e1", "e3", "pool"):
        row = report.rows[name]
        ratio = row.predicted.grad_e2 / row.backward.e2
        assert abs(ratio - 1) < 0.05, (name, ratio)
