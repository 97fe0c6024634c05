"""The receptive width of stacked convs, with or without a pool after each: what attention-reach and
conv-reach measure.

L layers of k×k convs at stride 1 see ``1 + L(k − 1)`` pixels along a row; a p×p stride-p pool after each
conv multiplies the reach of every later stage by p. Measured, not computed: the support of one output
unit's gradient (autograd) through all-ones convs and average pools.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.utils.checks import check_int


def receptive_width(layers: int, kernel: int, pool: int = 1) -> int:
    """Pixels (along a row) that one output unit of ``layers`` stacked ``kernel``² convs sees, stride 1;
    with ``pool`` > 1, each conv is followed by a ``pool``² average pool of stride ``pool`` (a stage).

    Measured, not computed: the support of ∂y/∂x for one unit of a stack of all-ones convs and average
    pools (positive weights, so nothing cancels) on a canvas large enough for any answer.
    """
    side = (layers * kernel + 1) * pool**layers  # ≥ every receptive field of `layers` stages
    x = torch.zeros(1, 1, side, side, dtype=torch.float64, requires_grad=True)
    y = x
    for _ in range(layers):
        y = nn.functional.conv2d(y, torch.ones(1, 1, kernel, kernel, dtype=torch.float64))  # (1, 1, h, w)
        if pool > 1:
            y = nn.functional.avg_pool2d(y, pool)  # (1, 1, h/pool, w/pool)
    (grad,) = torch.autograd.grad(y[0, 0, 0, 0], x)  # the top-left output unit
    return int((grad[0, 0].abs().sum(0) > 0).sum())  # columns it depends on


def layers_to_see(pixels: int, kernel: int, pool: int = 1) -> tuple[int, list[int]]:
    """The fewest stacked ``kernel``² convs (each followed by a ``pool``² pool when ``pool`` > 1) whose unit
    sees ``pixels`` pixels, and the widths on the way."""
    check_int(kernel, "rf_kernel", 2)
    check_int(pixels, "rf_pixels")
    check_int(pool, "rf_pool")
    widths = [1]  # zero layers: a pixel sees itself
    while widths[-1] < pixels:
        widths.append(receptive_width(len(widths), kernel, pool))
    return len(widths) - 1, widths
