"""The nets sized for the 60×60 canvas: shapes for every gate, every pool the gate, init, errors."""

import pytest
import torch

from gatepool import create_model
from gatepool.layers import create_pool
from gatepool.layers.gated_pool import GATES
from gatepool.models import PreActProjBlock, ResidualCNN, ResNetGate


def _pools(model):
    return [m for m in model.modules() if getattr(m, "gate", None) is not None
            or type(m).__name__ in ("MaxPool2d", "AvgPool2d")]


def _is_gate(pool, gate):
    """``pool`` is what create_pool makes for ``gate`` (torch's own class for max and avg)."""
    return type(pool) is type(create_pool(gate, 2, channels=8)) and getattr(pool, "gate", gate) == gate


@pytest.mark.parametrize("gate", GATES)
def test_canvas_cnn_shapes_every_gate(gate):
    torch.manual_seed(0)
    m = create_model("residual_cnn_canvas", pool=gate)
    assert isinstance(m, ResidualCNN)
    names = [n for n, _ in m.named_children()]
    assert names == ["stem", "pool1", "block1", "pool2", "block2", "pool3", "block3", "block4", "head"]
    h, shapes = torch.randn(2, 1, 60, 60), []
    for child in m:
        h = child(h)
        shapes.append(tuple(h.shape[1:]))
    assert shapes == [(32, 60, 60), (32, 30, 30), (32, 30, 30), (32, 15, 15), (32, 15, 15), (32, 7, 7),
                      (32, 7, 7), (32, 7, 7), (10,)]
    pools = _pools(m)
    assert len(pools) == 3 and all(_is_gate(p, gate) for p in pools)


@pytest.mark.parametrize("gate", GATES)
def test_resnet_gate_shapes_every_gate(gate):
    torch.manual_seed(0)
    m = create_model("resnet_gate", pool=gate)
    assert isinstance(m, ResNetGate)
    h, shapes = torch.randn(2, 1, 60, 60, requires_grad=True), []
    x = h
    for child in m:
        h = child(h)
        shapes.append(tuple(h.shape[1:]))
    assert shapes == [(16, 60, 60), (16, 30, 30), (32, 15, 15), (64, 7, 7), (128, 3, 3), (10,)]
    pools = [s.pool for s in (m.stage1, m.stage2, m.stage3, m.stage4)]
    assert len(_pools(m)) == 4  # the four stage pools are the only downsampling
    assert all(_is_gate(p, gate) for p in pools)
    convs = [c for c in m.modules() if isinstance(c, torch.nn.Conv2d)]
    assert all(c.stride == (1, 1) for c in convs)
    h.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    if gate in ("soft-learned", "attention", "conv"):  # the channels each pool gets are its input's
        for p, c in zip(pools, (16, 16, 32, 64)):
            assert any(t.shape[0] == c for t in p.parameters())


def test_channels_last_agrees():
    torch.manual_seed(0)
    m = create_model("resnet_gate", pool="attention").eval()
    x = torch.randn(2, 1, 60, 60)
    torch.testing.assert_close(m(x.contiguous(memory_format=torch.channels_last)), m(x), rtol=1e-4, atol=1e-5)


def test_projection_block_init_and_shape():
    torch.manual_seed(0)
    b = PreActProjBlock(32, 64)
    assert b(torch.randn(2, 32, 8, 8)).shape == (2, 64, 8, 8)
    assert abs(b.conv1.weight.var().item() * 32 * 9 / 2 - 1) < 0.05  # He: N(0, 2/(C_in·9)), 18,432 draws
    assert abs(b.conv2.weight.var().item() * 64 * 9 / 2 - 1) < 0.05
    assert abs(b.proj.weight.var().item() * 32 - 1) < 0.1  # N(0, 1/C_in), 2,048 draws
    assert b.conv1.bias is None and b.proj.bias is None


@pytest.mark.parametrize(
    "kwargs, match",
    [({"widths": (16, 32), "depths": (1,)}, "equally long"), ({"widths": (12,), "depths": (1,)}, "multiples"),
     ({"depths": (1, 0, 1, 1)}, "depths"), ({"pool": "median"}, "pool name"), ({"groups": 0}, "groups")],
)
def test_resnet_gate_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNetGate(**kwargs)


def test_residual_cnn_blocks_errors_and_lecture_default():
    with pytest.raises(ValueError, match="blocks"):
        ResidualCNN(blocks=())
    assert [n for n, _ in ResidualCNN().named_children()] == [
        "stem", "pool1", "block1", "pool2", "block2", "block3", "head"]
