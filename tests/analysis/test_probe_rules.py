"""gatepool.analysis.probe.rules: rules by module type, found through the MRO; a user registers their own."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.probe import (
    GradMoments,
    Leaf,
    Moments,
    NoRule,
    Residual,
    measure,
    need,
    predict,
    register_rule,
    relu_backward,
    rule_for,
)
from gatepool.analysis.probe import rules as rules_module
from gatepool.models.residual_cnn import PreActBlock


@pytest.fixture(autouse=True)
def private_registry(monkeypatch):
    """Each test registers into a copy: the built-in rules stay as they were."""
    monkeypatch.setattr(rules_module, "_RULES", rules_module._RULES.copy())


class Scale(nn.Module):
    """y = s·x: Var(y) = s²·Var(x), E[g_x²] = s²·E[g_y²]."""

    def __init__(self, s: float) -> None:
        super().__init__()
        self.s = s

    def forward(self, x):
        return self.s * x


def scale_rule(m: Scale, site) -> Leaf:
    def forward(x):
        x = need(x, "the input's moments")
        return Moments(m.s * x.mean, m.s**2 * x.var)

    return Leaf(forward, lambda g, x: GradMoments(m.s**2 * g.e2, g.zero))


def test_a_users_module_gets_a_rule():
    model = nn.Sequential(nn.Linear(64, 64), Scale(3.0))
    before = predict(model, (4, 64))
    assert before["1"].var is None and before["1"].note == "no rule for Scale"
    assert before["0"].grad_e2 is None  # nothing passes back through it

    register_rule(Scale, scale_rule)
    ideal = predict(model, (4, 64))
    assert ideal["1"].var == pytest.approx(9 * ideal["0"].var) and ideal["1"].note == ""
    assert ideal["0"].grad_e2 == pytest.approx(9.0)  # unit noise at the output, times s²
    assert ideal["(input)"].grad_e2 is not None
    # and the rule matches what the module does: measured / ideal ≈ 1 on random inputs
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(0))
    report = measure(model, x, prediction=ideal, samples=0)
    assert report["1"].ratio("var") == pytest.approx(1.0, abs=0.1)
    assert report["0"].ratio("grad_e2") == pytest.approx(1.0, abs=0.1)


def test_subclasses_inherit_a_rule_and_a_closer_registration_wins():
    class Triple(Scale):
        def __init__(self) -> None:
            super().__init__(3.0)

    register_rule(Scale, scale_rule)
    assert rule_for(Triple()) is scale_rule
    assert predict(nn.Sequential(Triple()), (2, 5))["0"].var == pytest.approx(9.0)

    def no_rule(m, site):
        raise NoRule("Triple: measured only")

    register_rule(Triple, no_rule)
    assert rule_for(Triple()) is no_rule and rule_for(Scale(2.0)) is scale_rule
    ideal = predict(nn.Sequential(Triple()), (2, 5))
    assert ideal["0"].var is None and ideal["0"].note == "Triple: measured only"


def test_a_users_residual_block():
    class Skip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.ReLU(), nn.Linear(32, 32))

        def forward(self, x):
            return x + self.body(x)

    torch.manual_seed(0)
    model = nn.Sequential(Skip())
    traced = predict(model, (2, 32))  # no rule: torch.fx traces it, x + body(x) node by node
    assert traced["0"].note == "" and traced["0"].var == pytest.approx(1.0 + traced["0.body"].var)

    register_rule(Skip, lambda m, site: Residual(("body",)))
    ideal = predict(model, (2, 32))
    for name in ("0", "0.body", "0.body.1", "(input)"):  # the rule and the traced graph agree
        assert ideal[name].var == pytest.approx(traced[name].var), name
        assert ideal[name].grad_e2 == pytest.approx(traced[name].grad_e2), name
    assert ideal["0"].var == pytest.approx(1.0 + ideal["0.body"].var)  # x + branch(x): variances add
    assert ideal["0.body.1"].var is not None  # the branch's own modules are walked
    # backward: the stream's E[g²] plus the branch's, which the ReLU halves (its input is N(0, 1))
    assert ideal["(input)"].grad_e2 == pytest.approx(1.0 + relu_backward(ideal["0.body.0"].grad_e2, 0.0, 1.0))
    assert ideal["(input)"].grad_e2 == pytest.approx(1.0 + ideal["0.body.0"].grad_e2 / 2)


def test_the_residual_cnn_block_registers_its_own_rule():
    rule = rule_for(PreActBlock(8, groups=2))
    assert rule is not None and rule.__module__ == "gatepool.models.residual_cnn"


def test_bad_registrations_and_bad_rules():
    with pytest.raises(TypeError, match="module_type"):
        register_rule(int, scale_rule)
    with pytest.raises(TypeError, match="module_type"):
        register_rule(Scale(1.0), scale_rule)
    with pytest.raises(TypeError, match="rule must be callable"):
        register_rule(Scale, "scale")
    register_rule(Scale, lambda m, site: (m.s, m.s))
    with pytest.raises(TypeError, match="Scale returned tuple.*Leaf, a Chain or a Residual"):
        predict(nn.Sequential(Scale(2.0)), (2, 3))
