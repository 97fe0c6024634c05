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


def _timm_swin():
    """timm's Swin, small: a 14 × 14 map in 7 × 7 windows (the second block's shifted by 3 and masked),
    merged into 7 × 7 (one window: no shift)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224", img_size=56, embed_dim=24, depths=(2, 2),
                             num_heads=(1, 2), window_size=7, drop_path_rate=0.0)  # fmt: skip


def test_timms_swin_windows_are_the_window_rule():
    """timm writes the window attention as a roll, a pad, views into (windows, 49, C) tokens, its
    ``WindowAttention`` module and the reverse: the walk reads the chain as the window rule on the map,
    the shift read off the roll (the same field, to rounding, as the rule called with the shift; without
    it the field differs), the patch merging as torchvision's; the model predicted whole. A mask that
    does not part the shifted cells stops the walk there."""
    from gatepool.analysis.probe import correlated as cr
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    net = _timm_swin()
    stats = cr.measure_input(torch.randn(64, 3, 56, 56, generator=torch.Generator().manual_seed(1)))
    pred = predict_correlated(net, stats, backward=None)
    assert not pred.notes, pred.notes
    a = net.layers[0].blocks[1].attn
    with torch.no_grad():
        args = (a.qkv.weight, a.qkv.bias, a.proj.weight, a.proj.bias, a._get_rel_pos_bias(), (7, 7), 1)
    x, got = pred["layers.0.blocks.1.norm1"].field, pred["layers.0.blocks.1.attn"].field
    for shift, same in (((3, 3), True), ((0, 0), False)):
        want = cr.WindowAttention(*args, shift).forward(x)
        assert torch.allclose(got.var, want.var, rtol=1e-10) == same, shift
        assert torch.allclose(got.corr, want.corr, atol=1e-10) == same, shift
    net.layers[0].blocks[1].attn_mask.zero_()
    stop = predict_correlated(net, stats, backward=None)
    assert stop["layers.0.blocks.1.attn"].var is None and stop.notes
