"""The correlated walk through timm's MaxViT (``make test-vision``), small: ``AttentionCl`` within the
windows of the channels-last map and within its grid, the partition read off ``window_partition``'s and
``grid_partition``'s views and permutes, and ``window_reverse`` / ``grid_reverse`` (leaves of the trace)
moving the layout's index back; each module's output variance and gradient E[g²] against the
measurement."""

from __future__ import annotations

import pytest
import torch
from test_probe_timm_blocks import _walk_holds

pytest.importorskip("timm")


def _small_maxvit():
    """A 32 × 32 image: the stem's 16 × 16, a stage on 8 × 8 (4 × 4 windows: 4 of them; the grid's 4 cells
    of 4 × 4 positions 2 apart), a stage on 4 × 4 (one window, one cell), timm's RW configuration (heads
    first in the fused qkv, a relative position bias, squeeze-and-excitation in the MBConvs)."""
    from timm.models.maxxvit import MaxxVit, MaxxVitCfg, _rw_max_cfg

    torch.manual_seed(0)
    cfg = MaxxVitCfg(embed_dim=(32, 64), depths=(1, 1), block_type=("M", "M"), stem_width=(16, 16),
                     **_rw_max_cfg(window_size=(4, 4), dim_head=16))  # fmt: skip
    return MaxxVit(cfg, img_size=32, num_classes=256)


def test_a_small_timm_maxvit_is_predicted_whole():
    """Each row within 10% forward and 15% backward of 400 images (the walk stops without the attention's
    rule, the partition's layout or the reverse's). The qkv read in torch's order rather than head by
    head puts the stem's gradient at 0.74 of its measurement; the tokens taken along the window's last dim
    alone (rows of w) stop the walk at the one-window stage. 256 classes, as torchvision's MaxViT's test."""
    net = _small_maxvit()
    x = torch.randn(400, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    names = [f"stages.{s}.blocks.0.{p}{r}" for s in (0, 1) for p in ("conv", "attn_block", "attn_grid")
             for r in ("", ".attn")[: 1 + (p != "conv")]]  # fmt: skip
    _walk_holds(net, x, ["stem", *names, "head"])
