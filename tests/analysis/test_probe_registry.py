"""One registry for the probe's rules, and a user's correlated rule for a block of their own (a module
class or a function): the walk uses it, and without it names the node it has no rule for."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.probe import measure, register_correlated_rule
from gatepool.analysis.probe.correlated import Field, measure_input, neighbour_corr, registry
from gatepool.analysis.probe.correlated_predict import predict_correlated
from gatepool.analysis.probe.registry import Registry


@pytest.fixture(autouse=True)
def private_registry(monkeypatch):
    """Each test registers into a copy: the built-in rules stay as they were."""
    monkeypatch.setattr(registry, "RULES", registry.RULES.copy())


@torch.fx.wrap
def mirror(x: torch.Tensor, gain: float) -> torch.Tensor:
    """y = gain · x mirrored left to right (one node of the traced graph: fx.wrap)."""
    return gain * x.flip(-1)


class Mirror(nn.Module):
    def __init__(self, gain: float) -> None:
        super().__init__()
        self.gain = gain

    def forward(self, x):
        return self.gain * x.flip(-1)


class MirrorStep:
    """The rule: the maps mirrored and scaled by gain (variance by gain²), the stencil mirrored."""

    def __init__(self, gain: float) -> None:
        self.gain = gain

    def _mirrored(self, f: Field, mean: torch.Tensor) -> Field:
        return Field(mean, self.gain**2 * f.var.flip(-1), f.corr.flip(-1))

    def forward(self, x: Field) -> Field:
        return self._mirrored(x, self.gain * x.mean.flip(-1))

    def backward(self, g: Field) -> Field:
        return self._mirrored(g, torch.zeros_like(g.var))


class Net(nn.Module):
    def __init__(self, block: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.mirror = Mirror(2.0) if block == "module" else None
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8, 4))

    def forward(self, x):
        y = self.conv(x)
        y = self.mirror(y) if self.mirror is not None else mirror(y, 2.0)
        return self.head(self.pool(self.relu(y)))


def images() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 1, 12, 12, generator=g)
    return x + 0.5 * x.roll(1, -1)  # neighbours correlated: a mirror the rule got wrong would show


@pytest.mark.parametrize("block", ["module", "function"])
def test_a_users_rule_for_their_own_block(block):
    torch.manual_seed(0)
    net = Net(block)
    x = images()
    row = "mirror" if block == "module" else "relu"
    before = measure(net, x, correlated=True)
    assert before["relu"].predicted.var is None
    named = "call_method flip" if block == "module" else "call_function mirror"  # traced through, or wrapped
    assert f"no correlated rule for {named}" in before[row].predicted.note

    if block == "module":
        register_correlated_rule(Mirror, lambda m: MirrorStep(m.gain))
    else:
        register_correlated_rule(mirror, lambda x, gain: MirrorStep(gain))
    report = measure(net, x, correlated=True)
    assert not report.warnings
    for name in ("relu", "pool", "(output)"):  # (the input's E[g²] is 8 channels' and 4 logits' draw)
        r = report[name]
        assert r.predicted.var == pytest.approx(r.forward.var, rel=0.05), name
        assert r.predicted.grad_e2 == pytest.approx(r.backward.e2, rel=0.1), name
    assert report["(input)"].predicted.grad_e2 > 0  # the backward went through the block to the input
    if block == "module":  # the module's own row: the rule's (gain² · the conv's), and the measurement's
        assert report["mirror"].predicted.var == pytest.approx(4 * report["conv"].predicted.var, rel=1e-12)
        assert report["mirror"].predicted.var == pytest.approx(report["mirror"].forward.var, rel=5e-3)
        assert report["mirror"].predicted.corr(1) == pytest.approx(
            neighbour_corr(report["mirror"].measured_field, 1), abs=0.01
        )


def test_a_rule_is_found_for_subclasses_and_replaced_by_a_later_one():
    class Louder(Mirror):
        pass

    register_correlated_rule(Mirror, lambda m: MirrorStep(m.gain))
    stats = measure_input(images())
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), Louder(3.0))
    pred = predict_correlated(model, stats)
    assert pred["1"].var == pytest.approx(9 * pred["0"].var)

    @register_correlated_rule(Mirror)  # the decorator form; replaces the first
    def half(m):
        return MirrorStep(m.gain / 2)

    assert predict_correlated(model, stats)["1"].var == pytest.approx(2.25 * pred["0"].var)


def test_bad_registrations():
    with pytest.raises(TypeError, match="target must be an nn.Module subclass"):
        register_correlated_rule(int, lambda m: MirrorStep(1.0))
    with pytest.raises(TypeError, match="target must be an nn.Module subclass or a callable or a method"):
        register_correlated_rule(3, lambda m: MirrorStep(1.0))
    with pytest.raises(TypeError, match="rule must be callable"):
        register_correlated_rule(Mirror, "mirror")


def test_registry_lookup():
    modules = Registry("module_type", modules=True, functions=False)
    rule = modules.register(nn.Conv2d, lambda m, site: None)
    assert modules.lookup(type("MyConv", (nn.Conv2d,), {})) is rule and modules.lookup(nn.Conv1d) is None
    with pytest.raises(TypeError, match="module_type must be an nn.Module subclass, got 'view'"):
        modules.register("view", rule)
    functions = Registry("target", modules=False, functions=True)
    functions.register("view", rule)
    assert functions.lookup("view") is rule and functions.lookup([1]) is None  # unhashable: no rule
    copy = functions.copy()
    copy.register(torch.roll, rule)
    assert torch.roll in copy and torch.roll not in functions
    with pytest.raises(ValueError, match="module rules, function rules or both"):
        Registry("x", modules=False, functions=False)
