"""graph.Walk, the loop both predictors walk a traced graph with, on a toy state: a node's value the sum of
its inputs', its gradient sent whole to each input (the derivative of a sum)."""

import torch
import torch.fx as fx
import torch.nn as nn

from gatepool.analysis.probe.graph import NoPrediction, Walk, trace


class _Sums(Walk):
    """Values and gradients are numbers; ``torch.neg`` has no rule."""

    def __init__(self, module: nn.Module) -> None:
        gm, _ = trace(module)
        nodes = list(gm.graph.nodes)
        super().__init__(gm, nodes[0], nodes[-1].args[0])

    def visit(self, n):
        self.inputs[n] = [a for a in n.args if isinstance(a, fx.Node)]  # x + x: x twice
        if n.target is torch.neg:
            raise NoPrediction(f"no rule for {n.name}")
        if any(self.value[a] is None for a in self.inputs[n]):
            raise NoPrediction(f"no input for {n.name}")
        return sum(self.value[a] for a in self.inputs[n])

    def add(self, a, b):
        return a + b

    def pull(self, n, g, parts):
        return [g if self.value[n] is not None else None] * len(self.inputs[n])


class _Twice(nn.Module):
    def forward(self, x):
        y = x + x  # x used three times in all
        return y + x


class _Dropped(nn.Module):
    def forward(self, x):
        d = x + x  # noqa: F841 (a value computed and dropped)
        return x + x


class _NoRule(nn.Module):
    def forward(self, x):
        a = torch.neg(x)
        b = a + x
        return b + x


def test_walk_sums_the_gradients_of_a_tensor_used_several_times():
    walk = _Sums(_Twice())
    assert walk.forward(1.5) == 4.5
    assert walk.backward(1.0) == 3.0  # out = 3x: three parts of 1 at x


def test_walk_sends_nothing_from_a_value_no_node_reads():
    walk = _Sums(_Dropped())
    walk.forward(1.0)
    assert walk.backward(1.0) == 2.0  # the dropped x + x adds nothing (its gradient is zero, not unknown)


def test_walk_names_the_first_node_without_a_rule_and_its_gradient_is_unknown():
    walk = _Sums(_NoRule())
    assert walk.forward(1.0) is None
    neg = next(n for n in walk.nodes if n.target is torch.neg)
    assert walk.reason[neg] == f"no rule for {neg.name}"
    assert walk.reason[walk.out] == walk.reason[neg]  # not "no input for ...": the first node's reason
    walk.value[walk.out] = 0.0  # the output known: its gradient reaches x through b, and through neg as None
    assert walk.backward(1.0) is None  # one of x's parts unknown: its sum unknown


def test_walk_seeds_say_where_the_backward_starts():
    class _Unknown(_Sums):
        def seeds(self, g):  # as the ideal's walk: a value no node reads has an unknown gradient
            read = {a for xs in self.inputs.values() for a in xs}
            return {**{n: None for n in self.inputs if n not in read}, **super().seeds(g)}

    walk = _Unknown(_Dropped())
    walk.forward(1.0)
    assert walk.backward(1.0) is None


def test_walk_lets_each_step_go_once_its_gradient_is_pulled():
    """A pull reads its own step and its inputs' (the correlated walk's cat of ReLUs): both still there
    when it comes, and none left after the walk (their memory released as it goes)."""

    class _Stepped(_Sums):
        def visit(self, n):
            self.steps[n] = super().visit(n)
            return self.steps[n]

        def pull(self, n, g, parts):
            assert all(a in self.steps for a in [n, *self.inputs[n]] if a is not self.input)
            return super().pull(n, g, parts)

    walk = _Stepped(_Twice())
    walk.forward(1.5)
    assert walk.backward(1.0) == 3.0 and len(walk.steps) == 0
