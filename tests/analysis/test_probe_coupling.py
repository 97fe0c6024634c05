"""Squeeze-and-excitation's gate gradient ∂L/∂s = Σ_p g_p x_p where the activations after the gate read x
through dense 1 × 1 convs (``correlated.coupling``), against Monte Carlo: x = SiLU(N(0, 1)) · s →
project 1 × 1 → BN → expand 1 × 1 → BN → SiLU, the seed gradient with a share ``dc`` constant over the
positions (a global pool's)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from gatepool.analysis.probe import correlated as cr

DT = torch.float64


def _white(C: int, H: int, mean: float = 0.0, var: float = 1.0, dc: float = 0.0) -> cr.Field:
    corr = torch.full((C, 2 * H - 1, 2 * H - 1), dc, dtype=DT)
    corr[:, H - 1, H - 1] = 1.0
    return cr.Field(torch.full((C, H, H), mean, dtype=DT), torch.full((C, H, H), var, dtype=DT), corr)


def gate_gradient_ratios(dc: float, act: str = "silu", depthwise: bool = False, B: int = 2048
                         ) -> tuple[float, float]:  # fmt: skip
    """E[(∂L/∂s)²] pooled over the channels, predicted over measured: with the coupling, without it.
    ``depthwise``: a depthwise 3 × 3 conv → BN → f after the block (MobileNetV3's, EfficientNet's)."""
    C, P, E, H, s = 32, 16, 96, 8, 0.5
    gen = torch.Generator().manual_seed(0)
    Wp = torch.randn(P, C, 1, 1, dtype=DT, generator=gen) / C**0.5
    We = torch.randn(E, P, 1, 1, dtype=DT, generator=gen) / P**0.5
    f = {"silu": F.silu, "hardswish": F.hardswish, "relu": F.relu}[act]
    Wd = torch.randn(E, 1, 3, 3, dtype=DT, generator=gen) / 3
    x = f(torch.randn(B, C, H, H, dtype=DT, generator=gen))
    y = (x * s).requires_grad_(True)
    h = F.batch_norm(F.conv2d(F.batch_norm(F.conv2d(y, Wp), None, None, training=True), We), None, None,
                     training=True)  # fmt: skip
    if depthwise:
        h = F.batch_norm(F.conv2d(f(h), Wd, padding=1, groups=E), None, None, training=True)
    seed = (1 - dc) ** 0.5 * torch.randn(h.shape, dtype=DT, generator=gen)
    seed = seed + dc**0.5 * torch.randn((B, E, 1, 1), dtype=DT, generator=gen)
    (f(h) * seed).sum().backward()
    measured = float(((y.grad * x).sum((2, 3)) ** 2).mean())

    def bn():
        return cr.BatchNorm(None, None, 1e-5, batch=B)

    def act_rule():
        return cr.ReLU() if act == "relu" else cr.Pointwise(act)

    rules = [cr.Conv(Wp, None, (1, 1), (0, 0)), bn(), cr.Conv(We, None, (1, 1), (0, 0)), bn(), act_rule()]
    if depthwise:
        rules += [cr.Conv(Wd, None, (1, 1), (1, 1), E), bn(), act_rule()]
    xf = act_rule().forward(_white(C, H))
    gate = cr.Gate()
    one = torch.ones((C, 1, 1), dtype=DT)
    sf = cr.Field(s * one, 0 * one, one)  # s constant
    f_ = gate.forward([xf, sf])
    for r in rules:
        f_ = r.forward(f_)
    g = _white(E, H, dc=dc)
    for r in reversed(rules):
        g = r.backward(g)
    with_c = float(gate.backward(g)[1].var.mean())
    without = float(gate.backward(replace(g, coupling=None))[1].var.mean())
    return with_c / measured, without / measured


@pytest.mark.parametrize("dc, act", [(1.0, "silu"), (0.6, "silu"), (1.0, "hardswish"), (1.0, "relu")])
def test_gate_gradient_through_dense_convs(dc, act):
    """2048 draws of 32 channels 8 × 8: within 4% with the coupling carried (measured 0.978, 0.987, 0.972,
    0.985); without it (g independent of x, the gate's rule before) 0.81, 0.82, 0.77, 0.93."""
    with_c, without = gate_gradient_ratios(dc, act)
    assert abs(with_c - 1) < 0.04, (with_c, without)
    assert without < 0.95 and abs(without - 1) > 2 * abs(with_c - 1), (with_c, without)


_DEPTHWISE = (
    "0.66 (0.57 without the coupling): a depthwise conv drops the coupling, and the activation after it "
    "reads x as much as the expand's does (EfficientNet-B0's features[:3]: its gate's Σ_p g x 1.51 and "
    "1.53 times the independent sum with either one's slope made constant, 2.28 with both)"
)


@pytest.mark.xfail(strict=True, reason=_DEPTHWISE)
def test_gate_gradient_through_a_depthwise_stage():
    """The same block with a depthwise 3 × 3 conv → BN → SiLU after it, 1024 draws: the coupling through the
    depthwise conv is not carried (a known failure, see ``_DEPTHWISE``)."""
    with_c, without = gate_gradient_ratios(1.0, "silu", depthwise=True, B=1024)
    assert abs(with_c - 1) < 0.04, (with_c, without)


def test_a_coupling_read_after_many_steps_is_made_in_order():
    """The steps defer their gains until a gate reads them (a transformer's coupling is never read); read
    after 300 1 × 1 convs and affine maps of two streams added halfway (600 steps: a chain that deep made
    in one call would pass Python's recursion limit), the maps are those of the gains made step by step."""
    from gatepool.analysis.probe.correlated.coupling import (
        Coupling,
        added_coupling,
        affine_coupling,
        pointwise_conv_coupling,
    )

    g = torch.Generator().manual_seed(0)
    C = 5
    maps = [torch.rand(C, 2, 3, generator=g, dtype=DT) for _ in range(4)]
    lazy = [Coupling(None, maps[0], maps[1]), Coupling(None, maps[2], maps[3])]
    gains = [torch.eye(C, dtype=DT), torch.eye(C, dtype=DT)]
    for step in range(300):
        for i in range(2):
            W = torch.randn(C, C, generator=g, dtype=DT) / C**0.5
            a = torch.rand(C, generator=g, dtype=DT) + 0.5
            lazy[i] = pointwise_conv_coupling(affine_coupling(lazy[i], a), W)
            gains[i] = W.T @ (gains[i] * a[:, None])
        if step == 149:  # the two streams meet: their sources side by side, one stream after
            lazy, gains = [added_coupling(*lazy)] * 2, [torch.cat(gains, 1)] * 2
    V, K = lazy[0].maps()
    B, l2, lk = gains[0], torch.cat(maps[0::2]), torch.cat(maps[1::2])
    assert torch.equal(V, torch.einsum("ck,khw->chw", B**4, l2))
    assert torch.equal(K, torch.einsum("ck,khw->chw", B**3, lk))
