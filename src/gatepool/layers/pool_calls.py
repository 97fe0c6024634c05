"""Pools called as functions in a module's ``forward``, found and rewritten by ``torch.fx``.

``convert`` sees modules; many models pool in their own code: ``F.adaptive_avg_pool2d(out, (1, 1))`` in
DenseNet's forward, ``F.max_pool2d`` in Inception's blocks, ``x.mean([2, 3])`` as MNASNet's head,
``x.mean((2, 3), keepdim=True)`` as the squeeze of timm's squeeze-and-excitation blocks. Here each
module's own ``forward`` is traced with every child a leaf (so the graph is that forward's code only),
its pool calls are found, and the module is given a forward in which each call is a call of a new child
module that computes the same thing (torch's own ``nn.MaxPool2d``, ``nn.AdaptiveAvgPool2d``,
:class:`SpatialMean`); ``convert`` then replaces those children as it replaces any pool.

    F.max_pool{d}d / torch.max_pool{d}d   -> nn.MaxPool{d}d        F.avg_pool{d}d -> nn.AvgPool{d}d
    F.adaptive_avg_pool{d}d               -> nn.AdaptiveAvgPool{d}d
    x.mean((2, 3)) / torch.mean(x, [2, 3], keepdim)  (and (2, 3, 4))  -> SpatialMean (a global pool)

The module keeps its class (a subclass of it, named as it, takes its place), its attributes and every
state_dict key; the new children add theirs. fx fixes at trace time what Python decides: the branches on
``self.training``, on the module's own plain attributes (``self.grad_checkpointing``, a pool type) and on
the non-tensor arguments of ``forward`` (``pre_logits=False``). So the rewritten forward is traced once
per value of these, when first met, and each trace maps the pool calls to the same children, in order.
A forward fx cannot trace, or a call whose arguments are computed in ``forward``, is left as it is: the
caller gets its name and the reason, for a warning (never a silent partial conversion).

:func:`pool_role` tells a head's global pool from a squeeze by data flow: a squeeze's output is combined
(multiplied, added) with a tensor that does not come from a pool, i.e. it rescales the map it came from;
a head's flows only on to the output. A rewritten module pickles (``torch.save(model)``, ``deepcopy``) as its
own class rebuilt into the rewrite; the traces are made again at its first call after loading.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Call", "SpatialMean", "find_calls", "guard", "min_size_guard", "pool_role", "rewrite",
           "trace_own", "undo", "unguard"]


class SpatialMean(nn.Module):
    """``x.mean(dims, keepdim)`` over the ``dim`` spatial dims: a global average pool as a module.

    ``dims`` as the call wrote them: ``(2, …, d + 1)``, or the last ``d`` dims counted from the end
    (``x.mean((-1, -2))``, pvt_v2's head), which are the spatial dims of a ``(N, C, *spatial)`` map."""

    def __init__(self, dim: int, keepdim: bool = False, from_end: bool = False) -> None:
        super().__init__()
        self.dim, self.keepdim, self.from_end = dim, bool(keepdim), bool(from_end)

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(range(-self.dim, 0)) if self.from_end else tuple(range(2, 2 + self.dim))

    def extra_repr(self) -> str:
        return f"dim={self.dims}, keepdim={self.keepdim}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(self.dims, keepdim=self.keepdim)


_MAX_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_AVG_ARGS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
_FUNCTIONS = {}  # target -> (name for messages, kind, dim, argument names after the input)
for _d in (1, 2, 3):
    for _t in {getattr(F, f"max_pool{_d}d"), getattr(torch, f"max_pool{_d}d")}:
        _FUNCTIONS[_t] = (f"F.max_pool{_d}d", "max", _d, _MAX_ARGS)
    _FUNCTIONS[getattr(F, f"avg_pool{_d}d")] = (
        f"F.avg_pool{_d}d",
        "avg",
        _d,
        _AVG_ARGS[: 6 if _d > 1 else 5],
    )
    _FUNCTIONS[getattr(F, f"adaptive_avg_pool{_d}d")] = (
        f"F.adaptive_avg_pool{_d}d",
        "adaptive",
        _d,
        ("output_size",),
    )
_MAX = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
_AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
_ADAPTIVE = {1: nn.AdaptiveAvgPool1d, 2: nn.AdaptiveAvgPool2d, 3: nn.AdaptiveAvgPool3d}
_MEAN_DIMS = {(2, 3): 2, (2, 3, 4): 3, (-2, -1): 2, (-3, -2, -1): 3}  # spatial dims: NCHW / NCDHW


@dataclass
class Call:
    """One pool call in a module's forward: what it is, and the module that computes the same."""

    owner: str  # the calling module's qualified name ("" for the model)
    text: str  # "F.max_pool2d(kernel_size=3, stride=2)", for messages and Replaced
    signature: tuple  # (kind, dim, arguments): equal calls map to children in order
    module: nn.Module | None  # torch's module for it; None where it cannot be one (the reason in ``why``)
    why: str = ""
    node: fx.Node | None = field(default=None, repr=False)


class _OwnCode(fx.Tracer):
    """Traces one module's own forward: every child module is a leaf."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return True


def _user_class(m: nn.Module) -> bool:
    """A module whose forward is not torch's own (nor one of the library's layers)."""
    fwd = getattr(type(m), "forward", None)
    where = getattr(fwd, "__module__", "") or ""
    return not (where.startswith("torch.") or where.startswith("gatepool.layers"))


def _params(cls) -> tuple[list[str], dict[str, object]]:
    """forward's parameter names after self, and the defaults of those that have one."""
    sig = inspect.signature(cls.forward)
    names, defaults = [], {}
    for p in list(sig.parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError("forward takes *args / **kwargs")
        names.append(p.name)
        if p.default is not p.empty:
            defaults[p.name] = p.default
    return names, defaults


def _concrete(value) -> bool:
    scalars = (bool, int, float, str, type(None))
    return isinstance(value, scalars) or (
        isinstance(value, tuple) and all(isinstance(v, scalars) for v in value)
    )


def trace_own(m: nn.Module, cls=None, concrete: dict | None = None) -> fx.Graph:
    """The graph of ``m``'s own forward (of class ``cls``, default its original class), children leaves."""
    cls = cls or _rewritten_from(m) or type(m)
    if concrete is None:
        _, defaults = _params(cls)
        concrete = {k: v for k, v in defaults.items() if _concrete(v)}
    current = m.__class__
    modes = []  # a TorchFunctionMode around the call (a profiler, a probe) would change the traced targets
    while torch._C._len_torch_function_stack() > 0:
        modes.append(torch._C._pop_torch_function_stack())
    try:
        m.__class__ = cls  # the tracer runs type(root).forward
        return _OwnCode().trace(m, concrete_args=concrete or None)
    finally:
        m.__class__ = current
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)


def _const(value) -> bool:
    if isinstance(value, fx.Node):
        return False
    if isinstance(value, (tuple, list)):
        return all(_const(v) for v in value)
    return value is None or isinstance(value, (bool, int, float))


def _describe(node: fx.Node, owner: str) -> Call | None:
    """The pool call at ``node``, or None if it is none."""
    if node.op == "call_function" and node.target in _FUNCTIONS:
        name, kind, d, names = _FUNCTIONS[node.target]
        args = dict(zip(names, node.args[1:]))
        args.update({k: v for k, v in node.kwargs.items() if k in names})
        extra = set(node.kwargs) - set(names)
        text = f"{name}({', '.join(f'{k}={v}' for k, v in args.items())})"
        if extra or not _const(list(args.values())):
            return Call(owner, text, (), None, "its arguments are computed in forward", node)
        if "stride" in args and args["stride"] in ([], ()):
            args["stride"] = None  # torch.max_pool2d's default stride: the kernel
        signature = (kind, d, tuple(sorted((k, _hashable(v)) for k, v in args.items())))
        if kind == "max":
            return Call(owner, text, signature, _MAX[d](**args), node=node)
        if kind == "avg":
            return Call(owner, text, signature, _AVG[d](**args), node=node)
        return Call(owner, text, signature, _ADAPTIVE[d](**args), node=node)
    is_mean = (node.op == "call_method" and node.target == "mean") or (
        node.op == "call_function" and node.target is torch.mean
    )
    if not is_mean or len(node.args) < 1:
        return None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if not isinstance(dims, (tuple, list)) or tuple(sorted(dims)) not in _MEAN_DIMS or "dtype" in node.kwargs:
        return None
    d = _MEAN_DIMS[tuple(sorted(dims))]
    text = f"mean(dim={tuple(dims)}, keepdim={keepdim})"
    if not isinstance(keepdim, bool):
        return Call(owner, text, (), None, "its keepdim is computed in forward", node)
    from_end = min(dims) < 0
    return Call(owner, text, ("mean", d, keepdim, from_end), SpatialMean(d, keepdim, from_end), node=node)


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


_POOL_WORDS = ("max_pool", "avg_pool", "adaptive_avg_pool", ".mean(")


def find_calls(model: nn.Module, skip: set[int]) -> tuple[list[Call], list[tuple[str, str]]]:
    """The pool calls in the forwards of ``model``'s modules, and ``(name, reason)`` for each module whose
    forward looks as if it pools but cannot be traced. Modules in ``skip`` (ids) are not looked into."""
    calls, failed, seen = [], [], set()
    for name, m in model.named_modules():
        if id(m) in skip or id(m) in seen or not _user_class(m):
            continue
        seen.add(id(m))
        try:
            graph = trace_own(m)
        except Exception as e:  # noqa: BLE001 - fx raises many kinds; the reason goes to the warning
            if _looks_like_it_pools(m):
                failed.append((name, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"))
            continue
        for node in graph.nodes:
            call = _describe(node, name)
            if call is not None:
                calls.append(call)
    return calls, failed


def _looks_like_it_pools(m: nn.Module) -> bool:
    try:
        source = inspect.getsource(type(m))
    except (OSError, TypeError):
        return False
    return any(w in source for w in _POOL_WORDS)


# --------------------------------------------------------------------------------------------------
# The rewritten forward


@dataclass
class _Rewrite:
    """What a rewritten module keeps: its own class, its pool calls' children, one forward per state."""

    cls: type
    children: list[tuple[tuple, str]]  # (signature, child name), in the order of the calls
    names: list[str]  # forward's parameters
    defaults: dict
    state: tuple[str, ...]  # the plain attributes fx fixes at trace time (training among them)
    forwards: dict = field(default_factory=dict)  # state key -> generated forward(self, *args)


_SUBCLASSES: dict[tuple[type, str], type] = {}


def _rewritten_from(m: nn.Module):
    rw = m.__dict__.get("_gatepool_rewrite")
    return rw.cls if rw is not None else None


def _forward(self, *args, **kwargs):
    """The rewritten forward: the graph traced for this state of the module and these arguments."""
    rw = self.__dict__["_gatepool_rewrite"]
    bound = list(args) + [kwargs[n] if n in kwargs else rw.defaults.get(n) for n in rw.names[len(args) :]]
    key = (
        tuple(getattr(self, a, None) for a in rw.state),
        tuple(v if _concrete(v) else "tensor" for v in bound[1:]),
    )
    fn = rw.forwards.get(key)
    if fn is None:
        fn = rw.forwards[key] = _generate(self, rw, {n: v for n, v in zip(rw.names, bound) if _concrete(v)})
    return fn(self, *bound)


def _generate(m: nn.Module, rw: _Rewrite, concrete: dict):
    """Trace ``rw.cls``'s forward with ``concrete`` fixed; each pool call becomes a call of its child."""
    graph = trace_own(m, rw.cls, concrete)
    free = list(rw.children)
    for node in list(graph.nodes):
        call = _describe(node, "")
        if call is None or call.module is None:
            continue
        match = next((i for i, (sig, _) in enumerate(free) if sig == call.signature), None)
        if match is None:
            continue  # a call convert did not rewrite (a branch first met now): torch's, as it was
        name = free.pop(match)[1]
        with graph.inserting_before(node):
            new = graph.call_module(name, (node.args[0],))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    graph.lint()
    targets = {n.target for n in graph.nodes if n.op in ("call_module", "get_attr")}
    stand_ins = {t: (nn.Module() if isinstance(_get(m, t), nn.Module) else torch.empty(0)) for t in targets}
    return type(fx.GraphModule(stand_ins, graph)).forward  # runs with self = m


def _get(m: nn.Module, target: str):
    for part in target.split("."):
        m = getattr(m, part)
    return m


def rewrite(m: nn.Module, calls: list[tuple[Call, str]]) -> None:
    """Give ``m`` a forward that calls child ``name`` for each ``(call, name)``; the children must be set."""
    cls = _rewritten_from(m) or type(m)
    names, defaults = _params(cls)
    state = tuple(sorted(k for k, v in vars(m).items() if not k.startswith("_") and _concrete(v)))
    old = m.__dict__.get("_gatepool_rewrite")
    children = (list(old.children) if old is not None else []) + [(c.signature, n) for c, n in calls]
    m.__dict__["_gatepool_rewrite"] = _Rewrite(cls, children, names, defaults, state)
    m.__class__ = _subclass(cls, "calls")


def _subclass(cls: type, kind: str) -> type:
    """The class a rewritten ``cls`` module takes: ``cls`` with the forward of ``kind`` ("calls": the
    traced forward with its pool calls rewritten; "guard": :func:`guard`'s). It pickles (``torch.save``
    of the whole model, ``copy.deepcopy``) as ``cls`` rebuilt into it, without the traced forwards."""
    if (cls, kind) not in _SUBCLASSES:
        _SUBCLASSES[cls, kind] = type(cls.__name__, (cls,), {
            "forward": _forward if kind == "calls" else _guard_forward, "__reduce_ex__": _reduce_ex,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        })  # fmt: skip
    return _SUBCLASSES[cls, kind]


def _reduce_ex(self, protocol):
    state = dict(self.__dict__)
    rw = state.get("_gatepool_rewrite")
    if rw is not None:  # fx's generated forwards do not pickle: traced again at the first call
        state["_gatepool_rewrite"] = dataclasses.replace(rw, forwards={})
        return _rebuild, (rw.cls, "calls"), state
    return _rebuild, (state["_gatepool_guard"][0], "guard"), state


def _rebuild(cls: type, kind: str) -> nn.Module:
    sub = _subclass(cls, kind)
    return sub.__new__(sub)  # then nn.Module.__setstate__(state)


# --------------------------------------------------------------------------------------------------
# A pool behind a branch on the input's size: timm's ConvMlp


def min_size_guard(m: nn.Module) -> int | None:
    """k for timm's ``ConvMlp`` (VGG's head), whose forward pools a map smaller than k×k up to
    ``max(k, H) × max(k, W)`` (``F.adaptive_avg_pool2d``, behind a branch on the input's size that fx
    cannot trace); None for any other module, and for one already guarded."""
    k = getattr(m, "input_kernel_size", None)
    named = type(m).__name__ == "ConvMlp" and type(m).__module__.startswith("timm.")
    if named and isinstance(k, int) and k >= 1 and "_gatepool_guard" not in m.__dict__:
        return k
    return None


def guard(m: nn.Module, name: str) -> None:
    """Give ``m`` a forward that runs its child ``name`` first, then its own forward: the child brings the
    map up to the size its own branch would pool to (``AtLeastPool``), so that branch is never taken."""
    cls = type(m)
    m.__dict__["_gatepool_guard"] = (cls, name)
    m.__class__ = _subclass(cls, "guard")


def unguard(m: nn.Module) -> None:
    m.__class__ = m.__dict__.pop("_gatepool_guard")[0]


def _guard_forward(self, x):
    cls, name = self.__dict__["_gatepool_guard"]
    return cls.forward(self, getattr(self, name)(x))


def undo(m: nn.Module, previous) -> None:
    """Put back the forward ``m`` had (``previous``: its ``_gatepool_rewrite`` before, or None)."""
    if previous is None:
        m.__class__ = _rewritten_from(m) or type(m)
        m.__dict__.pop("_gatepool_rewrite", None)
    else:
        m.__dict__["_gatepool_rewrite"] = previous


# --------------------------------------------------------------------------------------------------
# Head or squeeze: where a global pool's output goes

_COMBINE_FUNCTIONS = {
    operator.mul,
    operator.imul,
    operator.add,
    operator.iadd,
    operator.sub,
    operator.truediv,
    operator.matmul,
    torch.mul,
    torch.add,
    torch.sub,
    torch.div,
    torch.addcmul,
    torch.matmul,
}
_COMBINE_METHODS = {
    "mul",
    "mul_",
    "add",
    "add_",
    "sub",
    "sub_",
    "div",
    "div_",
    "addcmul",
    "matmul",
    "expand_as",
}


def pool_role(model: nn.Module, owner: str, is_pool, traces: dict) -> str:
    """ "head", "squeeze" or "unknown": where the output of the pool node(s) ``is_pool(node)`` in ``owner``'s
    forward goes. A squeeze meets a tensor that is no pool's output in a product or sum; a head reaches
    the model's output untouched by one. ``traces``: a cache {name: graph or None}, filled here."""
    name = owner
    while True:
        graph = _trace_cached(model, name, traces)
        if graph is None:
            return "unknown"
        start = [n for n in graph.nodes if is_pool(n)]
        if not start:
            return "unknown"
        tainted = set(start)
        reaches_output = False
        for node in graph.nodes:  # topological order
            inputs = node.all_input_nodes
            if node in tainted or not any(i in tainted for i in inputs):
                continue
            if node.op == "output":
                reaches_output = True
                continue
            combine = (node.op == "call_function" and node.target in _COMBINE_FUNCTIONS) or (
                node.op == "call_method" and node.target in _COMBINE_METHODS
            )
            if combine and any(
                i not in tainted and i.op != "get_attr" and not _from_a_pool(i, graph) for i in inputs
            ):
                return "squeeze"
            tainted.add(node)
        if not reaches_output:
            return "head"  # used in this forward, never combined with the map (a pool that ends a branch)
        if name == "":
            return "head"
        parent, _, child = name.rpartition(".")
        is_pool = (lambda c: lambda n: n.op == "call_module" and n.target == c)(child)
        name = parent


def _from_a_pool(node: fx.Node, graph: fx.Graph) -> bool:
    """Whether ``node`` is (computed only from) a pool's output: avg and max halves of one head."""
    if node.op == "call_module" and ("pool" in str(node.target).lower() or "mean" in str(node.target)):
        return True
    call = _describe(node, "")
    if call is not None or (node.op in ("call_function", "call_method") and "pool" in str(node.target)):
        return True
    return node.op == "call_method" and node.target in ("amax", "max") and len(node.args) > 1


def _trace_cached(model: nn.Module, name: str, traces: dict):
    if name not in traces:
        m = model.get_submodule(name) if name else model
        try:
            traces[name] = trace_own(m)
        except Exception:  # noqa: BLE001
            traces[name] = None
    return traces[name]
