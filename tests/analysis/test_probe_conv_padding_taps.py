"""A conv whose kernel is larger than its map (ConvNeXt-T's 7 × 7 depthwise on 2 × 2 at 64 × 64): most taps
only ever read the padding, and the backward leaves them out (they add nothing; with them the pairs of one
depthwise conv of 768 channels took 3.9 GB). Its gradient against Monte Carlo."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gatepool.analysis.probe import correlated as cr

DT = torch.float64


@pytest.mark.parametrize("groups, hw", [(1, 2), (6, 2), (6, 1)])
def test_backward_of_a_kernel_larger_than_the_map(groups, hw):
    """g_out with correlation 0.5 at every lag (a part constant over the positions) through a 7 × 7 conv
    with padding 3 on a ``hw`` × ``hw`` map: the input gradient's E[g²] per channel and position within 2%
    of 10⁵ draws, and its lag sums within 0.02 of the variance."""
    torch.manual_seed(0)
    C = 6
    w = torch.randn(C, C // groups, 7, 7, dtype=DT) / 7
    rule = cr.Conv(w, None, (1, 1), (3, 3), groups)
    corr = torch.full((C, 2 * hw - 1, 2 * hw - 1), 0.5, dtype=DT)
    corr[:, hw - 1, hw - 1] = 1.0
    ones = torch.ones((C, hw, hw), dtype=DT)
    rule.forward(cr.Field(0 * ones, ones, corr))
    got = rule.backward(cr.Field(0 * ones, ones, corr.clone()))
    B = 100_000
    gen = torch.Generator().manual_seed(1)
    g = 0.5**0.5 * (torch.randn((B, C, hw, hw), dtype=DT, generator=gen)
                    + torch.randn((B, C, 1, 1), dtype=DT, generator=gen))  # fmt: skip
    x = torch.zeros((B, C, hw, hw), dtype=DT, requires_grad=True)
    (F.conv2d(x, w, None, 1, 3, 1, groups) * g).sum().backward()
    measured = x.grad.pow(2).mean(0)  # (C, hw, hw)
    assert torch.allclose(got.var, measured, rtol=0.02), (got.var, measured)
    want = cr.measure_field(x.grad)
    assert float((got.lag_sums() - want.lag_sums()).abs().max()) < 0.02 * float(measured.sum((1, 2)).max())
