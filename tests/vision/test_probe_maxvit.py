"""The correlated walk through torchvision's MaxViT (``make test-vision``), small: its block attention
within windows and its grid attention within the lattices of a window's offsets, each read off the
partition's reshapes and permutes as a window attention within cells; each module's output variance and
gradient E[g²] against the measurement."""

from __future__ import annotations

import pytest
import torch
from test_probe_timm_blocks import _walk_holds

pytest.importorskip("torchvision")


def _small_maxvit():
    """A 56 × 56 image: the stem's 28 × 28, one stage of two blocks on 14 × 14 (7 × 7 windows: 4 of them;
    the grid's 2 × 2 windows of 7 × 7 offsets), no stochastic depth."""
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    return MaxVit(input_size=(56, 56), stem_channels=16, partition_size=7, block_channels=[64],
                  block_layers=[2], head_dim=16, stochastic_depth_prob=0.0, num_classes=256)  # fmt: skip


def test_a_small_maxvit_is_predicted_whole():
    """Its MBConvs (squeeze-and-excitation among them), both partitions' attentions, their MLPs in the
    partitioned layout and the head: each row within 10% forward and 15% backward of 400 images (the walk
    stops at the attention without its rule or without the layout's cells). Its maps are nearly
    uncorrelated past the stem, so the grid taken as windows holds here too: the cells are held to Monte
    Carlo on a correlated field in ``tests/analysis/test_probe_window_attention.py``. 256 classes: the
    logits' gradient of rank 10 would leave the head's Linear a gradient of correlated channels, which the
    state drops (1.1× at the head's LayerNorm)."""
    net = _small_maxvit()
    x = torch.randn(400, 3, 56, 56, generator=torch.Generator().manual_seed(1))
    block = "blocks.0.layers.{}.layers.{}"
    names = [f"{block.format(i, p)}{r}" for i in (0, 1) for p in ("window_attention", "grid_attention")
             for r in (".attn_layer", ".mlp_layer", "")]  # fmt: skip
    _walk_holds(net, x, ["stem", block.format(0, "MBconv"), *names, "classifier"])
