"""The correlated walk through torchvision's Swin Transformer (``make test-vision``), small: its
``shifted_window_attention`` (windows padded at the border, shifted and masked) and its patch merging
(``_patch_merging_pad`` of an odd map) by their rules; each module's output variance and gradient E[g²]
against the measurement."""

from __future__ import annotations

import pytest
import torch
from test_probe_timm_blocks import _walk_holds

pytest.importorskip("torchvision")


def test_a_small_swin_is_predicted_whole():
    """Patches of 2 on a 10 × 10 image: a 5 × 5 map in 3 × 3 windows (padded to 6 × 6, the second block's
    shifted by 1), merged into 3 × 3 (an odd side padded), one window there (no shift); no stochastic
    depth. Each row within 10% forward and 15% backward of 2000 images."""
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    net = SwinTransformer([2, 2], 16, [2, 2], [2, 2], [3, 3], stochastic_depth_prob=0.0, num_classes=10)
    x = torch.randn(2000, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    names = ["features.0", "features.1.0.attn", "features.1.1.attn", "features.1.1", "features.2",
             "features.3.1.attn", "features.3.1.mlp", "norm", "head"]  # fmt: skip
    _walk_holds(net, x, names)
