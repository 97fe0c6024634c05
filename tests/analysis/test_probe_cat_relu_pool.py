"""A cat of ReLU outputs read by a max pool and by a conv (Inception's and GoogLeNet's blocks: the next
block's pool branch and its 1 × 1 convs read the same cat). The pool's gradient reaches only its
windows' winners, where x > 0: the ReLUs' gate is not independent of it. The pool brings the gradient at
the ReLUs' inputs (``pre_relu``); the cat splits each user's gradient on its own, so the ReLU takes the
pool's part through the pool's joint gate and the conv's through its own, not their sum through one
independent gate (which under-predicted the ReLUs' input gradient by the pool's share times P(x ≤ 0))."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from test_probe_maxpool_law import measured


class _CatPool(nn.Module):
    """Two ReLU branches, their cat read by a 1 × 1 conv and by a 3 × 3 stride-1 max pool then a 1 × 1
    conv; the two cat again, then a Linear over the flattened map."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_a, self.relu_a = nn.Conv2d(4, 6, 3, padding=1), nn.ReLU()
        self.conv_b, self.relu_b = nn.Conv2d(4, 6, 1), nn.ReLU()
        self.one = nn.Conv2d(12, 4, 1)
        self.pool, self.after = nn.MaxPool2d(3, 1, 1), nn.Conv2d(12, 8, 1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(12 * 6 * 6, 10))

    def forward(self, x):
        c = torch.cat([self.relu_a(self.conv_a(x)), self.relu_b(self.conv_b(x))], 1)
        return self.head(torch.cat([self.one(c), self.after(self.pool(c))], 1))


@pytest.fixture(scope="module")
def report():
    return measured(_CatPool, 1024, 4, 6, 6)


def test_relu_input_gradient_of_a_pooled_cat(report):
    """1024 N(0, 1) images of 4 × 6 × 6, seed 0's init: across each ReLU the gradient's ratio to the
    measurement (at its input over at its output) within 4%, 0.999 and 1.006, where one independent gate
    for the pool's part too gave 0.585 and 0.594 (the ratios at the inputs 0.998 and 1.101, at the outputs
    0.999 and 1.094: the cat's other channels are correlated with these, which the state drops)."""
    for conv, relu in (("conv_a", "relu_a"), ("conv_b", "relu_b")):
        at_in, at_out = report.rows[conv], report.rows[relu]
        step = (at_in.predicted.grad_e2 / at_in.backward.e2) / (at_out.predicted.grad_e2 / at_out.backward.e2)
        assert abs(step - 1) < 0.04, (relu, step)
