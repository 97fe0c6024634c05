"""The correlated walk through timm's DaViT, small (``make test-vision``): its spatial blocks' window
attention (the tokens viewed as a channels-last map, padded to whole windows, partitioned by views, its
``WindowAttention`` module, the reverse a function torch.fx keeps whole, the crop) read as the window
rule on the map; its channel blocks' ``ChannelAttention`` by the cross-covariance rule."""

from __future__ import annotations

import pytest
import torch


def test_timms_davit_windows_are_the_window_rule():
    """A 10 × 10 map (40 × 40 images) in 7 × 7 windows, padded to 14 × 14, then 5 × 5 in one window: the
    model predicted whole; the spatial block's crop the window rule's field on norm1's (to the tokens'
    rounding); its attention row the padded map's (C, 14, 14), as its module returns the padded windows
    (the padding's gradient zero).
    Without the attention module's rule the walk stops at the pad."""
    timm = pytest.importorskip("timm")
    from gatepool.analysis.probe import correlated as cr
    from gatepool.analysis.probe import correlated_predict as cp
    from gatepool.analysis.probe.correlated.tokens import UnflattenPositions

    torch.manual_seed(0)
    net = timm.create_model("davit_tiny", embed_dims=(16, 32), depths=(1, 1), num_heads=(1, 2),
                            drop_path_rate=0.0, num_classes=10)  # fmt: skip
    stats = cr.measure_input(torch.randn(64, 3, 40, 40, generator=torch.Generator().manual_seed(1)))
    pred = cp.predict_correlated(net, stats, batch=64)
    assert not pred.notes, pred.notes
    a = net.stages[0].blocks[0][0].attn
    rule = cr.WindowAttention(a.qkv.weight, a.qkv.bias, a.proj.weight, a.proj.bias, None, (7, 7), 1)
    want = rule.forward(UnflattenPositions(10, 10).forward(pred["stages.0.blocks.0.0.norm1"].field))
    got = pred["stages.0.blocks.0.0.drop_path1"].field
    assert torch.allclose(got.var.flatten(), want.var.flatten(), rtol=1e-4)
    row, crop = pred["stages.0.blocks.0.0.attn"], pred["stages.0.blocks.0.0.drop_path1"]
    assert row.field.var.shape == row.grad.var.shape == (16, 14, 14)
    assert abs(row.grad_e2 / crop.grad_e2 - 100 / 196) < 1e-9  # a zero gradient on the padding
    assert pred["stages.0.blocks.0.1.attn"].var is not None  # the channel attention
    from gatepool.analysis.probe.correlated import registry

    saved = registry._NAMED_RULES.pop("timm.models.davit.WindowAttention")
    try:
        stop = cp.predict_correlated(net, stats, backward=None)
    finally:
        registry._NAMED_RULES["timm.models.davit.WindowAttention"] = saved
    assert stop["stages.0.blocks.0.0.attn"].var is None and stop.notes
