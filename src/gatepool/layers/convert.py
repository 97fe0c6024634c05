"""``convert(model, gate)``: every pool of a model replaced by a gate at the same geometry, in place.

    model, replaced = convert(torchvision.models.resnet18(), "soft")            # the stem's max pool
    model, replaced = convert(net, "attention", example_input=torch.randn(2, 3, 64, 64))
    model, replaced = convert(net, "soft", global_pool="soft-learned", example_input=x)   # and the head
    model, replaced = convert(net, "soft", squeeze_pool="soft")   # the squeezes of SE blocks too
    model, _ = convert(model, "max", global_pool="avg")           # the way back: torch's own pools

What is replaced, and by what (``Replaced.role`` says which of these each was):

    "window"    nn.MaxPool{d}d / nn.AvgPool{d}d (``include``)         -> create_pool(gate, …) at its geometry
    "adaptive"  nn.AdaptiveAvgPool{d}d(size), size ≠ 1 (``include``)  -> AdaptiveGatedPool{d}d(size, gate)
    "head"      a global average pool whose output goes on to the     -> GlobalGatedPool{d}d(global_pool)
                model's output (the head of a ResNet, timm's
                ``SelectAdaptivePool2d``)
    "squeeze"   a global average pool whose output rescales the map   -> GlobalGatedPool{d}d(squeeze_pool)
                it came from (squeeze-and-excitation, ECA, …)

The geometry is copied exactly: kernel_size, stride, padding, dilation, ceil_mode; an average pool's
``count_include_pad`` (and ``divisor_override``) go over where the gate has them ("avg"; the soft family
gives padded taps gate 0, always). ``gate="max"`` / ``"avg"`` give torch's own modules, so they pool
exactly as torch does. A global pool is a head's or a squeeze by data flow (``torch.fx``, see
:func:`gatepool.layers.pool_calls.pool_role`); where the flow cannot be traced it counts as a head,
with a warning.

Pools called as functions in a ``forward`` (``F.max_pool2d``, ``F.avg_pool2d``, ``F.adaptive_avg_pool2d``,
``x.mean((2, 3))``) are found and rewritten by ``torch.fx`` into child modules of the calling module
(:mod:`gatepool.layers.pool_calls`), then replaced as above; ``Replaced.source`` is "function"
for them. A forward fx cannot trace is left as it is, with a warning naming the module and the reason.

Modules that ``convert`` built remember what they replaced: converting again treats them as that pool,
so ``convert`` is idempotent (a pool already at the asked gate is left as it is, weights included), and
``gate="max"`` / ``"avg"`` on a converted model give torch's own pools back (``global_pool="avg"`` puts
back a copy of the very module a global pool replaced, still marked as convert's: converting it again
to "avg" leaves it). On a timm model, ``reset_classifier()`` rebuilds the head's
pool: after ``convert`` it converts the new one too (its gate starts afresh, as the new classifier).

Modules match by exact type, and a few of timm's by name (neither torchvision nor timm is imported here):
``SelectAdaptivePool2d`` / ``FastAdaptiveAvgPool`` (the head); ``MaxPool2dSame`` / ``AvgPool2dSame``, which
pad "SAME" from the input's size in their forward, become :class:`~gatepool.layers.dynamic_pools.PoolSame`
(that padding, then the gate, padded taps by the gate's own padding rule; "max" / "avg" are timm's
exactly); VGG's ``ConvMlp``, whose forward pools a map smaller than its kernel up to it behind a branch fx
cannot trace, runs an :class:`~gatepool.layers.dynamic_pools.AtLeastPool` (the gate's adaptive windows up
to that size) first.
Another subclass of a torch pool has its forward rewritten as any module's. ``gatepool.convert`` is the
same function.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from gatepool.layers import gate_table
from gatepool.layers import pool_calls as fp
from gatepool.layers.adaptive_pool import (
    AdaptiveGatedPool1d,
    AdaptiveGatedPool2d,
    AdaptiveGatedPool3d,
)
from gatepool.layers.create_pool import create_pool
from gatepool.layers.dynamic_pools import AtLeastPool, PoolSame
from gatepool.layers.global_pool import (
    GlobalGatedPool1d,
    GlobalGatedPool2d,
    GlobalGatedPool3d,
)

__all__ = ["ADAPTIVE_POOLS", "POOLS", "Replaced", "convert"]

POOLS: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
)  # fmt: skip
ADAPTIVE_POOLS: tuple[type[nn.Module], ...] = (
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
)  # fmt: skip
_DIM = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3, nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3}
_ADAPTIVE_AVG = {nn.AdaptiveAvgPool1d: 1, nn.AdaptiveAvgPool2d: 2, nn.AdaptiveAvgPool3d: 3}
_GLOBAL = {1: GlobalGatedPool1d, 2: GlobalGatedPool2d, 3: GlobalGatedPool3d}
_ADAPTIVE = {1: AdaptiveGatedPool1d, 2: AdaptiveGatedPool2d, 3: AdaptiveGatedPool3d}
_GATE_KWARGS = {"temperature", "count_include_pad"}  # what a user may set on every new layer
_SELECT_AVG = ("avg", "fast", "fastavg")  # timm's SelectAdaptivePool2d pool types that average
_SAME = {"MaxPool2dSame": nn.MaxPool2d, "AvgPool2dSame": nn.AvgPool2d}  # timm's "SAME"-padded pools


@dataclass(frozen=True)
class Replaced:
    """One replaced pool: where it was, what it was, what stands there now, and how it was found."""

    name: str  # qualified name in the model ("layer1.0.downsample.0"; "" for the model itself)
    old_type: type  # the replaced module's class (for a call: the torch module that computes it)
    old: str  # its repr; for a call, the call ("F.max_pool2d(kernel_size=3, stride=2) in Inception3")
    new: nn.Module  # the module now at ``name``
    role: str = "window"  # "window", "adaptive", "head" (the head's global pool) or "squeeze"
    source: str = "module"  # "module", or "function": a call in a forward, rewritten by torch.fx

    def __repr__(self) -> str:
        how = "" if self.source == "module" else ", from a function call"
        return f"Replaced({self.name!r}: {self.old} -> {self.new!r}; {self.role}{how})"


@dataclass(frozen=True)
class _Origin:
    """Kept on every module convert builds: the pool it replaced (its own module, parameter-free)."""

    module: nn.Module
    role: str
    source: str
    text: str  # the Replaced.old of the first conversion


@dataclass
class _Site:
    """A module to replace, at every name it is registered under, and how to build its successor."""

    module: nn.Module
    names: list[str]
    dim: int
    build: Callable[[int | None], nn.Module]  # channels (None when the gate needs none) -> new module
    needs_channels: bool
    origin: _Origin


def convert(
    model: nn.Module,
    gate: str,
    *,
    include: Iterable[type[nn.Module]] = POOLS + ADAPTIVE_POOLS,
    global_pool: str | None = None,
    squeeze_pool: str | None = None,
    example_input: torch.Tensor | tuple | dict | None = None,
    **gate_kwargs,
) -> tuple[nn.Module, list[Replaced]]:
    """Replace the pools of ``model`` by the gate ``gate``, in place; returns ``(model, replaced)``.

    Args:
        model: any ``nn.Module``; changed in place (the same object is returned, unless ``model`` is
            itself a pool, which cannot replace itself: then the new pool is returned).
        gate: the windowed and adaptive pools' gate, one of ``gatepool.layers.list_pools()``.
        include: the pool classes to replace, any of ``POOLS`` (torch's max and average pools, 1-D to
            3-D) and ``ADAPTIVE_POOLS`` (adaptive average pools to a size other than 1); ``()`` replaces
            none (e.g. with ``global_pool`` only). A pool called as a function counts as its module.
        global_pool: None (leave them) or the gate for the head's global average pools, one of
            ``"max", "avg", "soft", "soft-learned", "attention"``.
        squeeze_pool: None (leave them) or the gate for the global average pools that squeeze a map
            to rescale it (squeeze-and-excitation and kin); the same gates.
        example_input: a batch the model accepts (a tensor; a tuple of arguments; a dict of keyword
            arguments): needed only by the gates with weights ("soft-learned", "attention", "conv"),
            which are built for the width C of their input.
        gate_kwargs: for every new layer: ``temperature`` (τ of the soft family, the start τ of
            "soft-learned"; the global pools' too), ``count_include_pad`` (gate "avg" only; without it,
            an average pool's own is copied and a max pool's successor takes torch's default, True).

    Returns ``replaced``: one :class:`Replaced` per name replaced, in the order
    ``model.named_modules()`` first meets each (a rewritten call as the new child of its module). A
    module registered under two names is replaced by one new module at both (they stay shared, weights
    included).
    Every argument and every new layer is checked before the model is touched: an error leaves it as it
    was. Nothing matched: a warning, and ``(model, [])``; everything already at the asked gates:
    ``(model, [])``.

    Channels. The gates with weights learn one τ, or a score and a value projection, per channel, so
    each needs its input's C. ``convert`` reads it from one dry forward of ``example_input``, with a
    forward pre-hook on each pool that records its input's shape (in eval mode and under no_grad, so
    batch-norm statistics and dropout do not move; the modes are restored). The other way, parameters
    that take their shape at the first call (``nn.LazyModuleMixin``), was not chosen: until a forward
    the model holds uninitialized parameters, which an optimizer built before it, a ``state_dict`` load
    into a fresh converted copy, ``deepcopy`` and parameter counts all trip over; after ``convert`` the
    model here is complete. A pool the dry forward does not reach, or reaches at two widths, is an error.
    The new parameters take the device of the pool's input and the dtype of the model's parameters.
    """
    include = _check_arguments(model, gate, include, global_pool, squeeze_pool, gate_kwargs)
    gates = {"window": gate, "adaptive": gate, "head": global_pool, "squeeze": squeeze_pool}

    traces: dict = {}
    undo = _rewrite_calls(model, include, gates, traces)  # the calls become torch's modules first
    try:
        sites, notes = _find(model, include, gates, gate_kwargs, traces)
        for message in notes:
            warnings.warn(message, stacklevel=2)
        if not sites:
            _undo(undo)
            _warn_nothing_found(model, include, global_pool, squeeze_pool)
            return model, []
        new_modules = _build(model, sites, example_input)  # all of them before the model is changed
    except BaseException:
        _undo(undo)
        raise
    model, replaced = _install(model, sites, new_modules)
    if global_pool is not None and callable(getattr(type(model), "reset_classifier", None)):
        settings = dict(gate=gate, global_pool=global_pool, example_input=_first(example_input),
                        gate_kwargs={k: v for k, v in gate_kwargs.items() if k == "temperature"})
        model.reset_classifier = functools.partial(_reset_classifier, model, settings)
    return model, replaced


def _check_arguments(model, gate, include, global_pool, squeeze_pool, gate_kwargs) -> tuple[type, ...]:
    """Every argument of :func:`convert` checked before anything is touched; the pool classes to replace."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    names, global_gates = gate_table.names(), gate_table.names(global_form=True)
    with_temperature = gate_table.names(temperature=True)
    if not isinstance(gate, str):
        raise TypeError(f"gate must be a str, one of {list(names)}; got {type(gate).__name__}")
    if gate not in names:
        raise ValueError(f"gate={gate!r} is unknown; choose one of {list(names)}")
    include = _check_include(include)
    for arg, value in (("global_pool", global_pool), ("squeeze_pool", squeeze_pool)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{arg} must be None or a str, one of {list(global_gates)}; got {value!r}")
        if value is not None and value not in global_gates:
            hint = gate_table.row(value).no_form_hint("a global window has none") if value in names else ""
            raise ValueError(f"{arg}={value!r} is not a global gate{hint}; choose None or one of "
                             f"{list(global_gates)}")
    unknown = sorted(set(gate_kwargs) - _GATE_KWARGS)
    if unknown:
        raise TypeError(
            f"convert() got unexpected keyword argument(s) {unknown}; the gate keywords are "
            f"temperature (gates {list(with_temperature)}) and count_include_pad "
            f"({gate_table.which('count_include_pad').replace('gate=', 'gate ')}). "
            f"The geometry is copied from each pool and the channels are found by convert"
        )
    if "count_include_pad" in gate_kwargs and gate not in gate_table.taking("count_include_pad"):
        raise ValueError(
            f"count_include_pad applies to {gate_table.which('count_include_pad')} only; gate={gate!r}"
        )
    if "temperature" in gate_kwargs and not {gate, global_pool, squeeze_pool} & set(with_temperature):
        raise ValueError(f"temperature applies to the gates {list(with_temperature)}; none of "
                         f"gate={gate!r}, global_pool={global_pool!r}, squeeze_pool={squeeze_pool!r} has one")
    return include


def _undo(steps: list[Callable[[], None]]) -> None:
    """Put back what :func:`_rewrite_calls` changed, last change first."""
    for f in reversed(steps):
        f()


def _warn_nothing_found(model: nn.Module, include, global_pool, squeeze_pool) -> None:
    """The warning for a model with no pool to replace (none unless nothing in it was converted before)."""
    if not any(hasattr(m, "_gatepool_origin") for m in model.modules()):
        warnings.warn(
            f"convert found nothing to replace in {type(model).__name__}: no module of the types "
            f"{[t.__name__ for t in include]} and no such call in a forward"
            + (f" and no global average pool (global_pool={global_pool!r}, squeeze_pool="
               f"{squeeze_pool!r})" if global_pool or squeeze_pool else
               " (global pools were not asked for: global_pool=None)"),
            stacklevel=3,  # convert's caller
        )


def _build(model: nn.Module, sites: list[_Site], example_input) -> list[nn.Module]:
    """Each site's new module, built for its input's channels, on its input's device, in the model's dtype."""
    inputs = _dry_run(model, sites, example_input) if any(s.needs_channels for s in sites) else {}
    device, dtype = _placement(model)
    new_modules = []
    for site in sites:
        seen = inputs.get(id(site.module))
        new = site.build(seen[0] if site.needs_channels else None)
        at = seen[1] if seen is not None else device
        new = new.to(device=at, dtype=dtype) if dtype is not None or at is not None else new
        new.train(site.module.training)
        new_modules.append(new)
    return new_modules


def _install(model: nn.Module, sites: list[_Site], new_modules: list[nn.Module]):
    """Each new module at every name of its site, marked with what it replaced: ``(model, replaced)``."""
    replaced = []
    for site, new in zip(sites, new_modules):
        new._gatepool_origin = site.origin  # a plain attribute: not a child, not in the state_dict
        for name in site.names:
            replaced.append(Replaced(name, type(site.origin.module), site.origin.text, new, site.origin.role,
                                     site.origin.source))
            if name == "":
                model = new
            else:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent) if parent else model, child, new)
    return model, replaced


def _reset_classifier(model: nn.Module, settings: dict, *args, **kwargs):
    """timm's ``reset_classifier``, then the new head's global pool converted as the old one was."""
    out = type(model).reset_classifier(model, *args, **kwargs)
    convert(model, settings["gate"], include=(), global_pool=settings["global_pool"],
            example_input=settings["example_input"], **settings["gate_kwargs"])
    return out


def _first(example):
    """The first sample of an example batch (kept for ``reset_classifier``; a dry forward needs no more)."""
    if isinstance(example, torch.Tensor):
        return example[:1] if example.dim() > 0 else example
    if isinstance(example, (tuple, list)):
        return type(example)(_first(e) for e in example)
    if isinstance(example, dict):
        return {k: _first(v) for k, v in example.items()}
    return example


# --------------------------------------------------------------------------------------------------
# Finding the pools


def _check_include(include) -> tuple[type[nn.Module], ...]:
    allowed = _names(POOLS + ADAPTIVE_POOLS)
    if isinstance(include, type):
        include = (include,)
    if not isinstance(include, (tuple, list, set, frozenset)):
        raise TypeError(f"include must be a tuple of pool classes (any of {allowed}), got {include!r}")
    for t in include:
        if not isinstance(t, type):
            raise TypeError(f"include must hold classes (any of {allowed}), got {t!r}")
        if t not in _DIM and t not in _ADAPTIVE_AVG:
            raise ValueError(f"include may hold {allowed} only (global average pools: pass global_pool= / "
                             f"squeeze_pool=GATE); got {t.__name__}")
    return tuple(include)


def _label(name: str) -> str:
    """A module's name for a message: ``'layer1.0.pool'``, or "the model" for the root."""
    return repr(name) if name else "the model"


def _names(types) -> list[str]:
    return [f"nn.{t.__name__}" for t in types]


def _unwrap(m: nn.Module) -> tuple[nn.Module, Callable[[nn.Module, str], nn.Module] | None]:
    """The torch pool whose windows ``m`` pools, and how to wrap a successor of it as ``m`` does (a new
    module, the gate -> the wrapped module), or None: ``m`` is that pool itself."""
    name = type(m).__name__
    if name in _SAME and isinstance(m, _SAME[name]) and type(m).__module__.startswith("timm."):
        k, s = tuple(m.kernel_size), tuple(m.stride)
        if isinstance(m, nn.MaxPool2d):
            inner = nn.MaxPool2d(k, s, 0, m.dilation, ceil_mode=m.ceil_mode)
        else:
            inner = nn.AvgPool2d(k, s, 0, m.ceil_mode, m.count_include_pad, m.divisor_override)
        return inner, lambda new, gate: PoolSame(new, k, s, gate_table.row(gate).same_fill)
    if type(m) is AtLeastPool:
        return m.pool, lambda new, gate: AtLeastPool(new, m.size)
    return m, None


def _kind(m: nn.Module) -> tuple[str, int] | None:
    """("window" | "adaptive" | "global", dim) for the pools convert knows, else None."""
    m = _unwrap(m)[0]
    if type(m) in _DIM:
        return "window", _DIM[type(m)]
    if type(m) in _ADAPTIVE_AVG:
        d = _ADAPTIVE_AVG[type(m)]
        size = m.output_size
        one = size == 1 or (isinstance(size, (tuple, list)) and len(size) == d and all(s == 1 for s in size))
        return ("global" if one else "adaptive"), d
    if type(m) is fp.SpatialMean:
        return "global", m.dim
    if type(m).__name__ == "FastAdaptiveAvgPool" and tuple(getattr(m, "dim", ())) == (2, 3):
        return "global", 2  # timm's, NCHW only
    return None


def _rewrite_calls(model: nn.Module, include, gates: dict, traces: dict) -> list[Callable[[], None]]:
    """Each pool call to convert becomes a call of a new child (torch's module for it); the undo steps."""
    undo = []
    if nn.AdaptiveAvgPool2d in include:  # timm's ConvMlp: its forward pools behind a branch on the size
        for m in list(model.modules()):
            k = fp.min_size_guard(m)
            if k is None:
                continue
            name = _free_name(m, "adaptive_avg_pool2d")
            child = AtLeastPool(nn.AdaptiveAvgPool2d((k, k)), (k, k))
            child._gatepool_call = (f"F.adaptive_avg_pool2d(output_size=(max({k}, H), max({k}, W)))",
                                    "adaptive")  # fmt: skip
            m.add_module(name, child)
            fp.guard(m, name)
            undo += [functools.partial(delattr, m, name), functools.partial(fp.unguard, m)]
    skip = {id(m) for m in model.modules() if _kind(m) is not None or hasattr(m, "_gatepool_origin")}
    calls, failed = fp.find_calls(model, skip)
    notes = [f"{_label(n)} ({type(model.get_submodule(n) if n else model).__name__}): {why}"
             for n, why in failed]
    chosen: dict[str, list] = {}
    for call in calls:
        if call.module is None:
            notes.append(f"{_label(call.owner)}: {call.text}: {call.why}")
            continue
        kind, _ = _kind(call.module)
        if kind == "global":
            node = call.node
            role = fp.pool_role(model, call.owner, lambda n, node=node: n is node, {call.owner: node.graph})
            if role == "unknown":
                role = "head"
            if gates[role] is None:
                continue
        else:
            role = kind  # (an adaptive call the gate has no form for is rewritten: _find warns)
            if type(call.module) not in include:
                continue
        chosen.setdefault(call.owner, []).append((call, role))
    if notes:
        warnings.warn("convert left these pool calls as they are (fx could not rewrite them): "
                      + "; ".join(notes), stacklevel=3)
    for owner, items in chosen.items():
        m = model.get_submodule(owner) if owner else model
        previous = m.__dict__.get("_gatepool_rewrite")
        pairs = []
        for call, role in items:
            name = _free_name(m, call.text.split("(")[0].replace("F.", "").replace(".", "_"))
            call.module._gatepool_call = (call.text, role)  # read by _find
            m.add_module(name, call.module)
            undo.append(functools.partial(delattr, m, name))
            pairs.append((call, name))
        fp.rewrite(m, pairs)
        undo.append(functools.partial(fp.undo, m, previous))
    return undo


def _free_name(m: nn.Module, base: str) -> str:
    name, i = base, 1
    while hasattr(m, name):
        name, i = f"{base}_{i}", i + 1
    return name


def _find(model, include, gates, gate_kwargs, traces) -> tuple[list[_Site], list[str]]:
    """The modules to replace (each once, with all its names), and what to warn about."""
    sites: dict[int, _Site] = {}
    untraced, no_adaptive = [], []
    done = set()
    pools = []  # the names of the pools met so far: a pool inside one (PoolSame's) is part of it
    for name, m in model.named_modules(remove_duplicate=False):
        if id(m) in sites:
            if name not in sites[id(m)].names:
                sites[id(m)].names.append(name)
            continue
        if id(m) in done or any(name.startswith(p + ".") for p in pools):
            continue
        done.add(id(m))
        if hasattr(m, "_gatepool_origin") or _kind(m) is not None:
            pools.append(name)
        origin = getattr(m, "_gatepool_origin", None)
        if origin is None:
            base = m
            kind = _kind(base)
            if kind is None:
                continue
            call = getattr(m, "_gatepool_call", None)
            role = kind[0]
            if role == "global":
                if call is not None:
                    role = call[1]
                elif "SelectAdaptivePool2d" in (type(_parent(model, name)).__name__, type(m).__name__) or \
                        type(m).__name__ == "FastAdaptiveAvgPool":
                    role = "head"
                elif name == "":
                    role = "head"  # the model is the pool
                else:
                    role = _module_role(model, name, traces)
                    if role == "unknown":
                        untraced.append(name)
                        role = "head"
            text = f"{call[0]} in {type(_parent(model, name)).__name__}.forward" if call else repr(m)
            origin = _Origin(copy.deepcopy(m), role, "function" if call else "module", text)
        if origin.role in ("window", "adaptive") and type(_unwrap(origin.module)[0]) not in include:
            continue
        target = gates[origin.role]
        if target is None:
            continue
        if origin.role == "adaptive" and not gate_table.row(target).adaptive_form:
            no_adaptive.append(name)
            continue
        site = _site(m, name, origin, target, gate_kwargs)
        if site is not None:
            sites[id(m)] = site
    notes = []
    if untraced:
        notes.append(f"convert could not follow where the output of the global pools {untraced} goes "
                     f"(fx could not trace a module above them): they count as the head's pools "
                     f"(global_pool=); Replaced.role says 'head'")
    if no_adaptive:
        notes.append(f"convert left the adaptive pools {no_adaptive} alone: gate={gates['adaptive']!r} has "
                     f"no adaptive form (adaptive windows vary in size); choose one of "
                     f"{list(gate_table.names(adaptive_form=True))}")
    return list(sites.values()), notes


def _parent(model: nn.Module, name: str) -> nn.Module:
    parent = name.rpartition(".")[0]
    return model.get_submodule(parent) if parent else model


def _module_role(model: nn.Module, name: str, traces: dict) -> str:
    parent, _, child = name.rpartition(".")
    return fp.pool_role(model, parent, lambda n: n.op == "call_module" and n.target == child, traces)


def _site(m: nn.Module, name: str, origin: _Origin, gate: str, gate_kwargs: dict) -> _Site | None:
    """How to replace ``m`` (whose first form is ``origin.module``) by ``gate``; None if it is there."""
    base, wrap = _unwrap(origin.module)
    kind, d = _kind(base)
    row = gate_table.row(gate)
    temp = {k: v for k, v in gate_kwargs.items() if k == "temperature" and row.temperature}
    needs = row.weights  # built for the width C of its input
    if kind == "window":
        build = _pool_builder(name, base, gate, gate_kwargs)
    elif kind == "adaptive":
        if row.torch:
            def build(c, size=base.output_size):
                return row.torch_module(d, adaptive=True)(size)
        else:
            _ADAPTIVE[d](base.output_size, gate=gate, channels=1 if needs else None, **temp)  # checks, now

            def build(c, size=base.output_size):
                return _ADAPTIVE[d](size, gate=gate, channels=c, **temp)
    else:
        flatten = bool(getattr(base, "flatten", False)) or (type(base) is fp.SpatialMean and not base.keepdim)
        if gate == "avg" and hasattr(m, "_gatepool_origin"):
            def build(c):  # the way back: (a copy of) the module it replaced
                return copy.deepcopy(origin.module)
        else:
            _GLOBAL[d](gate, channels=1 if needs else None, flatten=flatten, **temp)  # the checks, now

            def build(c):
                return _GLOBAL[d](gate, channels=c, flatten=flatten, **temp)
    if wrap is not None:
        def build(c, build=build):
            return wrap(build(c), gate)
    if hasattr(m, "_gatepool_origin") and _same(m, build, needs):
        return None  # already this: convert is idempotent
    return _Site(m, [name], d, build, needs, origin)


def _same(m: nn.Module, build, needs: bool) -> bool:
    """Whether ``m`` is what ``build`` would make (type and repr; the weights are not compared)."""
    channels = getattr(m, "channels", None)
    if channels is None and isinstance(m, (PoolSame, AtLeastPool)):
        channels = getattr(m.pool, "channels", None)
    if needs and channels is None:
        return False
    new = build(channels if needs else None)
    return type(new) is type(m) and repr(new) == repr(m)


def _pool_builder(name: str, m: nn.Module, gate: str, gate_kwargs: dict):
    """A windowed pool: its geometry, checked against the gate now (an error names the module)."""
    d, row = _DIM[type(m)], gate_table.row(gate)
    kwargs = {"ceil_mode": m.ceil_mode}
    if isinstance(m, nn.modules.pooling._MaxPoolNd):
        if m.dilation not in (1, (1,) * d):
            kwargs["dilation"] = m.dilation
        if m.return_indices:
            if "return_indices" not in row.torch_kwargs:
                raise ValueError(
                    f"{_label(name)} ({m!r}) returns indices (for nn.MaxUnpool*d), which only "
                    f"{gate_table.which('return_indices')} gives; gate={gate!r} cannot replace it (leave its "
                    f"type out of include)"
                )
            kwargs["return_indices"] = True
    else:
        if "count_include_pad" in row.torch_kwargs:
            kwargs["count_include_pad"] = m.count_include_pad
        if getattr(m, "divisor_override", None) is not None:
            if "divisor_override" not in row.torch_kwargs:
                raise ValueError(f"{_label(name)} ({m!r}) divides by divisor_override="
                                 f"{m.divisor_override}, which only {gate_table.which('divisor_override')} "
                                 f"takes; got gate={gate!r}")
            kwargs["divisor_override"] = m.divisor_override
    # temperature= is for the gates that have one (the global pools' too); max and avg stay torch's own
    kwargs.update({k: v for k, v in gate_kwargs.items() if k != "temperature" or row.temperature})
    window = (m.kernel_size, m.stride, m.padding)
    needs = row.weights
    create_pool(gate, *window, dim=d, channels=1 if needs else None, **kwargs)  # the checks, now
    return lambda c: create_pool(gate, *window, dim=d, channels=c, **kwargs)


# --------------------------------------------------------------------------------------------------
# Channels: one dry forward


def _dry_run(model: nn.Module, sites: list[_Site], example_input) -> dict[int, tuple[int, torch.device]]:
    """{id(pool): (C, device)} of each pool's input, from one forward of ``example_input``."""
    want = [s for s in sites if s.needs_channels]
    if example_input is None:
        names = ", ".join(repr(s.names[0]) for s in want[:4]) + (", …" if len(want) > 4 else "")
        raise ValueError(
            f"the new layers have weights per channel (a gate among {list(gate_table.names(weights=True))} "
            f"or "
            f"global_pool 'soft-learned'/'attention'): pass example_input= a batch the model accepts, so "
            f"that convert can read each pool's input width C (pools {names})"
        )
    seen: dict[int, set[tuple[int, torch.device]]] = {}

    def record(site: _Site):
        def hook(module, args):
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.dim() in (site.dim + 1, site.dim + 2):
                c = x.shape[1] if x.dim() == site.dim + 2 else x.shape[0]
                seen.setdefault(id(module), set()).add((int(c), x.device))

        return hook

    modes = [(m, m.training) for m in model.modules()]
    handles = [s.module.register_forward_pre_hook(record(s)) for s in want]
    try:
        model.eval()
        with torch.no_grad():
            if isinstance(example_input, dict):
                model(**example_input)
            elif isinstance(example_input, (tuple, list)):
                model(*example_input)
            else:
                model(example_input)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes:
            m.training = mode
    out = {}
    for s in want:
        found = seen.get(id(s.module), set())
        label = _label(s.names[0])
        if not found:
            raise ValueError(f"{label} ({s.module!r}) was not called in the forward of example_input: its "
                             f"channels are unknown (a branch the example does not take?)")
        if len({c for c, _ in found}) > 1:
            raise ValueError(
                f"{label} ({s.module!r}) is called on inputs of {sorted(c for c, _ in found)} channels; a "
                f"gate with weights is built for one width: give each call its own pool"
            )
        out[id(s.module)] = next(iter(found))
    return out


def _placement(model: nn.Module) -> tuple[torch.device | None, torch.dtype | None]:
    """The device and floating dtype of the model's first floating parameter (or buffer), else None."""
    for t in (*model.parameters(), *model.buffers()):
        if t.is_floating_point():
            return t.device, t.dtype
    return None, None
