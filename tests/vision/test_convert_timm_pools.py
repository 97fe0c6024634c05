"""convert() on timm's pools that follow the input's size, against timm's own modules: ``MaxPool2dSame`` /
``AvgPool2dSame`` ("SAME" padding computed in forward) and VGG's ``ConvMlp`` (an adaptive pool behind a
branch on the map's size). Needs timm (``make test-vision``).
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn

from gatepool import convert
from gatepool.layers.dynamic_pools import AtLeastPool, PoolSame

timm = pytest.importorskip("timm")
from timm.layers.pool2d_same import AvgPool2dSame, MaxPool2dSame  # noqa: E402
from timm.models.vgg import ConvMlp  # noqa: E402


def _same_pools():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 1), MaxPool2dSame(3, 2), AvgPool2dSame(3, 2), MaxPool2dSame(2, 1),
                         AvgPool2dSame((3, 2), (2, 3), count_include_pad=False))  # fmt: skip


@pytest.mark.parametrize("size", [(9, 9), (8, 10), (7, 12), (1, 3)])
def test_same_pools_at_max_and_avg_are_timms(size):
    """gate "max" for the max pools and "avg" for the average pools: timm's outputs and gradients."""
    x = torch.randn(2, 3, *size, dtype=torch.float64, requires_grad=True)
    ref = _same_pools().double()
    net = _same_pools().double()
    _, replaced = convert(net, "max", include=(nn.MaxPool2d,))
    assert [r.name for r in replaced] == ["1", "3"] and all(isinstance(r.new, PoolSame) for r in replaced)
    assert replaced[0].old_type is MaxPool2dSame
    convert(net, "avg", include=(nn.AvgPool2d,))
    assert all(isinstance(net[i], PoolSame) for i in (1, 2, 3, 4))
    inner = [type(net[i].pool) for i in (1, 2, 3, 4)]
    assert inner == [nn.MaxPool2d, nn.AvgPool2d, nn.MaxPool2d, nn.AvgPool2d]
    want, got = ref(x), net(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(want, x, g)[0])


@pytest.mark.parametrize("gate", ["soft", "soft-learned", "attention", "conv"])
def test_same_pools_take_every_gate_and_train(gate):
    x = torch.randn(2, 3, 10, 9)
    net = _same_pools()
    want_shape = net(x).shape
    _, replaced = convert(net, gate, example_input=x)
    assert len(replaced) == 4
    assert not any(isinstance(m, (MaxPool2dSame, AvgPool2dSame)) for m in net.modules())
    assert all(net[i].value is None for i in (1, 2, 3, 4))  # no fill: the gate's own padding (gate 0)
    out = net(x)
    out.square().mean().backward()
    assert out.shape == want_shape and out.isfinite().all()
    params = [p for i in (1, 2, 3, 4) for p in net[i].parameters()]
    assert (not params) == (gate == "soft") and all(p.grad.isfinite().all() for p in params)
    assert convert(net, gate, example_input=x) == (net, [])  # idempotent
    convert(net, "max", include=(nn.MaxPool2d, nn.AvgPool2d))  # the way back: "SAME" max pools
    ref = _same_pools()
    ref[2], ref[4] = MaxPool2dSame(3, 2), MaxPool2dSame((3, 2), (2, 3))
    net[0].load_state_dict(ref[0].state_dict())
    torch.testing.assert_close(net(x), ref(x), rtol=0, atol=0)


def _head():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 1), ConvMlp(8, 16, kernel_size=7, drop_rate=0.0))


@pytest.mark.parametrize("size", [(2, 2), (3, 9), (9, 4), (7, 7), (9, 8)])
def test_convmlp_at_avg_is_timms(size):
    """VGG's pre-logits pools a map smaller than 7×7 up to it: gate "avg" gives timm's outputs."""
    x = torch.randn(2, 3, *size)
    ref, net = _head().eval(), _head().eval()
    _, replaced = convert(net, "avg")
    assert [(r.name, r.role, r.source) for r in replaced] == [
        ("1.adaptive_avg_pool2d", "adaptive", "function")
    ]
    assert replaced[0].old == "F.adaptive_avg_pool2d(output_size=(max(7, H), max(7, W))) in ConvMlp.forward"
    assert isinstance(net[1], ConvMlp) and isinstance(net[1].adaptive_avg_pool2d, AtLeastPool)
    torch.testing.assert_close(net(x), ref(x), rtol=0, atol=0)


def test_convmlp_takes_a_gate_trains_and_pickles():
    x = torch.randn(2, 3, 3, 3)
    net = _head()
    keys = set(net.state_dict())
    convert(net, "attention", example_input=x)
    pool = net[1].adaptive_avg_pool2d.pool
    assert pool.gate == "attention" and pool.channels == 8
    assert set(net.state_dict()) - keys == {f"1.adaptive_avg_pool2d.pool.{k}" for k in pool.state_dict()}
    net(x).square().mean().backward()
    assert pool.score.weight.grad.abs().sum() > 0
    net.eval()
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert isinstance(loaded[1], ConvMlp)
    torch.testing.assert_close(loaded(x), net(x), rtol=0, atol=0)
    convert(loaded, "conv", example_input=x)  # "conv" has no adaptive form: left, with a warning
    with pytest.warns(UserWarning, match="no adaptive form"):
        convert(_head(), "conv", example_input=x)
