"""The correlated walk on timm's layers that subclass torch's with a forward of their own (``make
test-vision``): weight-standardised convs by their standardised weight, the norms that compute torch's,
and a same-padding conv named as having no rule rather than predicted as a plain conv."""

from __future__ import annotations

import pytest
import torch

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated_predict import predict_correlated

pytest.importorskip("timm")


def _measured(net, x, names):
    """Each named module's output variance on ``x``."""
    out = {}
    hooks = [net.get_submodule(n).register_forward_hook(lambda m, a, y, n=n: out.__setitem__(n, y))
             for n in names]  # fmt: skip
    with torch.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    return {n: float(y.var(unbiased=False)) for n, y in out.items()}


def test_weight_standardised_convs_and_timm_norms_are_predicted():
    """timm's StdConv2d and ScaledStdConv2d (NF-Nets: the conv rule alone, on the raw weight, was 1/fan-in of
    the variance off), its LayerNorm and GroupNorm1 (torch's by their own forward)."""
    from timm.layers import GroupNorm1, LayerNorm2d, ScaledStdConv2d, StdConv2d

    torch.manual_seed(0)
    net = torch.nn.Sequential(StdConv2d(3, 16, 3, padding=1), torch.nn.ReLU(), ScaledStdConv2d(16, 16, 3),
                              GroupNorm1(16), LayerNorm2d(16))  # fmt: skip
    x = torch.randn(2000, 3, 10, 10, generator=torch.Generator().manual_seed(1))
    pred = predict_correlated(net, cr.measure_input(x[:256]))
    measured = _measured(net, x, ["0", "2", "3", "4"])
    for name, v in measured.items():
        assert pred[name].var is not None, (name, pred[name].note)
        assert abs(pred[name].var / v - 1) < 0.10, (name, pred[name].var, v)  # the raw weight: 3× off


def test_a_same_padding_conv_is_not_taken_for_a_plain_conv():
    """timm's Conv2dSame pads by its input's size first: a subclass of Conv2d with its own forward, whose
    row says so (before, the plain conv's rule predicted it with no padding)."""
    from timm.layers import Conv2dSame

    net = torch.nn.Sequential(Conv2dSame(3, 4, 4, stride=2), torch.nn.ReLU())
    pred = predict_correlated(net, cr.measure_input(torch.randn(64, 3, 9, 9)))
    assert pred["0"].var is None and "Conv2dSame: its own forward, not Conv2d's" in pred["0"].note


def test_beit_is_predicted_whole():
    """timm's Beit (its attention an ``F.linear`` of the qkv weight with the bias (q, 0, v), a relative
    position bias that starts at zero, layer scale, the patches' mean after the class token): every row."""
    import timm

    from gatepool.analysis.probe.check import check_model

    torch.manual_seed(0)
    beit = timm.create_model("beit_base_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             embed_dim=64, num_heads=2)  # fmt: skip
    c = check_model(beit, torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert c.with_rule == c.modules > 30 and not c.no_rule and not c.error, c  # before: 6 (at F.linear)
    assert c.forward >= 0.9 * c.modules and c.backward >= 0.9 * c.modules, c
