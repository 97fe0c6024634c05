"""What conv-forward, padding-map and conv-backward share: block 1's boxed step, its setup, and the
ideal variance beside the measurement.

    p̂ = ReLU(GroupNorm(x)),  ŷ = conv3×3(p̂),  C_in = C_out = 32,  σ_W² = 2/288,  14×14 maps

The lecture's numbers are for x ~ N(0, 1) (the rules' assumption); ``--set input=mnist`` feeds block 1's
real input (the stem and first pool of Tuesday's CNN on MNIST digits) and compares with the same rules.
The step is the library's own (``PreActBlock``'s gn1 → relu1 → conv1, seeded, its He init), so the
claims measure the library's block, not a conv built here. Measurements come from
``gatepool.analysis.probe.measure``; the ideal beside them from ``gatepool.analysis.probe.theory``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn

from gatepool.analysis.probe import padding_variance_map
from gatepool.data import mnist_batch
from gatepool.lab.claims import Context
from gatepool.models import ResidualCNN
from gatepool.models.residual_cnn import PreActBlock
from gatepool.utils.checks import check_int

SETUP = {"batch": 512, "channels": 32, "kernel": 3, "size": 14, "groups": 8, "input": "gaussian", "seed": 0}
QUICK = {"batch": 128}
STEP = ("channels", "kernel", "groups", "input")  # what the lecture's values assume (not batch or seed)
SEED_SPREAD = (
    "one init of 32 filters: the realized σ_W² moves σ² by up to ±6% between seeds (0.94–1.03 over seeds 0–3)"
)


def boxed_step(ctx: Context, fresh: bool = False) -> tuple[nn.Sequential, torch.Tensor]:
    """(GroupNorm → ReLU → conv, its input x): the first step of the library's block
    (``PreActBlock``'s gn1, relu1, conv1, with the block's own He init), as the lecture boxes it in block 1.

    ``fresh``: the same step with an input it has not seen (another Gaussian draw, or test digits).
    """
    c, k = ctx["channels"], ctx["kernel"]
    if check_int(k, "--set kernel") % 2 == 0:
        raise ValueError(f"--set kernel={k}: must be odd (padding k//2 keeps the map size)")
    if check_int(c, "--set channels") % ctx["groups"]:
        raise ValueError(f"--set channels={c}: must be a positive multiple of groups={ctx['groups']}")
    torch.manual_seed(ctx["seed"])
    block = PreActBlock(c, groups=ctx["groups"], kernel_size=k)  # the library's block, its He init
    step = nn.Sequential(OrderedDict(gn=block.gn1, relu=block.relu1, conv=block.conv1))
    if ctx["input"] == "gaussian":
        gen = torch.Generator().manual_seed(ctx["seed"] + 1) if fresh else None
        x = torch.randn(ctx["batch"], c, ctx["size"], ctx["size"], generator=gen)  # (B, C, H, W)
    elif ctx["input"] == "mnist":
        model = ResidualCNN(width=c, groups=ctx["groups"])
        digits = mnist_batch(ctx["batch"], "test" if fresh else "train")[0]
        with torch.no_grad():
            x = model.pool1(model.stem(digits))  # (B, C, 14, 14): block 1's input
    else:
        raise ValueError(f"--set input={ctx['input']!r}: choose 'gaussian' or 'mnist'")
    return step, x


def interior(ctx: Context) -> torch.Tensor:
    """(H, W) bool: positions whose filter sees no padding."""
    k = ctx["kernel"]
    return padding_variance_map(ctx["size"], ctx["size"], k, k // 2) == 1


def ideal_conv_var(step: nn.Sequential, relu_e2: float) -> float:
    """fan_in · E[w²] · E[p̂²] with this conv's realized weights."""
    w = step.conv.weight
    return w[0].numel() * w.pow(2).mean().item() * relu_e2
