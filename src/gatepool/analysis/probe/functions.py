"""The probe's rules for the functions and methods of a traced graph, by target.

``torch.fx`` turns a model's forward into nodes: ``call_module`` nodes follow the module rules of
:mod:`rules`; ``call_function`` (``operator.add``, ``torch.cat``, ``F.relu``) and ``call_method``
(``x.view``, ``x.mean``) nodes follow the rules registered here:

    register_function_rule(target, rule)   target: the callable, or the method's name ("view", "add_");
                                           a later call replaces it; without rule, a decorator
    function_rule_for(target)              the rule, or None

A rule is ``rule(call) -> Op | Leaf``: ``call.args`` / ``call.kwargs`` are the node's, each tensor input
replaced by a :class:`TensorIn` (its index among the tensor inputs and its shape), each non-tensor node
(``x.size(0)``) by its value in the shape pass. ``Op.forward(xs) -> Moments`` takes the tensor inputs'
moments (None where unknown), ``Op.backward(g, xs)`` returns one ``GradMoments | None`` per tensor input.
A :class:`rules.Leaf` serves a one-tensor call. :class:`rules.NoRule` means no prediction.

    add, sub of tensors     mean µ_a ± µ_b,  Var = Var_a + Var_b,  backward each input E[g²]
                            ASSUMPTION: the inputs are independent (a residual stream and its branch, whose
                            last weights are zero-mean and random); two correlated inputs break it
    add, mul, div by c      µ + c;  µ·c, Var·c², E[g²]·c²
    mul of tensors          independent: E[(ab)²] = E[a²]·E[b²],  mean µ_a·µ_b;  backward E[g²]·E[b²]
    cat                     the parts pooled by their sizes: mean = Σ n_i µ_i / n,  E[x²] = Σ n_i E[x_i²] / n;
                            backward every part keeps E[g²]
    flatten, view, reshape, permute, transpose, squeeze, unsqueeze, contiguous, clone: the moments as they are
    getitem (a slice)       the moments as they are; backward E[g²] · n_out / n_in, the rest exact zeros
    expand (k copies)       the moments as they are; backward k · E[g²] (the copies' gradients independent)
    mean over n elements    Var / n (independent elements), mean kept;  backward E[g²] / n²
    relu, gelu, silu, tanh, sigmoid, dropout, max / avg / adaptive-avg pools: as their modules (``rules``)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from gatepool.analysis.probe import rules as R
from gatepool.analysis.probe.registry import Registry
from gatepool.analysis.probe.rules import GradMoments, Leaf, Moments, NoRule, need

__all__ = ["Call", "Op", "TensorIn", "function_rule_for", "register_function_rule"]


@dataclass(frozen=True)
class TensorIn:
    """A tensor input of a call: its index among the call's tensor inputs, and its shape (or None)."""

    index: int
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Call:
    """One call_function / call_method node: its target, arguments, tensor-input shapes, output shape."""

    target: Any
    args: tuple
    kwargs: dict = field(default_factory=dict)
    shapes: tuple = ()  # of the tensor inputs, in TensorIn order (None when unknown)
    out_shape: tuple[int, ...] | None = None
    border: str = "middle"

    def arg(self, i: int, name: str, default=None):
        """Argument ``i`` (positional) or ``name`` (keyword), else ``default``; the method's self is 0."""
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)


@dataclass(frozen=True)
class Op:
    """``forward(xs) -> Moments`` over the tensor inputs; ``backward(g, xs)``: one GradMoments per input."""

    forward: Callable[[Sequence[Moments | None]], Moments]
    backward: Callable[[GradMoments, Sequence[Moments | None]], Sequence[GradMoments | None]]


FunctionRule = Callable[[Call], "Op | Leaf"]

_FUNCTION_RULES = Registry("target", modules=False, functions=True)


def register_function_rule(target, rule: FunctionRule | None = None):
    """Use ``rule(call)`` for call nodes of ``target`` (a callable, or a method's name); returns ``rule``.

    Without ``rule`` it is a decorator: ``@register_function_rule(torch.roll)``.
    """
    return _FUNCTION_RULES.register(target, rule)


def function_rule_for(target) -> FunctionRule | None:
    """The rule registered for ``target``, or None."""
    return _FUNCTION_RULES.lookup(target)


def as_op(spec) -> Op:
    """An :class:`Op` from a rule's answer (a Leaf acts on the first tensor input)."""
    if isinstance(spec, Op):
        return spec
    if isinstance(spec, Leaf):

        def forward(xs):
            return spec.forward(xs[0] if xs else None)

        def backward(g, xs):
            x = xs[0] if xs else None
            return [spec.backward(g, x)] + [None] * (len(xs) - 1)

        return Op(forward, backward)
    raise TypeError(f"a function rule returns an Op or a Leaf, got {type(spec).__name__}")


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _numel(shape) -> int | None:
    return None if shape is None else math.prod(shape)


def _same(g: GradMoments, k: int) -> list[GradMoments]:
    return [g] * k


# ---------------------------------------------------------------------------------------------------
# Sums and products
# ---------------------------------------------------------------------------------------------------


def _sum_rule(sign: float) -> FunctionRule:
    """``a + α·b`` (sign +1) or ``a − α·b`` (sign −1), tensors or numbers."""

    def rule(call: Call) -> Op:
        a, b = call.arg(0, "input"), call.arg(1, "other")
        alpha = _number(call.kwargs.get("alpha", 1.0))
        if alpha is None:
            raise NoRule(f"{_name(call.target)} with a tensor alpha: no rule")
        ka, kb = sign * alpha, sign * alpha  # the factor on b
        if isinstance(a, TensorIn) and isinstance(b, TensorIn):  # independent inputs: variances add

            def forward(xs):
                x, y = need(xs[0], "both inputs' moments"), need(xs[1], "both inputs' moments")
                parts = (x, y) if kb == 1.0 else None  # a ReLU after it may take the sum's shape
                within = None
                if x.within is not None or y.within is not None:
                    within = R._within(x) + kb * kb * R._within(y)
                return Moments(x.mean + kb * y.mean, x.var + kb * kb * y.var, within=within, parts=parts)

            def backward(g, xs):
                return [g, GradMoments(ka * ka * g.e2, g.zero)]

            return Op(forward, backward)
        if isinstance(a, TensorIn) and _number(b) is not None:  # x ± c
            c = kb * _number(b)
            return Op(lambda xs: _shift(need(xs[0], "the input's moments"), 1.0, c), lambda g, xs: [g])
        if isinstance(b, TensorIn) and _number(a) is not None:  # c ± x
            c, k = _number(a), kb

            def forward(xs):
                x = need(xs[0], "the input's moments")
                return Moments(c + k * x.mean, k * k * x.var)

            return Op(forward, lambda g, xs: [GradMoments(k * k * g.e2, g.zero)])
        raise NoRule(f"{_name(call.target)} of {type(a).__name__} and {type(b).__name__}: no rule")

    return rule


def _shift(x: Moments, scale: float, c: float) -> Moments:
    return Moments(scale * x.mean + c, scale * scale * x.var)


def _mul_rule(call: Call) -> Op:
    """``a · b``: by a number, a scale; of two tensors, independent: ``E[(ab)²] = E[a²] · E[b²]``."""
    a, b = call.arg(0, "input"), call.arg(1, "other")
    divides = call.target in (operator.truediv, torch.div, "div", "div_", operator.itruediv)
    if isinstance(a, TensorIn) and isinstance(b, TensorIn):
        if divides:  # (x − μ) / σ, x / ‖x‖: a ratio of moments is no product of them
            raise NoRule(f"{_name(call.target)} of two tensors: no rule")

        def forward(xs):
            x, y = need(xs[0], "both inputs' moments"), need(xs[1], "both inputs' moments")
            mean = x.mean * y.mean
            return Moments(mean, max(x.e2 * y.e2 - mean * mean, 0.0))

        def backward(g, xs):  # ∂/∂a = g·b; a broadcast input's gradient is a sum: no rule for it
            out = []
            for this, other in ((a, xs[1]), (b, xs[0])):
                full = this.shape is not None and this.shape == call.out_shape
                out.append(GradMoments(g.e2 * other.e2, g.zero) if full and other is not None else None)
            return out

        return Op(forward, backward)
    tensor, c = (a, _number(b)) if isinstance(a, TensorIn) else (b, _number(a))
    if not isinstance(tensor, TensorIn) or c is None:
        raise NoRule(f"{_name(call.target)} of {type(a).__name__} and {type(b).__name__}: no rule")
    if divides:
        if tensor is not a or c == 0:
            raise NoRule("division by a tensor: no rule")
        c = 1.0 / c
    return Op(
        lambda xs: _shift(need(xs[0], "the input's moments"), c, 0.0),
        lambda g, xs: [GradMoments(c * c * g.e2, g.zero)],
    )


# ---------------------------------------------------------------------------------------------------
# Shapes: cat, the identities, slices, means
# ---------------------------------------------------------------------------------------------------


def _cat_rule(call: Call) -> Op:
    """The parts pooled by their sizes; every part keeps the output's E[g²]."""
    parts = call.arg(0, "tensors")
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, TensorIn) for p in parts):
        raise NoRule("cat of something other than tensors: no rule")
    sizes = [_numel(p.shape) for p in parts]
    if None in sizes:
        raise NoRule("cat needs the inputs' shapes")

    def forward(xs):
        xs = [need(x, "every input's moments") for x in xs]
        n = sum(sizes)
        mean = sum(s * x.mean for s, x in zip(sizes, xs)) / n
        e2 = sum(s * x.e2 for s, x in zip(sizes, xs)) / n
        return Moments(mean, max(e2 - mean * mean, 0.0))

    return Op(forward, lambda g, xs: _same(g, len(xs)))


def _identity_rule(call: Call) -> Leaf:
    """A view or a copy: the elements as they are (flatten, view, reshape, permute, ...)."""
    return Leaf(lambda x: need(x, "the input's moments"), lambda g, x: g)


def _getitem_rule(call: Call) -> Leaf:
    """A slice keeps the moments; only the n_out selected inputs get a gradient."""
    (src,) = [a for a in call.args[:1] if isinstance(a, TensorIn)] or [None]
    n_in, n_out = (None, None) if src is None else (_numel(src.shape), _numel(call.out_shape))
    if src is None or not n_in or n_out is None:
        raise NoRule("getitem needs the tensor's shapes")
    keep = min(n_out / n_in, 1.0)

    def backward(g, x):
        zero = None if g.zero is None else 1.0 - (1.0 - g.zero) * keep
        return GradMoments(g.e2 * keep, zero)

    return Leaf(lambda x: need(x, "the input's moments"), backward)


def _expand_rule(call: Call) -> Leaf:
    """A broadcast copy keeps the moments; backward each input sums the E[g²] of its k copies."""
    src = call.args[0] if call.args else None
    if not isinstance(src, TensorIn) or not _numel(src.shape) or _numel(call.out_shape) is None:
        raise NoRule("expand needs the shapes")
    k = _numel(call.out_shape) / _numel(src.shape)  # copies per input element
    return Leaf(lambda x: need(x, "the input's moments"), lambda g, x: GradMoments(g.e2 * k, None))


def _mean_rule(call: Call) -> Leaf:
    """The mean of n independent elements: Var / n; each gets g / n, so E[g²] / n²."""
    src = call.args[0] if call.args else None
    if not isinstance(src, TensorIn) or _numel(src.shape) is None or _numel(call.out_shape) is None:
        raise NoRule("mean needs the shapes")
    n = _numel(src.shape) / max(_numel(call.out_shape), 1)

    def forward(x):
        x = need(x, "the input's moments")
        return Moments(x.mean, x.var / n)

    return Leaf(forward, lambda g, x: GradMoments(g.e2 / (n * n), g.zero))


# ---------------------------------------------------------------------------------------------------
# Activations, dropout and pools, as their modules
# ---------------------------------------------------------------------------------------------------


def _relu_rule(call: Call) -> Leaf:
    return R._relu_rule(None, R.Site(None, call.border))


def _gelu_rule(call: Call) -> Leaf:
    return R.activation_leaf("gelu_tanh" if call.kwargs.get("approximate", "none") == "tanh" else "gelu")


def _activation_rule(name: str) -> FunctionRule:
    return lambda call: R.activation_leaf(name)


def _dropout_rule(call: Call) -> Leaf:
    p = _number(call.arg(1, "p", 0.5))
    training = call.arg(2, "training", True)
    if p is None or not isinstance(training, bool):
        raise NoRule("dropout with a traced p or training flag: no rule")
    module = torch.nn.Dropout(p)
    module.train(training)
    return R._dropout_rule(module, R.Site(None, call.border))


def _shapes(call: Call):
    src = call.args[0] if call.args else None
    if not isinstance(src, TensorIn) or src.shape is None or call.out_shape is None:
        return None
    return (src.shape, call.out_shape)


def _pool_rule(gate: str, d: int) -> FunctionRule:
    def rule(call: Call) -> Leaf:
        kernel = call.arg(1, "kernel_size")
        stride = call.arg(2, "stride", None)
        padding = call.arg(3, "padding", 0)
        if gate == "max" and R._tuple(call.arg(4, "dilation", 1), d) != (1,) * d:
            raise NoRule("dilated max pool: no rule")
        return R._window_rule(gate, kernel, stride or None, padding, d, _shapes(call), call.border)

    return rule


def _adaptive_avg_rule(d: int) -> FunctionRule:
    def rule(call: Call) -> Leaf:
        site = R.Site(_shapes(call), call.border)
        return R._adaptive_avg_rule(d)(None, site)

    return rule


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", repr(target))


def _register_all(rules: Sequence[tuple[Sequence[Any], FunctionRule]]) -> None:
    for targets, rule in rules:
        for t in targets:
            register_function_rule(t, rule)


_register_all([
    ((operator.add, operator.iadd, torch.add, "add", "add_", "__add__", "__iadd__"), _sum_rule(1.0)),
    ((operator.sub, operator.isub, torch.sub, "sub", "sub_"), _sum_rule(-1.0)),
    ((operator.mul, operator.imul, torch.mul, "mul", "mul_", operator.truediv, operator.itruediv,
      torch.div, "div", "div_"), _mul_rule),
    ((torch.cat, torch.concat, torch.concatenate), _cat_rule),
    ((torch.flatten, torch.reshape, torch.permute, torch.transpose, torch.squeeze, torch.unsqueeze,
      torch.clone, "flatten", "view", "reshape", "permute", "transpose", "squeeze", "unsqueeze",
      "contiguous", "clone", "view_as", "reshape_as", "t"), _identity_rule),
    ((operator.getitem,), _getitem_rule),
    ((torch.broadcast_to, "expand", "expand_as"), _expand_rule),
    ((torch.mean, "mean"), _mean_rule),
    ((F.relu, torch.relu, torch.relu_, "relu", "relu_"), _relu_rule),
    ((F.gelu,), _gelu_rule),
    ((F.silu,), _activation_rule("silu")),
    ((torch.tanh, F.tanh, "tanh", "tanh_"), _activation_rule("tanh")),
    ((torch.sigmoid, F.sigmoid, "sigmoid", "sigmoid_"), _activation_rule("sigmoid")),
    ((F.relu6,), _activation_rule("relu6")), ((F.hardsigmoid,), _activation_rule("hardsigmoid")),
    ((F.hardswish,), _activation_rule("hardswish")),
    ((F.dropout,), _dropout_rule),
    ((F.max_pool1d,), _pool_rule("max", 1)), ((F.max_pool2d,), _pool_rule("max", 2)),
    ((F.max_pool3d,), _pool_rule("max", 3)),
    ((F.avg_pool1d,), _pool_rule("avg", 1)), ((F.avg_pool2d,), _pool_rule("avg", 2)),
    ((F.avg_pool3d,), _pool_rule("avg", 3)),
    ((F.adaptive_avg_pool1d,), _adaptive_avg_rule(1)), ((F.adaptive_avg_pool2d,), _adaptive_avg_rule(2)),
    ((F.adaptive_avg_pool3d,), _adaptive_avg_rule(3)),
])  # fmt: skip
