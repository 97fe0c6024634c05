"""ResNetGate: a deeper pre-activation ResNet whose every downsampling is the gate under test.

For a 60×60 canvas with the defaults (widths (16, 32, 64, 128), depths (1, 2, 2, 1)):

    stem    Conv2d(1, 16, 3, padding=1), W ~ N(0, 1/9), bias 0                  (B, 16, 60, 60)
    stage1  pool (gate, 2×2 stride 2) → 1 block 16 → 16                        (B, 16, 30, 30)
    stage2  pool → block 16 → 32 (1×1 projection on the skip) → block 32        (B, 32, 15, 15)
    stage3  pool → block 32 → 64 → block 64                                    (B, 64, 7, 7)
    stage4  pool → block 64 → 128                                              (B, 128, 3, 3)
    head    GroupNorm → ReLU → mean over positions → Linear(128, 10)           (B, 10)

A block is pre-activation, ``skip(x) + conv2(relu(gn2(conv1(relu(gn1(x))))))``; ``skip`` is the identity
at constant width and a bias-free 1×1 conv (He init, N(0, 1/C_in)) where the width grows, as in He et
al.'s ResNet v2 (option B). The 3×3 convs have He init N(0, 2/(C_in·9)) and no bias. Unlike torchvision's
ResNet there is no strided conv anywhere: the four 2×2 pools are the only downsampling, and every one
uses the gate under test (soft-learned and attention get the channels they pool), so the net's whole
reduction of the canvas goes through the gate. The pool sits on the pre-activation stream, as in
:class:`gatepool.models.ResidualCNN`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn

from gatepool.layers import create_pool
from gatepool.models.registry import register_model
from gatepool.models.residual_cnn import PreActBlock, gap_head, stem_conv
from gatepool.utils.checks import check_int


class PreActProjBlock(nn.Module):
    """``proj(x) + conv2(relu(gn2(conv1(relu(gn1(x))))))`` from ``c_in`` to ``c_out`` channels."""

    def __init__(self, c_in: int, c_out: int, *, groups: int = 8) -> None:
        super().__init__()
        self.gn1 = nn.GroupNorm(groups, c_in)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(groups, c_out)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.proj = nn.Conv2d(c_in, c_out, 1, bias=False)
        nn.init.normal_(self.conv1.weight, 0.0, (2.0 / (c_in * 9)) ** 0.5)
        nn.init.normal_(self.conv2.weight, 0.0, (2.0 / (c_out * 9)) ** 0.5)
        nn.init.normal_(self.proj.weight, 0.0, (1.0 / c_in) ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, H, W) -> (B, C_out, H, W)
        branch = self.conv1(self.relu1(self.gn1(x)))
        branch = self.conv2(self.relu2(self.gn2(branch)))
        return self.proj(x) + branch


class ResNetGate(nn.Sequential):
    """Children: stem, stage1 … stageN (each ``pool`` then blocks), head.

    Args:
        pool: gate name for every 2×2 stride-2 pool (see ``gatepool.layers.create_pool``).
        widths: channels of each stage's blocks ((16, 32, 64, 128)); the stem makes ``widths[0]``.
        depths: blocks per stage ((1, 2, 2, 1)), each ≥ 1.
        groups: GroupNorm groups (8); every width must be a multiple.
        in_channels, num_classes: 1 and 10.
        pool_kwargs: extra keyword arguments for every pool (e.g. ``temperature``).
    """

    def __init__(
        self,
        *,
        pool: str = "max",
        widths: Sequence[int] = (16, 32, 64, 128),
        depths: Sequence[int] = (1, 2, 2, 1),
        groups: int = 8,
        in_channels: int = 1,
        num_classes: int = 10,
        pool_kwargs: dict | None = None,
    ) -> None:
        check_int(groups, "groups")
        if len(widths) < 1 or len(widths) != len(depths):
            raise ValueError(f"widths and depths must be equally long, ≥ 1 stage; got {widths} and {depths}")
        for i, (w, d) in enumerate(zip(widths, depths)):
            check_int(w, f"widths[{i}]")
            check_int(d, f"depths[{i}]")  # blocks in stage i
        if any(w % groups for w in widths):
            raise ValueError(f"widths must be positive multiples of groups={groups}, got {widths}")
        pool_kwargs = dict(pool_kwargs or {})
        layers: list[tuple[str, nn.Module]] = [("stem", stem_conv(in_channels, widths[0], 3))]
        c = widths[0]
        for i, (w, d) in enumerate(zip(widths, depths), start=1):
            stage: list[tuple[str, nn.Module]] = [("pool", create_pool(pool, 2, channels=c, **pool_kwargs))]
            for j in range(d):
                block = PreActBlock(w, groups=groups) if c == w else PreActProjBlock(c, w, groups=groups)
                stage.append((f"block{j + 1}", block))
                c = w
            layers.append((f"stage{i}", nn.Sequential(OrderedDict(stage))))
        layers.append(("head", gap_head(c, groups, num_classes)))
        super().__init__(OrderedDict(layers))
        self.pool_name = pool


@register_model("resnet_gate")
def resnet_gate(**kwargs) -> ResNetGate:
    """A deeper ResNet whose four downsamplings are the gate (see :class:`ResNetGate`)."""
    return ResNetGate(**kwargs)
