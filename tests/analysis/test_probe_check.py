"""gatepool.analysis.probe.check's counting (no zoo needed) and ``gatepool probe-check`` without the zoos.
The command on a real model: tests/vision/test_probe_check_zoo.py."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.probe import measure
from gatepool.analysis.probe.check import Check, check_model, family_pick, meets, summarize, table
from gatepool.cli import main


class Roll(nn.Module):
    def forward(self, x):
        return x.roll(1, dims=-1)


def net(roll: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), *([Roll()] if roll else []),
        nn.Conv2d(16, 16, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip


def images() -> torch.Tensor:
    return torch.randn(64, 3, 12, 12, generator=torch.Generator().manual_seed(0))


def test_summarize_counts_every_row_and_names_the_first_without_a_rule():
    report = measure(net(roll=True), images(), correlated=True)
    c = summarize(report, "roll-net")
    assert c.modules == len(report.rows) == 10  # (input), 8 modules, (output)
    assert c.with_rule == 4  # (input), the conv, BatchNorm, the ReLU: nothing after the roll
    assert c.no_rule.startswith("3 (Roll): roll: no correlated rule for call_method roll")
    assert c.forward == 4 and c.backward == 0  # no gradient comes back through the roll
    ratios = {r.name: r.predicted.var / r.forward.var for r in report.rows.values() if r.predicted.var}
    name, kind = c.worst.split()
    assert kind == "forward" and c.worst_ratio == pytest.approx(ratios[name])
    assert all(abs(v - 1) <= abs(c.worst_ratio - 1) + 1e-12 for v in ratios.values())


def test_check_model_on_a_model_with_every_rule():
    c = check_model(net(roll=False), images(), "net")
    assert (c.modules, c.with_rule, c.forward) == (9, 9, 9) and not c.no_rule and not c.error
    assert c.size == 12 and c.seconds > 0
    rows = measure(net(roll=False), images(), correlated=True).rows.values()
    assert c.backward == sum(abs(r.predicted.grad_e2 / r.backward.e2 - 1) <= 0.15 for r in rows)


def test_a_model_the_walk_cannot_trace_is_an_error_line():
    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # on its values: a size it would trace at

    c = check_model(nn.Sequential(nn.Conv2d(3, 4, 3), Branchy()), images())
    assert c.with_rule == 0 and "Untraceable" in c.error
    assert "Untraceable" in table([c])


def test_family_pick_and_table():
    assert family_pick(["resnet50", "resnet18", "resnext101_32x8d", "wide_resnet50_2"]) == "resnet18"
    assert family_pick(["efficientnet_b3", "efficientnet_b0", "efficientnet_v2_l"]) == "efficientnet_b0"
    assert family_pick(["regnet_y_16gf", "regnet_x_400mf", "regnet_x_8gf"]) == "regnet_x_400mf"
    lines = table([Check("tv:a", 64, 10, 9, 8, 7, "x forward", 1.31, "y (Z): no rule", 1.25),
                   Check("tv:b", error="runs at none of [64]")]).splitlines()  # fmt: skip
    assert lines[2] == (
        "| tv:a | 64 | 10 | 9 | 8 | 7 | x forward (1.31) | y (Z): no rule | **not met** | 1.2 |"
    )
    assert lines[3].startswith("| tv:b | – | – |") and "runs at none of [64]" in lines[3]
    assert lines[-1] == "0 of 2 models meet the target."


def test_the_target_is_ninety_percent_of_the_rows_each_way():
    assert meets(Check("a", 64, 10, 10, 9, 9))
    assert not meets(Check("a", 64, 10, 10, 10, 8))  # the backward short
    assert not meets(Check("a", 64, 10, 10, 8, 10))  # the forward short
    assert not meets(Check("a", 64, 0, 0, 0, 0))  # nothing measured
    assert not meets(Check("a", 64, 10, 10, 10, 10, error="ValueError: x"))
    assert table([Check("a", 64, 20, 20, 18, 19)]).splitlines()[-1] == "1 of 1 models meet the target."


def test_probe_check_without_the_zoos_says_how_to_get_them(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "timm", None)
    assert main(["probe-check", "--zoo", "torchvision"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs torchvision" in err and "make test-vision" in err
    assert main(["probe-check", "--models", "timm:resnet18"]) == 2
    assert "needs timm" in capsys.readouterr().err
    assert main(["probe-check", "--models", "resnet18"]) == 2
    assert "tv:NAME or timm:NAME" in capsys.readouterr().err


def test_sweep_appends_each_result_and_a_rerun_skips_the_models_done(tmp_path, monkeypatch):
    from gatepool.analysis.probe import check

    ran = []

    def fake(name, *, size, batch, seed):
        ran.append(name)
        return Check(name, size, 5, 4, 3, 2, "x forward", 1.2, "y (Z): no rule", 0.5)

    monkeypatch.setattr(check, "check_named", fake)
    path = str(tmp_path / "sweep.json")
    checks, left = check.sweep(["tv:a", "tv:b"], path=path, batch=8)
    assert ran == ["tv:a", "tv:b"] and not left and [c.model for c in checks] == ["tv:a", "tv:b"]
    checks, left = check.sweep(["tv:b", "tv:c", "tv:a"], path=path, batch=8)  # a and b read back
    assert ran == ["tv:a", "tv:b", "tv:c"] and [c.model for c in checks] == ["tv:b", "tv:c", "tv:a"]
    assert checks[0] == Check("tv:b", 64, 5, 4, 3, 2, "x forward", 1.2, "y (Z): no rule", 0.5)
    checks, left = check.sweep(["tv:a", "tv:d"], path=path, batch=8, budget=0)  # spent: d not started
    assert ran == ["tv:a", "tv:b", "tv:c"] and left == ["tv:d"] and len(checks) == 1
    with pytest.raises(ValueError, match="batch"):  # the file's results are at batch 8
        check.sweep(["tv:a"], path=path, batch=32)


def test_the_modules_inside_one_predicted_whole_are_not_counted():
    """timm's Attention is one step of the walk: its qkv and proj are measured but not reached; the
    block's row stands for them (without the rule the inner conv is counted and predicted itself)."""
    from gatepool.analysis.probe import correlated as cr
    from gatepool.analysis.probe import register_correlated_rule

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 1)

        def forward(self, x):
            return self.conv(x)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), Wrapped(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(16, 10))  # fmt: skip
    before = check_model(model, images())
    assert (before.modules, before.with_rule) == (9, 9)  # (input), 7 modules with 2.conv, (output)
    register_correlated_rule(Wrapped, lambda m: cr.Conv(m.conv.weight, m.conv.bias, (1, 1), (0, 0)))
    after = check_model(model, images())
    assert (after.modules, after.with_rule, after.forward) == (8, 8, 8) and not after.no_rule
