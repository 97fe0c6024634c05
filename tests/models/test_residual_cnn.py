"""Tuesday's CNN: shapes, structure and the init statistics the lecture relies on."""

import pytest
import torch

from gatepool import create_model, list_models
from gatepool.models import ResidualCNN


def test_registry():
    assert "residual_cnn" in list_models()
    assert isinstance(create_model("residual_cnn"), ResidualCNN)
    with pytest.raises(ValueError, match="model="):
        create_model("resnet-9000")


def test_shapes_and_children():
    torch.manual_seed(0)
    m = ResidualCNN()
    names = [n for n, _ in m.named_children()]
    assert names == ["stem", "pool1", "block1", "pool2", "block2", "block3", "head"]
    x = torch.randn(3, 1, 28, 28)
    shapes = []
    h = x
    for child in m:
        h = child(h)
        shapes.append(tuple(h.shape))
    assert shapes == [
        (3, 32, 28, 28),
        (3, 32, 14, 14),
        (3, 32, 14, 14),
        (3, 32, 7, 7),
        (3, 32, 7, 7),
        (3, 32, 7, 7),
        (3, 10),
    ]
    out = m(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-5)


def test_init_statistics():
    torch.manual_seed(0)
    m = ResidualCNN()
    w = m.stem.weight
    assert w.shape == (32, 1, 5, 5)
    assert abs(w.var().item() * 25 - 1) < 0.15  # 800 samples: sd of the estimate ~5%
    assert torch.all(m.stem.bias == 0)
    convs = [b.conv1.weight for b in (m.block1, m.block2, m.block3)] + [
        b.conv2.weight for b in (m.block1, m.block2, m.block3)
    ]
    for cw in convs:
        assert cw.shape == (32, 32, 3, 3)
        assert abs(cw.var().item() * 288 / 2 - 1) < 0.05  # 9216 samples: sd ~1.5%
        assert abs(cw.mean().item()) < 0.005
    assert m.block1.conv1.bias is None
    fc = m.head.fc
    assert abs(fc.weight.var().item() * 32 - 1) < 0.3 and torch.all(fc.bias == 0)  # 320 samples: sd ~8%
    assert m.block1.gn1.num_groups == 8


def test_arguments():
    m = ResidualCNN(width=16, blocks=(2, 1), groups=4, pool="avg")
    assert [n for n, _ in m.named_children()] == [
        "stem",
        "pool1",
        "block1",
        "block2",
        "pool2",
        "block3",
        "head",
    ]
    assert m(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="width"):
        ResidualCNN(width=30)
    with pytest.raises(ValueError, match="blocks"):
        ResidualCNN(blocks=(1, -1))
