"""The correlated walk through timm's TinyViT, small: its blocks' window partition (views, a pad to whole
windows, the reverse and the crop; or the map's own tokens where it is one window) read as one window
attention on the map, its ``Attention`` by :mod:`correlated.tiny_vit`'s rule; rows against the measurement."""

from __future__ import annotations

import pytest
import torch
from test_probe_timm_blocks import _walk_holds

timm = pytest.importorskip("timm")


def _tiny_vit():
    """A 32 × 32 image: an 8 × 8 map of MBConvs, merged into 4 × 4 in 3 × 3 windows (padded to 6 × 6),
    then into 2 × 2, one window of 2 × 2."""
    from timm.models.tiny_vit import TinyVit

    torch.manual_seed(0)
    return TinyVit(num_classes=10, embed_dims=(16, 32, 32), depths=(1, 2, 1), num_heads=(1, 2, 2),
                   window_sizes=(3, 3, 2), drop_path_rate=0.0)  # fmt: skip


def test_a_small_tiny_vit_is_predicted_whole():
    """Every row predicted; each attention's row (the module's own windows' tokens, the padding's among
    them), the first window stage's block and the head within 10% forward and 15% backward of 2000
    images."""
    net = _tiny_vit()
    x = torch.randn(2000, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    names = ["stages.1.blocks.0.attn", "stages.1.blocks.1.attn", "stages.1.blocks.1",
             "stages.2.blocks.0.attn", "head"]  # fmt: skip
    _walk_holds(net, x, names)


@pytest.mark.xfail(strict=True, reason="the last block's gradient, from the head over its 2 × 2 map: 0.849 "
                   "of the measurement (seed 0, torch 2.14.1, timm 1.0.31); not separated")  # fmt: skip
def test_a_small_tiny_vit_last_blocks_gradient():
    x = torch.randn(2000, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _walk_holds(_tiny_vit(), x, ["stages.2.blocks.0"])
