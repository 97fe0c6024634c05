"""gatepool.analysis.probe through torch.fx: a model without a rule is traced and predicted node by node.

Tolerances: the stem conv sees an exact N(0, 1) input and the rule uses its actual weights, so only the
input's sampling moves the measured Var (< 1% over 64·32·8·8 values): 4%. Deeper, the rules' own
assumptions (independent, normal elements; independent residual branches) hold only approximately:
15%, the issue's bar. Where an assumption is known not to hold the test states it and the band seen.
"""

from __future__ import annotations

import statistics

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import GradMoments, Leaf, Moments, measure, need, predict, register_rule
from gatepool.analysis.probe import rules as rules_module
from gatepool.analysis.probe.external_models import build_model


@pytest.fixture(autouse=True)
def private_registry(monkeypatch):
    """Each test registers into a copy: the built-in rules stay as they were."""
    monkeypatch.setattr(rules_module, "_RULES", rules_module._RULES.copy())


class Shift(nn.Module):
    """``s · roll(x)``: torch.roll has no rule, so only a registered module rule predicts it."""

    def __init__(self, s: float) -> None:
        super().__init__()
        self.s = s

    def forward(self, x):
        return self.s * torch.roll(x, 1, dims=-1)


class Block(nn.Module):
    """``relu(x + bn2(conv2(relu(bn1(conv1(x))))))``, the ReLUs functional."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(x + y)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.block = Block(32)
        self.pool = nn.AvgPool2d(2)
        self.a, self.b = nn.Conv2d(32, 16, 1), nn.Conv2d(32, 16, 1)
        self.shift = Shift(0.5)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):  # (B, 3, 8, 8) -> (B, 10)
        x = self.block(torch.relu(self.bn(self.stem(x))))
        x = self.pool(x)  # (B, 32, 4, 4)
        x = torch.cat([self.a(x), self.b(x)], dim=1)
        x = self.shift(x)
        return self.fc(torch.flatten(x, 1))


def shift_rule(m: Shift, site) -> Leaf:
    def forward(x):
        x = need(x, "the input's moments")
        return Moments(m.s * x.mean, m.s**2 * x.var)

    return Leaf(forward, lambda g, x: GradMoments(m.s**2 * g.e2, g.zero))


FEW_ROWS = ("fc", "(output)")


def _net_report():
    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    ideal = predict(model, x.shape, border="average")
    return model, measure(model, x, prediction=ideal, samples=0)


def test_hand_written_net_before_and_after_a_user_rule():
    model, report = _net_report()
    assert report["shift"].ideal.var is None and "roll" in report["shift"].ideal.note
    assert report["fc"].ideal.var is None  # downstream of it: nothing
    assert report["a"].ideal.var is not None and report["block"].ideal.var is not None

    register_rule(Shift)(shift_rule)  # the decorator form
    model, report = _net_report()
    names = [n for n, _ in model.named_modules() if n] + ["(output)"]
    for n in names:
        assert report[n].ideal.var is not None and report[n].ideal.grad_e2 is not None, (n, report[n].ideal)
    # the stem: exact N(0, 1) input, the rule on the conv's own weights, zero padding at the border
    assert report["stem"].ratio("var") == pytest.approx(1.0, abs=0.04)
    for n in names:
        if n not in FEW_ROWS:
            assert report[n].ratio("var") == pytest.approx(1.0, abs=0.15), n
    # where the assumption does not hold: 79% of the fc input's variance is a fixed mean per feature
    # (the channel means µ·Σw + b of the 1×1 convs a and b), and it reaches the 10 outputs through 10
    # random rows, a χ²₁₀-sized draw (sd ≈ 45%) where the rule takes the expectation over the weights
    for n in FEW_ROWS:
        assert 1.15 < report[n].ratio("var") < 1.5, (n, report[n].ratio("var"))  # 1.26 at seed 0
    # the rules, checked on the prediction itself
    ideal = report.prediction
    assert ideal["block"].var is not None and ideal["bn"].var == pytest.approx(1.0, rel=1e-3)
    assert ideal["pool"].var == pytest.approx(ideal["block"].var / 4)  # avg of 4 independent values
    assert ideal["shift"].var == pytest.approx(0.25 * ideal["b"].var, rel=0.2)  # s² · Var of the cat
    # backward: the unit-noise seed, the fc, the shift (s²), the cat (each part keeps E[g²])
    assert ideal["(output)"].grad_e2 == 1.0
    assert ideal["a"].grad_e2 == pytest.approx(ideal["b"].grad_e2)
    assert ideal["a"].grad_e2 == pytest.approx(0.25 * ideal["shift"].grad_e2)
    for n in ("fc", "shift", "a", "b", "pool", "block"):
        assert report[n].ratio("grad_e2") == pytest.approx(1.0, abs=0.15), n


def test_border_factor_is_needed():
    # 8×8 maps, 3×3 kernels with padding 1: (22/24)² = 0.84 of the taps are real on average
    model, report = _net_report()
    middle = predict(model, (64, 3, 8, 8), border="middle")["stem"].var
    var_b = float(model.stem.bias.detach().double().var(unbiased=False))  # the bias: no border
    assert report["stem"].ideal.var - var_b == pytest.approx((middle - var_b) * (22 / 24) ** 2, rel=1e-6)


class Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:
            return self.lin(x)
        return -self.lin(x)


def test_untraceable_model_falls_back():
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    report = measure(Branchy(), x)
    note = report["(output)"].ideal.note
    assert "no rule for Branchy" in note and "torch.fx cannot trace it" in note
    assert report["lin"].ideal.var is None and "inside Branchy" in report["lin"].ideal.note
    assert report.complete and report["lin"].forward is not None  # measured all the same


def test_functions_and_parameters_in_the_graph():
    class Mix(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(64, 64)
            self.bias = nn.Parameter(torch.zeros(64))

        def forward(self, x):
            h = torch.tanh(self.lin(x))
            return (h + self.bias).view(x.size(0), 8, 8).mean(-1)

    torch.manual_seed(2)
    model = Mix()
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(2))
    report = measure(model, x, samples=0)
    assert report["(output)"].ideal.var is not None
    assert report["(output)"].ratio("var") == pytest.approx(1.0, abs=0.1)
    assert report["(input)"].ratio("grad_e2") == pytest.approx(1.0, abs=0.1)


def test_build_model_without_the_library(monkeypatch):
    import sys

    for name in ("torchvision", "torchvision.models", "timm"):  # None in sys.modules: the import fails
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ValueError, match=r"torchvision:resnet18.*pip install gatepool\[vision\]"):
        build_model("torchvision:resnet18")
    with pytest.raises(ValueError, match="timm:resnet18"):
        build_model("timm:resnet18")
    with pytest.raises(ValueError, match="library:NAME"):
        build_model("resnet18")


# ---------------------------------------------------------------------------------------------------
# torchvision's ResNet-18 (runs in .venv-vision)
# ---------------------------------------------------------------------------------------------------

# Where the assumption does not hold: the global average pool over layer4's 2×2 maps. Every position
# there is a corner, each missing other taps of the zero padding, so each channel has a fixed pattern of
# means over the 4 positions (21% of the variance); the pool averages it away, where the rule divides
# all of the variance by 4 as for independent positions: measured/predicted 0.81 at seed 0.
NOT_INDEPENDENT = {"avgpool"}


def test_resnet18_predicted():
    pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = build_model("torchvision:resnet18").train()
    x = torch.randn(64, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    ideal = predict(model, x.shape, border="average")
    report = measure(model, x, prediction=ideal, samples=0)
    names = [n for n, _ in model.named_modules() if n]
    predicted = [n for n in names if report[n].ideal is not None and report[n].ideal.var is not None]
    assert len(predicted) / len(names) >= 0.9
    holds = {n: report[n].ratio("var") for n in predicted if n not in NOT_INDEPENDENT}
    off = {n: r for n, r in holds.items() if abs(r - 1) > 0.15}
    assert not off, off
    for n in NOT_INDEPENDENT:
        assert 0.7 < report[n].ratio("var") < 0.9, (n, report[n].ratio("var"))
    errors = [abs(r - 1) for r in holds.values()]
    grads = [abs(report[n].ratio("grad_e2") - 1) for n in predicted]
    print(
        f"\nresnet18: {len(predicted)}/{len(names)} predicted; Var |meas/pred - 1| median "
        f"{statistics.median(errors):.3f}, worst {max(errors):.3f}; not holding: "
        + ", ".join(f"{n} {report[n].ratio('var'):.3f}" for n in sorted(NOT_INDEPENDENT))
        + f"; E[g²] |meas/pred - 1| median {statistics.median(grads):.3f}, worst {max(grads):.3f}"
    )
    # the seed and the head's backward are exact; deeper, see the module docstring of graph.py
    assert report["fc"].ratio("grad_e2") == pytest.approx(1.0, abs=0.05)
    assert report["avgpool"].ratio("grad_e2") == pytest.approx(1.0, abs=0.05)


# ---------------------------------------------------------------------------------------------------
# the correlated prediction (probe.correlated_predict) on ResNet-18: every module's forward Var and the
# input's E[g²] within 10% (issue 25's bar), from the input's statistics alone
# ---------------------------------------------------------------------------------------------------


def _correlated_resnet18(x):
    from gatepool.analysis.probe.correlated import measure_input
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    torch.manual_seed(0)
    model = build_model("torchvision:resnet18").train()
    pred = predict_correlated(model, measure_input(x))
    report = measure(model, x, samples=0, backward="unit-noise")
    names = [n for n, _ in model.named_modules() if n]
    assert not pred.notes and all(pred[n].var is not None and pred[n].grad_e2 is not None for n in names)
    fwd = {n: report[n].forward.var / pred[n].var for n in names}
    bwd = {n: report[n].backward.e2 / pred[n].grad_e2 for n in [*names, "(input)"]}
    return fwd, bwd


@pytest.mark.slow
def test_resnet18_correlated_on_noise():
    pytest.importorskip("torchvision")
    x = torch.randn(64, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    fwd, bwd = _correlated_resnet18(x)
    assert not {n: r for n, r in fwd.items() if abs(r - 1) > 0.1}  # the global pool included
    assert not {n: r for n, r in bwd.items() if abs(r - 1) > 0.1}  # the input's: 0.98 (the ideal's 1.8)
    assert fwd["avgpool"] == pytest.approx(1.0, abs=0.03)  # its pattern of means: the ideal's 0.81


# Where it does not hold on digits: the stem's output is not Gaussian given its position (a stroke is
# there or not), and the max of nine taps of such a mixture is lower than the max of normals of the
# same mean, variance and correlation: the max pool's mean is predicted 19% high, which the next conv
# carries (measured/predicted 0.88 at seed 0; the channels' independence adds 4% of it), and through its
# BatchNorm's divisor the gradients below (1.1-1.3).
NOT_GAUSSIAN = {"layer1.0.conv1": (0.8, 0.95)}


@pytest.mark.slow
def test_resnet18_correlated_on_digits():
    pytest.importorskip("torchvision")
    from gatepool.analysis.probe.external_models import resized_digits
    from gatepool.data import DataError, load_dataset

    try:
        digits = torch.as_tensor(load_dataset("mnist", "train").normalized()[:64]).float()
    except DataError as e:
        pytest.skip(str(e))
    fwd, bwd = _correlated_resnet18(resized_digits(digits, 64))
    assert not {n: r for n, r in fwd.items() if n not in NOT_GAUSSIAN and abs(r - 1) > 0.1}
    for n, (lo, hi) in NOT_GAUSSIAN.items():
        assert lo < fwd[n] < hi, (n, fwd[n])
    assert bwd["(input)"] == pytest.approx(1.0, abs=0.1)  # 1.04 (the ideal's 1.6)
