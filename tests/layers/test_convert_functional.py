"""convert() on pools called as functions, head vs squeeze, gates inside blocks, AdaptiveGatedPool.

Torch's modules only (no torchvision, no timm): the models here call F.max_pool2d, F.avg_pool2d,
F.adaptive_avg_pool2d and x.mean((2, 3)) in their own forward, as DenseNet, Inception, MNASNet and timm's
squeeze-and-excitation blocks do. The zoos: tests/vision/test_convert_zoo.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers import GlobalGatedPool2d, SoftPool2d
from gatepool.layers.adaptive_pool import (
    AdaptiveGatedPool1d,
    AdaptiveGatedPool2d,
    AdaptiveGatedPool3d,
    adaptive_windows,
)
from gatepool.layers.convert import convert
from gatepool.layers.pool_calls import SpatialMean

X = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


class Functional(nn.Module):
    """A stem, an Inception-like block and a DenseNet-like head, all pooling by functions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.branch = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = F.max_pool2d(self.conv(x), 3, stride=2, padding=1)  # (N, 8, 8, 8)
        b = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)
        x = torch.cat([self.branch(x), b], 1)  # (N, 16, 8, 8)
        x = F.adaptive_avg_pool2d(x, (3, 3))
        return self.fc(torch.flatten(x.mean((2, 3)), 1))


def test_functional_pools_become_modules_with_the_same_outputs():
    ref = Functional().eval()
    net = Functional()
    keys = set(net.state_dict())
    _, replaced = convert(net, "max", global_pool="avg")
    assert [(r.name, r.role, r.source) for r in replaced] == [
        ("max_pool2d", "window", "function"),
        ("avg_pool2d", "window", "function"),
        ("adaptive_avg_pool2d", "adaptive", "function"),
        ("mean", "head", "function"),
    ]
    assert replaced[0].old.startswith("F.max_pool2d(kernel_size=3, stride=2, padding=1, dilation=1")
    assert replaced[0].old.endswith(" in Functional.forward") and replaced[0].old_type is nn.MaxPool2d
    assert set(net.state_dict()) == keys and isinstance(net, Functional)  # the interface is kept
    assert type(net.max_pool2d) is nn.MaxPool2d and type(net.adaptive_avg_pool2d) is nn.AdaptiveMaxPool2d
    assert type(net.avg_pool2d) is nn.MaxPool2d  # gate max everywhere, as for modules
    net2 = Functional()
    convert(net2, "avg", include=(nn.AvgPool2d, nn.AdaptiveAvgPool2d), global_pool="avg")
    assert torch.equal(net2.eval()(X), ref(X))  # torch's own pools at the first pools' arguments


@pytest.mark.parametrize("gate", ["soft", "attention", "soft-learned"])
def test_functional_pools_take_any_gate_and_train(gate):
    net = Functional()
    _, replaced = convert(net, gate, global_pool="soft-learned", example_input=X)
    assert len(replaced) == 4 and net.mean.channels == 16 and net.mean.flatten
    assert not any(
        type(m) in (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, SpatialMean) for m in net.modules()
    )
    out = net(X)
    out.square().mean().backward()
    assert out.shape == (2, 5) and net.mean.log_temperature.grad.abs().sum() > 0
    other = Functional()
    convert(other, gate, global_pool="soft-learned", example_input=X)
    other.load_state_dict(net.state_dict())
    assert torch.equal(other.eval()(X), net.eval()(X))
    copied = copy.deepcopy(net)  # the rewritten forward is copied with it
    assert torch.equal(copied(X), net(X)) and copied.mean is not net.mean


def test_without_global_pool_the_head_call_is_left():
    net = Functional()
    _, replaced = convert(net, "soft")
    assert [r.name for r in replaced] == ["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]
    assert not hasattr(net, "mean")


class Untraceable(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            x = x * 2
        return F.max_pool2d(x, 2)


class Computed(nn.Module):
    def forward(self, x):
        return F.avg_pool2d(x, kernel_size=x.shape[-1])


@pytest.mark.parametrize(
    "module,match",
    [
        (Untraceable(), r"'0' \(Untraceable\): TraceError"),
        (Computed(), r"'0': F.avg_pool2d\(kernel_size=.*\): its arguments are computed in forward"),
    ],
)
def test_a_call_fx_cannot_rewrite_is_named_in_a_warning(module, match):
    net = nn.Sequential(module, nn.MaxPool2d(2))
    with pytest.warns(UserWarning, match="left these pool calls as they are.*" + match):
        _, replaced = convert(net, "soft")
    assert [r.name for r in replaced] == ["1"]


class Flagged(nn.Module):
    """A forward that branches on the mode, a plain attribute and a keyword, as timm's heads do."""

    def __init__(self):
        super().__init__()
        self.double = False

    def forward(self, x, pre_logits: bool = False):
        x = F.max_pool2d(x, 2)
        if self.double:
            x = x * 2
        if self.training:
            x = x + 1
        return x if pre_logits else x.mean((2, 3))


def test_the_rewritten_forward_follows_mode_attributes_and_arguments():
    ref, net = Flagged(), Flagged()
    convert(net, "max", global_pool="avg")
    assert type(net.max_pool2d) is nn.MaxPool2d and type(net.mean) is GlobalGatedPool2d
    for training in (True, False):
        for double in (False, True):
            ref.train(training), net.train(training)
            ref.double = net.double = double
            torch.testing.assert_close(net(X), ref(X))
            torch.testing.assert_close(net(X, pre_logits=True), ref(X, pre_logits=True))
            torch.testing.assert_close(net(X, True), ref(X, True))


class SqueezeExcite(nn.Module):
    def __init__(self, c, functional):
        super().__init__()
        self.functional = functional
        if not functional:
            self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce, self.expand = nn.Conv2d(c, 2, 1), nn.Conv2d(2, c, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True) if self.functional else self.pool(x)
        return x * torch.sigmoid(self.expand(F.relu(self.reduce(s))))


def _se_net(functional):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        SqueezeExcite(8, functional),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


@pytest.mark.parametrize("functional", [False, True])
def test_global_pool_is_the_head_and_squeeze_pool_the_squeezes(functional):
    net = _se_net(functional)
    _, replaced = convert(net, "soft", global_pool="soft")
    assert [(r.name, r.role) for r in replaced] == [("3", "head")]
    net = _se_net(functional)
    _, replaced = convert(net, "soft", global_pool="soft", squeeze_pool="attention", example_input=X)
    squeeze = "1.mean" if functional else "1.pool"
    assert sorted((r.name, r.role) for r in replaced) == sorted([(squeeze, "squeeze"), ("3", "head")])
    assert net.get_submodule(squeeze).gate == "attention" and net[3].gate == "soft"
    net(X).sum().backward()


@pytest.mark.parametrize(
    "make",
    [
        lambda: GlobalGatedPool2d("soft"),
        lambda: GlobalGatedPool2d("attention", channels=3),
        lambda: GlobalGatedPool2d("soft-learned", channels=3, flatten=True),
        lambda: SoftPool2d(2),
        lambda: AdaptiveGatedPool2d(3, gate="soft"),
        lambda: AdaptiveGatedPool2d(3, gate="attention", channels=3),
    ],
)
@pytest.mark.parametrize("batched", [True, False])
def test_a_gates_output_may_be_changed_in_place(make, batched):
    """EfficientNet's head: pool, flatten, an in-place dropout. No output may be a view made inside a
    custom autograd Function (the fused kernel's), which autograd forbids to change in place."""
    pool = make().double()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    x = x if batched else x[0]
    y = pool(x)
    want = torch.autograd.grad(F.relu(y.flatten()).sum(), x)[0]
    y = pool(x)
    y.flatten().relu_()  # the in-place op on a view of the output
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], want)


# --------------------------------------------------------------------------------------------------
# AdaptiveGatedPool


def test_adaptive_windows_are_torchs():
    for size, out in [(7, 7), (7, 3), (5, 7), (10, 4), (1, 3), (224, 7)]:
        index, mask = adaptive_windows(size, out)
        for i in range(out):
            start, end = math.floor(i * size / out), math.ceil((i + 1) * size / out)
            assert index[i][mask[i]].tolist() == list(range(start, end))
        x = torch.randn(1, 1, size, dtype=torch.float64)
        sums = torch.stack([x[0, 0, index[i][mask[i]]].mean() for i in range(out)])
        torch.testing.assert_close(sums, F.adaptive_avg_pool1d(x, out)[0, 0])


def _soft_ref(x, out, tau=1.0):
    """Σ softmax(v/τ) v over each adaptive window, by loops (2-D)."""
    n, c, h, w = x.shape
    res = torch.empty(n, c, *out, dtype=x.dtype)
    for i in range(out[0]):
        for j in range(out[1]):
            hs, he = math.floor(i * h / out[0]), math.ceil((i + 1) * h / out[0])
            ws, we = math.floor(j * w / out[1]), math.ceil((j + 1) * w / out[1])
            v = x[:, :, hs:he, ws:we].flatten(2)
            res[:, :, i, j] = (torch.softmax(v / tau, -1) * v).sum(-1)
    return res


@pytest.mark.parametrize("out", [(7, 7), (3, 2), (6, 6), (9, 4)])
def test_adaptive_gated_pool_values(out):
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(
        AdaptiveGatedPool2d(out, gate="soft", temperature=0.5)(x), _soft_ref(x, out, 0.5)
    )
    assert torch.equal(AdaptiveGatedPool2d(out, gate="avg")(x), F.adaptive_avg_pool2d(x, out))
    assert torch.equal(AdaptiveGatedPool2d(out, gate="max")(x), F.adaptive_max_pool2d(x, out))
    pool = AdaptiveGatedPool2d(out, gate="soft-learned", channels=3).double()
    with torch.no_grad():
        pool.log_temperature.copy_(torch.tensor([0.0, math.log(2.0), math.log(0.5)]))
    want = torch.stack([_soft_ref(x[:, k : k + 1], out, t)[:, 0] for k, t in enumerate((1.0, 2.0, 0.5))], 1)
    torch.testing.assert_close(pool(x), want)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(pool(x), x, g), torch.autograd.grad(want, x, g))
    att = AdaptiveGatedPool2d(out, gate="attention", channels=3).double()
    assert att(x).shape == (2, 3, *out) and att(x[0]).shape == (3, *out)


def test_adaptive_gated_pool_1d_3d_and_none():
    x1 = torch.randn(2, 3, 11, dtype=torch.float64)
    assert torch.equal(AdaptiveGatedPool1d(4, gate="avg")(x1), F.adaptive_avg_pool1d(x1, 4))
    torch.testing.assert_close(
        AdaptiveGatedPool1d(4, gate="soft", temperature=1e-6)(x1), F.adaptive_max_pool1d(x1, 4)
    )  # τ → 0: max pooling
    x3 = torch.randn(1, 2, 4, 5, 3, dtype=torch.float64)
    torch.testing.assert_close(
        AdaptiveGatedPool3d((2, 3, 2), gate="soft", temperature=1e6)(x3),
        F.adaptive_avg_pool3d(x3, (2, 3, 2)),
        atol=1e-5,
        rtol=0,
    )  # τ → ∞: avg
    x = torch.randn(1, 2, 7, 5, dtype=torch.float64)
    torch.testing.assert_close(AdaptiveGatedPool2d((None, 2), gate="soft")(x), _soft_ref(x, (7, 2)))


def test_adaptive_gated_pool_errors():
    with pytest.raises(ValueError, match="gate='conv' has no adaptive form .*vary in size"):
        AdaptiveGatedPool2d(7, gate="conv")
    with pytest.raises(ValueError, match=r"output_size must be an int ≥ 1 or a tuple of 2"):
        AdaptiveGatedPool2d((7, 0), gate="soft")
    with pytest.raises(ValueError, match="gate='attention' has weights: pass channels"):
        AdaptiveGatedPool2d(7, gate="attention")
    with pytest.raises(ValueError, match="input has 2 channels; this pool was built for channels=3"):
        AdaptiveGatedPool2d(2, gate="soft-learned", channels=3)(torch.randn(1, 2, 4, 4))
    assert repr(AdaptiveGatedPool2d((7, 7), gate="soft")) == "AdaptiveGatedPool2d((7, 7), gate='soft')"


def test_vgg_like_adaptive_head_converts():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.MaxPool2d(2), nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(), nn.Linear(4 * 49, 3)
    )
    _, replaced = convert(net, "attention", example_input=X)
    assert [(r.name, r.role) for r in replaced] == [("1", "window"), ("2", "adaptive")]
    assert type(net[2]) is AdaptiveGatedPool2d and net[2].output_size == (7, 7) and net[2].channels == 4
    assert net(X).shape == (2, 3)
    with pytest.warns(UserWarning, match=r"adaptive pools \['2'\] alone: gate='conv' has no adaptive form"):
        convert(copy.deepcopy(net), "conv", example_input=X)
