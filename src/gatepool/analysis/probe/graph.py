"""The rules walked through a ``torch.fx`` graph: any module that ``symbolic_trace`` can trace.

    forward   node by node in graph order: E[x], Var(x) of every tensor node from its inputs'
    backward  node by node in reverse: E[g²] of every tensor node, summed over the nodes it feeds
              (``x`` used twice gets ``g₁ + g₂``: E[g²] = E[g₁²] + E[g₂²], the two independent)

A module with a rule (:func:`rules.rule_for`, ``nn.Sequential`` aside) is one ``call_module`` node whose
step the caller builds (``predict`` builds it as it builds any module); every other module is traced
through, and its output node stands for it. ``call_function`` / ``call_method`` nodes follow
:mod:`functions`; ``get_attr`` tensors (a parameter used in the forward) enter with their own mean and
Var. A node without a rule has no prediction, and neither has anything computed from it; ``reason``
says which node it was. A module that cannot be traced (data-dependent control flow, several inputs)
raises :class:`Untraceable` with torch's reason: the caller falls back to module-by-module rules.

    ASSUMPTIONS: every tensor node's elements are independent and (for the nonlinear rules) normal with
    the propagated mean and Var; the inputs of an add are independent (residual add: Var = Var_a + Var_b).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.fx as fx
import torch.nn as nn

from gatepool.analysis.probe.functions import Call, TensorIn, as_op, function_rule_for
from gatepool.analysis.probe.rules import GradMoments, Moments, NoRule, rule_for

__all__ = ["GraphWalk", "Step", "Untraceable", "trace"]


class Untraceable(Exception):
    """``torch.fx`` could not trace the module; the message is torch's reason."""


class Step(Protocol):
    """One module call: ``forward(x) -> Moments | None``, ``backward(g) -> GradMoments | None``."""

    def forward(self, x: Moments | None) -> Moments | None: ...

    def backward(self, g: GradMoments | None) -> GradMoments | None: ...


def _is_rule_leaf(m: nn.Module) -> bool:
    """A module with a rule is one node (a plain ``nn.Sequential`` is traced through instead)."""
    return rule_for(m) is not None and type(m) is not nn.Sequential


class _Tracer(fx.Tracer):
    """Leaves: modules ``leaf`` keeps whole, and torch's own modules; records each module call's output
    node."""

    def __init__(self, leaf: Callable[[nn.Module], bool]) -> None:
        super().__init__()
        self.leaf = leaf
        self.calls: list[tuple[str, fx.Node]] = []  # (module name, its output node), in call order

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return self.leaf(m) or super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):
        out = super().call_module(m, forward, args, kwargs)
        if isinstance(out, fx.Proxy):
            self.calls.append((self.path_of_module(m), out.node))
        return out


def trace(
    module: nn.Module, leaf: Callable[[nn.Module], bool] = _is_rule_leaf
) -> tuple[fx.GraphModule, list[tuple[str, fx.Node]]]:
    """(graph module, [(module name, output node)]) of ``module``; :class:`Untraceable` if torch fails.

    ``leaf(m)``: whether a module is kept whole, one node (default: it has a rule of :mod:`rules`; the
    correlated walk passes its own rules' test), every other module traced through.
    """
    tracer = _Tracer(leaf)
    try:
        graph = tracer.trace(module)
    except Exception as e:  # TraceError, control flow on a Proxy, anything the forward raises
        raise Untraceable(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return fx.GraphModule(module, graph), tracer.calls


class _ShapePass(fx.Interpreter):
    """Every node's value on zeros of batch 1: its shape for tensors (batch put back), else the value."""

    def __init__(self, gm: fx.GraphModule, batch: int) -> None:
        super().__init__(gm)
        self.batch = batch
        self.info: dict[fx.Node, tuple[str, Any]] = {}  # ("tensor", shape) | ("value", v) | ("other", None)

    def run_node(self, n: fx.Node):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            s = tuple(out.shape)
            self.info[n] = ("tensor", (self.batch, *s[1:]) if s and s[0] == 1 else s)
        elif isinstance(out, (int, float, bool, str, type(None))) or (
            isinstance(out, (tuple, list, torch.Size)) and all(isinstance(v, (int, float)) for v in out)
        ):
            self.info[n] = ("value", out)
        else:
            self.info[n] = ("other", None)
        return out


def _combine(parts: list[GradMoments | None]) -> GradMoments | None:
    """E[g²] of a sum of independent gradients; exact zero only where every part is (independent)."""
    if not parts or any(p is None for p in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    zero = 1.0
    for p in parts:
        zero = None if zero is None or p.zero is None else zero * p.zero
    return GradMoments(sum(p.e2 for p in parts), zero)


class GraphWalk:
    """The traced graph of ``module``, walked forward from one input's moments and backward from E[g²].

    ``make_step(name, module, io)`` builds the step of a module with a rule (``io``: its input and
    output shapes in this call); after a walk ``value[node]`` / ``grad[node]`` hold the figures,
    ``reason[node]`` why one is None, and ``calls`` the (module name, output node) of every module call.
    """

    def __init__(
        self,
        module: nn.Module,
        input_shape: tuple[int, ...] | None,
        border: str,
        make_step: Callable[[str, nn.Module, tuple | None], Step],
    ) -> None:
        self.gm, self.calls = trace(module)
        self.nodes = list(self.gm.graph.nodes)
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        required = [n for n in placeholders if not n.args]  # a placeholder with a default is optional
        if len(required) != 1:
            raise Untraceable(f"the forward takes {len(required)} tensor inputs; the walk follows one")
        self.input = required[0]
        self.info = self._shape_pass(module, input_shape, placeholders)
        self.border = border
        self.steps: dict[fx.Node, Any] = {}
        self.reason: dict[fx.Node, str] = {}
        for n in self.nodes:
            if n.op == "call_module":
                io = (self._shape(n.args[0]) if n.args else None, self._shape(n))
                self.steps[n] = make_step(
                    str(n.target), self.gm.get_submodule(str(n.target)), io if None not in io else None
                )
        self.value: dict[fx.Node, Moments | None] = {}
        self.grad: dict[fx.Node, GradMoments | None] = {}
        self.input_grad: GradMoments | None = None

    # -- shapes -------------------------------------------------------------------------------------

    def _shape_pass(self, module, input_shape, placeholders) -> dict:
        if input_shape is None:
            return {}
        param = next(module.parameters(), None)
        dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
        device = param.device if param is not None else torch.device("cpu")
        modes = {m: m.training for m in module.modules()}
        sp = _ShapePass(self.gm, input_shape[0])
        try:
            module.eval()
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                x = torch.zeros((1, *input_shape[1:]), dtype=dtype, device=device)
                sp.run(x, *[p.args[0] for p in placeholders if p is not self.input])
        except Exception:  # shapes seen so far; rules that need the others say so
            pass
        finally:
            for m, t in modes.items():
                m.training = t
        return sp.info

    def _shape(self, n) -> tuple[int, ...] | None:
        kind, v = self.info.get(n, ("other", None)) if isinstance(n, fx.Node) else ("other", None)
        return v if kind == "tensor" else None

    def _call(self, n: fx.Node) -> tuple[Call, list[fx.Node]]:
        """The node as a :class:`functions.Call`, and its tensor inputs in TensorIn order."""
        tensors: list[fx.Node] = []

        def sub(a):
            if isinstance(a, fx.Node):
                kind, v = self.info.get(a, ("unknown", None))
                if kind == "tensor" or (kind == "unknown" and a.op in ("call_module", "placeholder")):
                    tensors.append(a)
                    return TensorIn(len(tensors) - 1, self._shape(a))
                return v if kind == "value" else a
            if isinstance(a, (list, tuple)):
                return type(a)(sub(v) for v in a)
            if isinstance(a, dict):
                return {k: sub(v) for k, v in a.items()}
            return a

        args, kwargs = sub(tuple(n.args)), sub(dict(n.kwargs))
        shapes = tuple(self._shape(t) for t in tensors)
        return Call(n.target, args, kwargs, shapes, self._shape(n), self.border), tensors

    # -- the walk -----------------------------------------------------------------------------------

    def forward(self, x: Moments | None) -> Moments | None:
        self.value, self.reason, self._ops = {}, {}, {}
        out = None
        for n in self.nodes:
            if n.op == "placeholder":
                self.value[n] = x if n is self.input else None
                if n is not self.input:
                    self.reason[n] = f"input {n.name} not followed"
            elif n.op == "get_attr":
                t = _attr(self.gm, str(n.target))
                self.value[n] = None if t is None else _moments_of(t)
            elif n.op == "call_module":
                src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
                xin = self.value.get(src) if src is not None else None
                self.value[n] = _finite(self.steps[n].forward(xin))
                if self.value[n] is None:
                    self.reason[n] = self.reason.get(src) or f"no prediction for {n.target}"
            elif n.op in ("call_function", "call_method"):
                if n in self.info and self.info[n][0] != "tensor":
                    continue  # x.size(0), a tuple: not a tensor node (a node the shape pass never reached
                    # is tried: its rule says what it lacks)
                self.value[n] = self._apply(n)
            elif n.op == "output":
                src = n.args[0]
                if isinstance(src, (tuple, list)):  # several outputs: the walk follows the first
                    src = src[0] if src else None
                out = self.value.get(src) if isinstance(src, fx.Node) else None
                self._out = src
        return out

    def _apply(self, n: fx.Node) -> Moments | None:
        rule = function_rule_for(n.target)
        call, tensors = self._call(n)
        if rule is None:
            self.reason[n] = f"no rule for {n.op} {_name(n.target)} ({n.name})"
            return None
        try:
            op = as_op(rule(call))
            self._ops[n] = (op, tensors)
            y = _finite(op.forward([self.value.get(t) for t in tensors]))
        except NoRule as e:
            missing = next((t for t in tensors if self.value.get(t) is None), None)
            self.reason[n] = self.reason.get(missing) if missing is not None else None
            self.reason[n] = self.reason[n] or f"{_name(n.target)} ({n.name}): {e}"
            return None
        return y

    def backward(self, g: GradMoments | None) -> GradMoments | None:
        parts: dict[fx.Node, list[GradMoments | None]] = {}
        if getattr(self, "_out", None) is not None:
            parts[self._out] = [g]
        self.grad = {}
        for n in reversed(self.nodes):
            if n.op in ("output", "get_attr") or n not in self.value:
                continue
            total = _combine(parts.get(n, []))
            self.grad[n] = total
            if n.op == "placeholder":
                if n is self.input:
                    self.input_grad = total
                continue
            if n.op == "call_module":
                src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
                gi = self.steps[n].backward(total)
                if src is not None:
                    parts.setdefault(src, []).append(gi)
                continue
            op, tensors = self._ops.get(n, (None, []))
            if op is None:  # no rule: every input's gradient is unknown
                _, tensors = self._call(n)
                gis = [None] * len(tensors)
            elif total is None:
                gis = [None] * len(tensors)
            else:
                try:
                    gis = list(op.backward(total, [self.value.get(t) for t in tensors]))
                except NoRule:
                    gis = [None] * len(tensors)
            for t, gi in zip(tensors, gis):
                if t.op != "get_attr":
                    parts.setdefault(t, []).append(gi)
        return self.input_grad


def _attr(gm: fx.GraphModule, target: str) -> torch.Tensor | None:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.Tensor) else None


def _moments_of(t: torch.Tensor) -> Moments:
    t = t.detach().double()
    mean = float(t.mean()) if t.numel() else 0.0
    return Moments(mean, float(t.var(unbiased=False)) if t.numel() > 1 else 0.0)


def _finite(y: Moments | None) -> Moments | None:
    return y if y is not None and math.isfinite(y.mean) and math.isfinite(y.var) else None


def _name(target) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", repr(target))
