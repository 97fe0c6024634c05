"""What gate-matters and distractor-study share: their nets, the training rates their budgets rest on,
and the attention gate's weights read out of a trained net."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

CANVAS_MODEL, MNIST_MODEL, DEEP_MODEL = "residual_cnn_canvas", "residual_cnn", "resnet_gate"
# Training images/s of one 1-thread worker: relative costs measured under load, times a reference 1,400
# for the lecture's CNN (docs/beyond.md, "Sizing the full profile").
RATES = {CANVAS_MODEL: 297.0, DEEP_MODEL: 440.0, MNIST_MODEL: 1400.0}
EVAL_COST = 1 / 3  # an evaluation pass, in training passes


def gate_maps(model: nn.Module, x: torch.Tensor, gate: str = "attention") -> list[torch.Tensor]:
    """Per ``gate`` pool in forward order: each input position's gate weight, (N, H, W) at that pool's
    input resolution (2×2 stride-2 windows: position (2i + a, 2j + b) gets window (i, j)'s weight k = 2a + b),
    averaged over the channels (the attention gate's weights are the same for every channel).
    """
    maps: list[torch.Tensor] = []

    def hook(module: nn.Module, _inp: Any, out: Any) -> Any:
        y, w = out  # w: (N, C, Ho, Wo, 4), the same for every channel
        n, _, ho, wo, _ = w.shape
        m = w.mean(1).reshape(n, ho, wo, 2, 2).permute(0, 1, 3, 2, 4).reshape(n, 2 * ho, 2 * wo)
        maps.append(m.detach())
        return y

    pools = [m for m in model.modules() if getattr(m, "gate", None) == gate]
    handles = [p.register_forward_hook(hook) for p in pools]
    for p in pools:
        p.return_weights = True
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for p in pools:
            p.return_weights = False
        for h in handles:
            h.remove()
    return maps


def routed_weight(maps: list[torch.Tensor]) -> torch.Tensor:
    """(N, H, W) at the first pool's resolution: the product of every pool's gate weight over the input
    positions it covers, how much of the composed window each input position gets, were the layers
    between the pools the identity:

        routed[n, r, c] = Π_i maps[i][n, r // 2^i, c // 2^i]

    Pool i's map sits at 1/2^i of the input (every pool before it halves), so each of its entries covers
    2^i × 2^i input positions. The scale is 2^i, not a ratio of map sizes: floor division leaves odd maps
    short (ResNetGate on 60×60: 60, 30, 14, 6, where 6 covers 6 · 8 = 48 input rows, not 56 // 6 = 9
    each). The result is cropped to the rows and columns every pool covers."""
    out = maps[0]  # (N, H, W)
    for i, m in enumerate(maps[1:], start=1):
        scale = 2**i
        up = m.repeat_interleave(scale, -2).repeat_interleave(scale, -1)  # (N, h·2^i, w·2^i)
        h, w = min(out.shape[-2], up.shape[-2]), min(out.shape[-1], up.shape[-1])
        out = out[:, :h, :w] * up[:, :h, :w]
    return out
