"""Tuesday's CNN: a small pre-activation residual network for 28×28 digits.

    stem  Conv2d(1, 32, 5, padding=2), W ~ N(0, 1/25), bias 0, no ReLU     (B, 32, 28, 28)
    pool1 2×2 stride 2 (any gate: max, avg, soft, ...)                     (B, 32, 14, 14)
    block1                                                                 (B, 32, 14, 14)
    pool2                                                                  (B, 32, 7, 7)
    block2, block3                                                         (B, 32, 7, 7)
    head  GroupNorm → ReLU → mean over the 49 positions → Linear(32, 10)    (B, 10)
          Linear W ~ N(0, 1/32), bias 0 (the lecture's backward figures assume E[w²] = 1/32)

``blocks`` sets the stages: one 2×2 pool, then that many blocks, per entry. The lecture's net is (1, 2)
for 28×28; ``residual_cnn_canvas`` is (1, 1, 2) for a 60×60 canvas, one more pool stage:
60 → 30 → 15 → 7 (the last pool drops the 15th row and column, as torch's floor mode does), so the head
again sees 7×7.

Each block is pre-activation, ``x + conv2(relu(gn2(conv1(relu(gn1(x))))))``, 3×3 convs without bias,
He init W ~ N(0, 2/(C·9)) = N(0, 2/288), so a unit-variance ReLU input gives a unit-variance conv output:
``Var(y) = fan_in · E[w²] · E[x²] = 288 · 2/288 · ½ = 1``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn

from gatepool.analysis.probe import Residual, Site, register_rule
from gatepool.layers import create_pool
from gatepool.models.registry import register_model
from gatepool.utils.checks import check_int


class PreActBlock(nn.Module):
    """``x + conv2(relu(gn2(conv1(relu(gn1(x))))))`` at constant width."""

    def __init__(self, channels: int = 32, *, groups: int = 8, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd to keep the map size, got {kernel_size}")
        pad = kernel_size // 2
        self.gn1 = nn.GroupNorm(groups, channels)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size, padding=pad, bias=False)
        self.gn2 = nn.GroupNorm(groups, channels)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, kernel_size, padding=pad, bias=False)
        fan_in = channels * kernel_size * kernel_size
        for conv in (self.conv1, self.conv2):
            nn.init.normal_(conv.weight, 0.0, (2.0 / fan_in) ** 0.5)  # He: Var(w) = 2/fan_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, C, H, W)
        branch = self.conv1(self.relu1(self.gn1(x)))
        branch = self.conv2(self.relu2(self.gn2(branch)))
        return x + branch


def _preact_block_rule(block: PreActBlock, site: Site) -> Residual:
    """The probe's rule: the stream plus a branch of the six children in order (variances add)."""
    return Residual(("gn1", "relu1", "conv1", "gn2", "relu2", "conv2"))


register_rule(PreActBlock, _preact_block_rule)


def stem_conv(in_channels: int, width: int, kernel_size: int) -> nn.Conv2d:
    """Conv2d(in, width, k, padding=k//2) with W ~ N(0, 1/(in·k²)) (N(0, 1/25) for MNIST's 5×5), bias 0."""
    stem = nn.Conv2d(in_channels, width, kernel_size, padding=kernel_size // 2)
    nn.init.normal_(stem.weight, 0.0, (1.0 / (in_channels * kernel_size**2)) ** 0.5)
    nn.init.zeros_(stem.bias)
    return stem


def gap_head(width: int, groups: int, num_classes: int) -> nn.Sequential:
    """GroupNorm → ReLU → mean over positions → Linear(width, num_classes)     (B, C, H, W) -> (B, classes)

    The Linear has W ~ N(0, 1/width) (N(0, 1/32): the lecture's ideal backward) and bias 0.
    """
    head = nn.Sequential(
        OrderedDict(
            norm=nn.GroupNorm(groups, width),
            relu=nn.ReLU(),
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
            fc=nn.Linear(width, num_classes),
        )
    )
    nn.init.normal_(head.fc.weight, 0.0, (1.0 / width) ** 0.5)
    nn.init.zeros_(head.fc.bias)
    return head


class ResidualCNN(nn.Sequential):
    """Tuesday's CNN; its children are named stem, pool1, block1, pool2, block2, block3, head.

    Args:
        pool: gate name for both 2×2 stride-2 pools (see ``gatepool.layers.create_pool``).
        width: channels everywhere (32).
        blocks: residual blocks after each pool ((1, 2): one at 14×14, two at 7×7); one pool per entry.
        groups: GroupNorm groups (8).
        in_channels, num_classes: 1 and 10 for MNIST.
        pool_kwargs: extra keyword arguments for the pool (e.g. ``temperature``).
    """

    def __init__(
        self,
        *,
        pool: str = "max",
        width: int = 32,
        blocks: Sequence[int] = (1, 2),
        groups: int = 8,
        in_channels: int = 1,
        num_classes: int = 10,
        pool_kwargs: dict | None = None,
    ) -> None:
        check_int(groups, "groups")
        check_int(width, "width")
        if width % groups != 0:
            raise ValueError(f"width must be a positive multiple of groups={groups}, got {width}")
        if len(blocks) < 1:
            raise ValueError(f"blocks must be one count ≥ 0 per pool stage, like (1, 2); got {blocks}")
        for i, count in enumerate(blocks):
            check_int(count, f"blocks[{i}]", 0)  # blocks in pool stage i
        pool_kwargs = dict(pool_kwargs or {})
        layers: list[tuple[str, nn.Module]] = [("stem", stem_conv(in_channels, width, 5))]
        n = 0
        for stage, count in enumerate(blocks, start=1):
            layers.append((f"pool{stage}", create_pool(pool, 2, channels=width, **pool_kwargs)))
            for _ in range(count):
                n += 1
                layers.append((f"block{n}", PreActBlock(width, groups=groups)))
        layers.append(("head", gap_head(width, groups, num_classes)))
        super().__init__(OrderedDict(layers))
        self.pool_name = pool


@register_model("residual_cnn")
def residual_cnn(**kwargs) -> ResidualCNN:
    """Tuesday's CNN (see :class:`ResidualCNN`)."""
    return ResidualCNN(**kwargs)


@register_model("residual_cnn_canvas")
def residual_cnn_canvas(**kwargs) -> ResidualCNN:
    """Tuesday's CNN with one more pool stage for a 60×60 canvas: blocks (1, 1, 2), 60 → 30 → 15 → 7."""
    kwargs.setdefault("blocks", (1, 1, 2))
    return ResidualCNN(**kwargs)
