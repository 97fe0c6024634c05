"""One walk through a ``torch.fx`` graph for both predictors, and the ideal's rules on it.

    forward   node by node in graph order: each node's value from its inputs' (``visit``); a node
              without one keeps why: its first input without one's reason, else its own
    backward  node by node in reverse, from the output's gradient: each node's gradient the sum of those
              its users sent it (``add``; unknown if one of them is), then its inputs' (``pull``)

:class:`Walk` is that loop, on any state: the ideal's (:class:`GraphWalk`, ``Moments`` and
``GradMoments``: E[x], Var and E[g²] of every tensor node, ``x`` used twice getting E[g₁²] + E[g₂²], the
two independent) and the correlated prediction's (``correlated_predict``, a ``correlated.Field`` a node).
:func:`trace` gives both their graph.

In :class:`GraphWalk` a module with a rule (:func:`rules.rule_for`, ``nn.Sequential`` aside) is one
``call_module`` node whose step the caller builds (``predict`` builds it as it builds any module); every
other module is traced through, and its output node stands for it. ``call_function`` / ``call_method``
nodes follow :mod:`functions`; ``get_attr`` tensors (a parameter used in the forward) enter with their own
mean and Var. A node without a rule has no prediction, and neither has anything computed from it;
``reason`` says which node it was. A module that cannot be traced (data-dependent control flow, several
inputs) raises :class:`Untraceable` with torch's reason: the caller falls back to module-by-module rules.
A forward with Python control flow on a size (an ``if`` on ``x.shape``, ``range(C)``, ``len(x)``) is
traced again at the input's size (``trace(..., sample=(C, H, W))``, :class:`_ConcreteTracer`): the graph
then holds for that size, the one the probe runs at.

    ASSUMPTIONS: every tensor node's elements are independent and (for the nonlinear rules) normal with
    the propagated mean and Var; the inputs of an add are independent (residual add: Var = Var_a + Var_b).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx._symbolic_trace import _maybe_revert_all_patches

from gatepool.analysis.probe.functions import Call, TensorIn, as_op, function_rule_for
from gatepool.analysis.probe.rules import GradMoments, Moments, NoRule, rule_for

__all__ = ["GraphWalk", "NoPrediction", "Step", "Untraceable", "Walk", "trace"]


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


class _Sized(fx.Proxy):
    """A proxy whose ``len`` / ``int`` / ``__index__`` its tracer answers (the ``if`` and ``for`` go
    through :meth:`fx.Tracer.to_bool` and :meth:`fx.Tracer.iter` already); an attribute that is a device,
    a dtype or a string is its value, a constant of the run (``torch.autocast(x.device.type)``)."""

    def __len__(self) -> int:
        return len(self.tracer.concrete(self, sized=True))

    def __index__(self) -> int:
        return operator.index(self.tracer.concrete(self))

    def __int__(self) -> int:
        return int(self.tracer.concrete(self))

    def __getattr__(self, k: str) -> Any:
        v = getattr(self.tracer.values.get(self.node, _UNKNOWN), k, None)
        return v if isinstance(v, (str, torch.device, torch.dtype)) else _SizedAttribute(self, k)


class _SizedAttribute(fx.proxy.Attribute, _Sized):
    """``x.shape``, ``x.device``: an attribute proxy that answers as :class:`_Sized` does."""


_UNKNOWN = object()  # a node whose value the example could not give


class _ConcreteTracer(_Tracer):
    """:class:`_Tracer` with every node's value on an example input beside its proxy, so that Python
    control flow on a size (``if x.shape[-1] > k``, ``range(x.shape[1])``, ``len(x)``) takes the
    example's value: the graph is the forward specialised to the example's size, the one size the probe
    runs at. A tensor's values are data: control flow on them (``if x.sum() > 0``) still fails, as does
    control flow on a value the example could not give (its computation raised).

    The example is zeros of the input's size at batch 1: the batch every reader of the graph assumes (the
    shape pass runs at batch 1 and puts the batch back; the correlated walk takes a map's size at batch
    1), so a batch the forward turns into a number (``len(x)``, ``int(B)``) is baked in as the 1 they
    expect. The model keeps its mode (an ``if self.training`` is traced as the probe runs it), but for a
    leaf module that batch 1 cannot run in train mode (a BatchNorm over one value per channel, a 1 × 1
    map): its value is its eval-mode output, the same shape (a leaf is not traced through: its mode bakes
    nothing in). A value the example cannot give otherwise is unknown, and only control flow on it fails.
    :func:`trace` runs it without gradients, on a forked RNG, and puts the buffers back (a BatchNorm run in
    train mode moves its running statistics).
    """

    proxy_buffer_attributes = True  # a buffer a proxy too: its sizes answer, ``buf.expand(B, ...)`` traces

    def __init__(self, leaf: Callable[[nn.Module], bool], example: torch.Tensor) -> None:
        super().__init__(leaf)
        self.example = example
        self.values: dict[fx.Node, Any] = {}

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _Sized(node, self)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> fx.Node:
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if kind != "output":
            try:
                with _maybe_revert_all_patches():  # torch's own module call and getattr, not the tracer's
                    self.values[node] = self._value(node)
            except Exception:  # noqa: BLE001 - the op refuses the example: only control flow on it fails
                self.values[node] = _UNKNOWN
        return node

    def _value(self, n: fx.Node) -> Any:
        if n.op == "placeholder":  # the first is the input; another its default
            return self.example if not self.values else (n.args[0] if n.args else _UNKNOWN)
        if n.op == "get_attr":
            return functools.reduce(getattr, str(n.target).split("."), self.root)
        if any(self.values.get(a, _UNKNOWN) is _UNKNOWN for a in n.all_input_nodes):
            return _UNKNOWN
        args, kwargs = fx.node.map_arg((n.args, n.kwargs), self.values.__getitem__)
        if n.op == "call_function":
            return n.target(*args, **kwargs)
        if n.op == "call_method":
            return getattr(args[0], str(n.target))(*args[1:], **kwargs)
        m = self.root.get_submodule(str(n.target))  # a leaf module: run it
        try:
            return m(*args, **kwargs)
        except ValueError:  # a BatchNorm in train mode over one value per channel: its eval-mode output
            modes = {s: s.training for s in m.modules()}
            try:
                return m.eval()(*args, **kwargs)
            finally:
                for s, t in modes.items():
                    s.training = t

    def concrete(self, p: fx.Proxy, sized: bool = False) -> Any:
        """``p``'s value on the example: a size, a flag (a tensor's values only for its length)."""
        v = self.values.get(p.node, _UNKNOWN)
        if v is _UNKNOWN or (isinstance(v, torch.Tensor) and not sized):
            what = "a value the example could not give" if v is _UNKNOWN else "a tensor's values"
            raise fx.proxy.TraceError(f"control flow on {what} ({p.node.name})")
        return v

    def to_bool(self, obj: fx.Proxy) -> bool:
        return bool(self.concrete(obj))

    def iter(self, obj: fx.Proxy):
        return (obj[i] for i in range(len(self.concrete(obj, sized=True))))


def trace(
    module: nn.Module,
    leaf: Callable[[nn.Module], bool] = _is_rule_leaf,
    sample: tuple[int, ...] | None = None,
) -> tuple[fx.GraphModule, list[tuple[str, fx.Node]]]:
    """(graph module, [(module name, output node)]) of ``module``; :class:`Untraceable` if torch fails.

    ``leaf(m)``: whether a module is kept whole, one node (default: it has a rule of :mod:`rules`; the
    correlated walk passes its own rules' test), every other module traced through. ``sample``: one input's
    shape without its batch (C, H, W); where plain tracing fails (control flow on a size), the module is
    traced again with :class:`_ConcreteTracer` on an example of that shape: its graph holds for that size.
    """
    tracer = _Tracer(leaf)
    try:
        graph = tracer.trace(module)
    except Exception as e:  # TraceError, control flow on a Proxy, anything the forward raises
        if sample is None:
            raise Untraceable(_why(e)) from None
        tracer = _ConcreteTracer(leaf, _zeros(module, (1, *sample)))
        graph = _trace_quietly(tracer, module)
    return fx.GraphModule(module, graph), tracer.calls


def _trace_quietly(tracer: _ConcreteTracer, module: nn.Module) -> fx.Graph:
    """``tracer.trace(module)`` without gradients, on a forked RNG, the buffers put back as they were."""
    buffers = [(m, k, b, b.clone()) for m in module.modules() for k, b in m._buffers.items() if b is not None]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            return tracer.trace(module)
    except Exception as e:  # as in trace: the reason is kept
        raise Untraceable(_why(e)) from None
    finally:
        with torch.no_grad():
            for m, k, b, saved in buffers:
                m._buffers[k] = b
                b.copy_(saved)


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _zeros(module: nn.Module, shape: tuple[int, ...]) -> torch.Tensor:
    """Zeros of ``shape`` in the module's dtype and on its device."""
    param = next(module.parameters(), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    return torch.zeros(shape, dtype=dtype, device=param.device if param is not None else torch.device("cpu"))


class NoPrediction(Exception):
    """A node without a value; the message says why."""


class Walk:
    """The graph of ``gm`` walked forward from ``input``'s value and backward from ``out``'s gradient.

    A subclass gives the state's operations: ``visit(n)`` node ``n``'s value from its inputs' (setting
    ``inputs[n]``, the nodes its gradient goes back to, and ``steps[n]``, what its ``pull`` needs), or
    :class:`NoPrediction` with why; a node it gives no ``inputs`` (a constant, a size) is not walked
    back. ``add(a, b)`` the gradient of a tensor used twice; ``pull(n, g, parts)`` one gradient for
    each of ``inputs[n]`` from ``n``'s ``g`` (the sum of its ``parts``); ``seeds(g)`` where the backward
    starts. After a walk ``value``, ``reason`` (why a value is None), ``grad`` hold the figures by node.
    """

    def __init__(self, gm: fx.GraphModule, input: fx.Node, out: fx.Node | None) -> None:
        self.gm, self.nodes, self.input, self.out = gm, list(gm.graph.nodes), input, out
        self.value: dict[fx.Node, Any] = {}
        self.reason: dict[fx.Node, str] = {}
        self.inputs: dict[fx.Node, list[fx.Node]] = {}
        self.steps: dict[fx.Node, Any] = {}
        self.grad: dict[fx.Node, Any] = {}

    def visit(self, n: fx.Node) -> Any:
        raise NotImplementedError

    def add(self, a, b):
        raise NotImplementedError

    def pull(self, n: fx.Node, g, parts: list) -> list:
        raise NotImplementedError

    def seeds(self, g) -> dict[fx.Node, Any]:
        """Where the backward starts: ``g`` at the output."""
        return {} if self.out is None else {self.out: g}

    def forward(self, x):
        """Every node's value, in graph order, from the input's ``x``; returns the output's."""
        self.value, self.reason, self.inputs, self.steps = {self.input: x}, {}, {self.input: []}, {}
        for n in self.nodes:
            if n is self.input or n.op == "output":
                continue
            try:
                self.value[n] = self.visit(n)
            except NoPrediction as e:  # the first node without a value says why, for all after it
                missing = next((a for a in self.inputs.get(n, ()) if self.value.get(a) is None), None)
                self.value[n], self.reason[n] = None, self.reason.get(missing) or str(e)
            self.visited(n)
        return self.value.get(self.out)

    def visited(self, n: fx.Node) -> None:
        """``n``'s value is set (or None): a subclass may let go of what its inputs' users alone read."""

    def backward(self, g):
        """Every node's gradient, in reverse, from the output's ``g``; returns the input's."""
        parts = {n: [s] for n, s in self.seeds(g).items()}  # what each node's users sent it
        self.grad = {}
        for n in reversed(self.nodes):
            if n not in parts or n not in self.inputs:
                continue
            ps = parts.pop(n)
            self.grad[n] = None if any(p is None for p in ps) else functools.reduce(self.add, ps)
            for a, ga in zip(self.inputs[n], self.pull(n, self.grad[n], ps)):
                parts.setdefault(a, []).append(ga)
            self.pulled(n)
        return self.grad.get(self.input)

    def pulled(self, n: fx.Node) -> None:
        """``n``'s gradient has gone to its inputs: its step is read no more (its users, which read it too,
        come after it in the graph and were pulled before it), and is let go."""
        self.steps.pop(n, None)


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


class GraphWalk(Walk):
    """The ideal's walk: one input's moments forward, E[g²] backward, through the traced ``module``.

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
        gm, self.calls = trace(module, sample=None if input_shape is None else tuple(input_shape[1:]))
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        required = [n for n in placeholders if not n.args]  # a placeholder with a default is optional
        if len(required) != 1:
            raise Untraceable(f"the forward takes {len(required)} tensor inputs; the walk follows one")
        out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
        if isinstance(out, (tuple, list)):  # several outputs: the walk follows the first
            out = out[0] if out else None
        super().__init__(gm, required[0], out if isinstance(out, fx.Node) else None)
        self.info = self._shape_pass(module, input_shape, placeholders)
        self.border = border
        self.module_steps: dict[fx.Node, Step] = {}
        for n in self.nodes:
            if n.op == "call_module":
                io = (self._shape(n.args[0]) if n.args else None, self._shape(n))
                self.module_steps[n] = make_step(
                    str(n.target), self.gm.get_submodule(str(n.target)), io if None not in io else None
                )

    # -- shapes -------------------------------------------------------------------------------------

    def _shape_pass(self, module, input_shape, placeholders) -> dict:
        if input_shape is None:
            return {}
        modes = {m: m.training for m in module.modules()}
        sp = _ShapePass(self.gm, input_shape[0])
        try:
            module.eval()
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                x = _zeros(module, (1, *input_shape[1:]))
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

    # -- the state's operations ---------------------------------------------------------------------

    def visit(self, n: fx.Node) -> Moments | None:
        if n.op == "placeholder":
            self.inputs[n] = []
            raise NoPrediction(f"input {n.name} not followed")
        if n.op == "get_attr":  # a parameter: its own moments (a constant, not walked back)
            t = _attr(self.gm, str(n.target))
            return None if t is None else _moments_of(t)
        if n.op == "call_module":
            src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
            self.inputs[n], self.steps[n] = [] if src is None else [src], self.module_steps[n]
            y = _finite(self.steps[n].forward(self.value.get(src)))  # a norm's output needs no input
            if y is None:
                raise NoPrediction(f"no prediction for {n.target}")
            return y
        if n in self.info and self.info[n][0] != "tensor":
            return None  # x.size(0), a tuple: not a tensor node (a node the shape pass never reached
            # is tried: its rule says what it lacks)
        call, self.inputs[n] = self._call(n)
        rule = function_rule_for(n.target)
        if rule is None:
            raise NoPrediction(f"no rule for {n.op} {_name(n.target)} ({n.name})")
        try:
            self.steps[n] = as_op(rule(call))
            return _finite(self.steps[n].forward([self.value.get(t) for t in self.inputs[n]]))
        except NoRule as e:
            raise NoPrediction(f"{_name(n.target)} ({n.name}): {e}") from None

    def add(self, a: GradMoments, b: GradMoments) -> GradMoments:
        """E[g²] of a sum of independent gradients; exact zero only where both are."""
        return GradMoments(a.e2 + b.e2, None if a.zero is None or b.zero is None else a.zero * b.zero)

    def pull(self, n: fx.Node, g: GradMoments | None, parts: list) -> list[GradMoments | None]:
        step, xs = self.steps.get(n), self.inputs[n]
        if n.op == "call_module":
            return [step.backward(g)]  # a module's step records its rows, g None too
        if step is None or g is None:
            return [None] * len(xs)
        try:
            return list(step.backward(g, [self.value.get(t) for t in xs]))
        except NoRule:
            return [None] * len(xs)

    def seeds(self, g: GradMoments | None) -> dict[fx.Node, GradMoments | None]:
        """``g`` at the output; a tensor no node reads (the graph's other outputs, a value computed and
        dropped) has an unknown gradient, and so has every tensor it is computed from."""
        read = {a for xs in self.inputs.values() for a in xs}
        return {**{n: None for n in self.inputs if n not in read}, **super().seeds(g)}


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
