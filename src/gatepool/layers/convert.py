"""``convert(model, gate)``: every pool of a model replaced by a gate at the same geometry, in place.

    model, replaced = convert(torchvision.models.resnet18(), "soft")            # the stem's max pool
    model, replaced = convert(net, "attention", example_input=torch.randn(2, 3, 64, 64))
    model, replaced = convert(net, "soft", global_pool="soft-learned", example_input=x)   # and the head

Each ``nn.MaxPool{1,2,3}d`` / ``nn.AvgPool{1,2,3}d`` (``include``) becomes ``create_pool(gate, ...)`` with
its kernel_size, stride, padding, dilation and ceil_mode; an average pool's ``count_include_pad`` (and
``divisor_override``) go over where the gate has them ("avg"; the soft family gives padded taps gate 0,
always). ``gate="max"`` / ``"avg"`` give torch's own modules back, so they pool exactly as before.
``global_pool=GATE`` also replaces every global average pool — ``nn.AdaptiveAvgPool{1,2,3}d(1)`` (the
head of a ResNet, and the squeeze of squeeze-and-excitation blocks), and the pool of timm's
``SelectAdaptivePool2d`` with an average ``pool_type`` — by :class:`GlobalGatedPool{d}d` with that gate.
Only modules are seen: a pool called as a function in ``forward`` (``F.adaptive_avg_pool2d`` in
torchvision's DenseNet) stays as it is.

Modules match by exact type: a subclass (timm's ``MaxPool2dSame``/``AvgPool2dSame`` pad "same" in their
own ``forward``) pools differently from what its attributes say, so it is left alone, with a warning.
timm's classes are recognized by their names: neither torchvision nor timm is imported here. This file
knows torch's modules and the library's layers only, so it lives in ``gatepool.layers``;
``gatepool.convert`` is the same function.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from gatepool.layers.create_pool import create_pool
from gatepool.layers.gated_pool import GATES, GATES_WITH_TEMPERATURE, GATES_WITH_WEIGHTS
from gatepool.layers.global_pool import (
    GLOBAL_GATES,
    GlobalGatedPool1d,
    GlobalGatedPool2d,
    GlobalGatedPool3d,
)

__all__ = ["POOLS", "Replaced", "convert"]

POOLS: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
)  # fmt: skip
_DIM = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3, nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3}
_ADAPTIVE_AVG = {nn.AdaptiveAvgPool1d: 1, nn.AdaptiveAvgPool2d: 2, nn.AdaptiveAvgPool3d: 3}
_GLOBAL = {1: GlobalGatedPool1d, 2: GlobalGatedPool2d, 3: GlobalGatedPool3d}
_GATE_KWARGS = {"temperature", "count_include_pad"}  # what a user may set on every new layer
_SELECT_AVG = ("avg", "fast", "fastavg")  # timm's SelectAdaptivePool2d pool types that average
_NO_GLOBAL_CONV = " ('conv' weighs fixed window positions; a global window has none)"


@dataclass(frozen=True)
class Replaced:
    """One replaced module: where it was, what it was, what stands there now."""

    name: str  # qualified name in the model ("layer1.0.downsample.0"; "" for the model itself)
    old_type: type  # the replaced module's class
    old: str  # its repr
    new: nn.Module  # the module now at ``name``

    def __repr__(self) -> str:
        return f"Replaced({self.name!r}: {self.old} -> {self.new!r})"


@dataclass
class _Site:
    """A module to replace, at every name it is registered under, and how to build its successor."""

    module: nn.Module
    names: list[str]
    dim: int
    build: Callable[[int | None], nn.Module]  # channels (None when the gate needs none) -> new module
    needs_channels: bool


def convert(
    model: nn.Module,
    gate: str,
    *,
    include: Iterable[type[nn.Module]] = POOLS,
    global_pool: str | None = None,
    example_input: torch.Tensor | tuple | dict | None = None,
    **gate_kwargs,
) -> tuple[nn.Module, list[Replaced]]:
    """Replace the pools of ``model`` by the gate ``gate``, in place; returns ``(model, replaced)``.

    Args:
        model: any ``nn.Module``; changed in place (the same object is returned, unless ``model`` is
            itself a pool, which cannot replace itself: then the new pool is returned).
        gate: the windowed pools' gate, one of ``gatepool.layers.list_pools()``.
        include: the pool classes to replace, any of ``POOLS`` (torch's max and average pools, 1-D to
            3-D); ``()`` replaces none (e.g. with ``global_pool`` only).
        global_pool: None (leave global pools alone) or the gate for the global average pools, one of
            ``"max", "avg", "soft", "soft-learned", "attention"``.
        example_input: a batch the model accepts (a tensor; a tuple of arguments; a dict of keyword
            arguments): needed only by the gates with weights ("soft-learned", "attention", "conv"),
            which are built for the width C of their input.
        gate_kwargs: for every new layer: ``temperature`` (τ of the soft family, the start τ of
            "soft-learned"; the global pools' too), ``count_include_pad`` (gate "avg" only; without it,
            an average pool's own is copied and a max pool's successor takes torch's default, True).

    Returns ``replaced``: one :class:`Replaced` per name replaced, in the order ``model.named_modules()``
    first meets each module. A module registered under two names is replaced by one new module at both
    (they stay shared, weights included).
    Every argument and every new layer is checked before the model is touched: an error leaves it as it
    was. Nothing matched: a warning, and ``(model, [])``.

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
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(gate, str):
        raise TypeError(f"gate must be a str, one of {list(GATES)}; got {type(gate).__name__}")
    if gate not in GATES:
        raise ValueError(f"gate={gate!r} is unknown; choose one of {list(GATES)}")
    include = _check_include(include)
    if global_pool is not None and not isinstance(global_pool, str):
        raise TypeError(f"global_pool must be None or a str, one of {list(GLOBAL_GATES)}; got "
                        f"{global_pool!r}")
    if global_pool is not None and global_pool not in GLOBAL_GATES:
        hint = _NO_GLOBAL_CONV if global_pool == "conv" else ""
        raise ValueError(f"global_pool={global_pool!r} is not a global gate{hint}; choose None or one of "
                         f"{list(GLOBAL_GATES)}")
    unknown = sorted(set(gate_kwargs) - _GATE_KWARGS)
    if unknown:
        raise TypeError(
            f"convert() got unexpected keyword argument(s) {unknown}; the gate keywords are "
            f"temperature (gates {list(GATES_WITH_TEMPERATURE)}) and count_include_pad (gate 'avg'). "
            f"The geometry is copied from each pool and the channels are found by convert"
        )
    if "count_include_pad" in gate_kwargs and gate != "avg":
        raise ValueError(f"count_include_pad applies to gate='avg' only; gate={gate!r}")
    if "temperature" in gate_kwargs and not {gate, global_pool} & set(GATES_WITH_TEMPERATURE):
        raise ValueError(f"temperature applies to the gates {list(GATES_WITH_TEMPERATURE)}; neither "
                         f"gate={gate!r} nor global_pool={global_pool!r} has one")  # fmt: skip

    sites, skipped = _find(model, gate, include, global_pool, gate_kwargs)
    if skipped:
        warnings.warn(
            "convert left these alone: subclasses of the pools in include, which may pool in their own "
            "forward otherwise than their attributes say (modules match by exact type): "
            + ", ".join(f"{n} ({t})" for n, t in skipped),
            stacklevel=2,
        )
    if not sites:
        warnings.warn(
            f"convert found nothing to replace in {type(model).__name__}: no module of the types "
            f"{[t.__name__ for t in include]}"
            + (f" and no global average pool (global_pool={global_pool!r})" if global_pool else
               " (global pools were not asked for: global_pool=None)"),
            stacklevel=2,
        )
        return model, []

    inputs = _dry_run(model, sites, example_input) if any(s.needs_channels for s in sites) else {}
    device, dtype = _placement(model)
    new_modules = []
    for site in sites:  # build them all before changing anything: an error leaves the model as it was
        seen = inputs.get(id(site.module))
        new = site.build(seen[0] if site.needs_channels else None)
        at = seen[1] if seen is not None else device
        new = new.to(device=at, dtype=dtype) if dtype is not None or at is not None else new
        new.train(site.module.training)
        new_modules.append(new)

    replaced = []
    for site, new in zip(sites, new_modules):
        for name in site.names:
            replaced.append(Replaced(name, type(site.module), repr(site.module), new))
            if name == "":
                model = new
            else:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent) if parent else model, child, new)
    return model, replaced


# --------------------------------------------------------------------------------------------------
# Finding the pools


def _check_include(include) -> tuple[type[nn.Module], ...]:
    if isinstance(include, type):
        include = (include,)
    if not isinstance(include, (tuple, list, set, frozenset)):
        raise TypeError(f"include must be a tuple of pool classes (any of {_names(POOLS)}), got {include!r}")
    for t in include:
        if not isinstance(t, type):
            raise TypeError(f"include must hold classes (any of {_names(POOLS)}), got {t!r}")
        if t not in _DIM:
            hint = " (global average pools: pass global_pool=GATE)" if t in _ADAPTIVE_AVG else ""
            raise ValueError(f"include may hold {_names(POOLS)} only{hint}; got {t.__name__}")
    return tuple(include)


def _label(name: str) -> str:
    """A module's name for a message: ``'layer1.0.pool'``, or "the model" for the root."""
    return repr(name) if name else "the model"


def _names(types) -> list[str]:
    return [f"nn.{t.__name__}" for t in types]


def _find(model, gate, include, global_pool, gate_kwargs) -> tuple[list[_Site], list[tuple[str, str]]]:
    """The modules to replace (each once, with all its names) and the subclasses left alone."""
    sites: dict[int, _Site] = {}
    skipped = []
    for name, m in model.named_modules(remove_duplicate=False):
        if id(m) in sites:
            if name not in sites[id(m)].names:
                sites[id(m)].names.append(name)
            continue
        site = None
        if type(m) in include:
            site = _pool_site(name, m, gate, gate_kwargs)
        elif global_pool is not None and _is_global_avg(m):
            site = _global_site(m, name, global_pool, gate_kwargs, flatten=False)
        elif isinstance(m, tuple(include)):
            skipped.append((name, type(m).__name__))
        if site is not None:
            sites[id(m)] = site
        if global_pool is not None and type(m).__name__ == "SelectAdaptivePool2d":
            inner = getattr(m, "pool", None)  # timm's fast pools: flatten inside the pool
            if type(inner).__name__ == "FastAdaptiveAvgPool" and str(m.pool_type).lower() in _SELECT_AVG:
                if tuple(getattr(inner, "dim", ())) == (2, 3) and id(inner) not in sites:  # NCHW only
                    at = f"{name}.pool" if name else "pool"
                    flat = inner.flatten
                    sites[id(inner)] = _global_site(inner, at, global_pool, gate_kwargs, flatten=flat)
    return list(sites.values()), skipped


def _is_global_avg(m: nn.Module) -> bool:
    d = _ADAPTIVE_AVG.get(type(m))
    if d is None:
        return False
    size = m.output_size
    return size == 1 or (isinstance(size, (tuple, list)) and len(size) == d and all(s == 1 for s in size))


def _pool_site(name: str, m: nn.Module, gate: str, gate_kwargs: dict) -> _Site:
    """A windowed pool: its geometry, checked against the gate now (an error names the module)."""
    d = _DIM[type(m)]
    kwargs = {"ceil_mode": m.ceil_mode}
    if isinstance(m, nn.modules.pooling._MaxPoolNd):
        if m.dilation not in (1, (1,) * d):
            kwargs["dilation"] = m.dilation
        if m.return_indices:
            if gate != "max":
                raise ValueError(
                    f"{_label(name)} ({m!r}) returns indices (for nn.MaxUnpool*d), which only gate='max' "
                    f"gives; gate={gate!r} cannot replace it (leave its type out of include)"
                )
            kwargs["return_indices"] = True
    else:
        if gate == "avg":
            kwargs["count_include_pad"] = m.count_include_pad
        if getattr(m, "divisor_override", None) is not None:
            if gate != "avg":
                raise ValueError(f"{_label(name)} ({m!r}) divides by divisor_override="
                                 f"{m.divisor_override}, which only gate='avg' takes; got gate={gate!r}")
            kwargs["divisor_override"] = m.divisor_override
    # temperature= is for the gates that have one (the global pools' too); max and avg stay torch's own
    kwargs.update({k: v for k, v in gate_kwargs.items()
                   if k != "temperature" or gate in GATES_WITH_TEMPERATURE})  # fmt: skip
    window = (m.kernel_size, m.stride, m.padding)
    needs = gate in GATES_WITH_WEIGHTS
    create_pool(gate, *window, dim=d, channels=1 if needs else None, **kwargs)  # the checks, now
    return _Site(m, [name], d, lambda c: create_pool(gate, *window, dim=d, channels=c, **kwargs), needs)


def _global_site(m: nn.Module, name: str, gate: str, gate_kwargs: dict, *, flatten: bool) -> _Site:
    d = _ADAPTIVE_AVG.get(type(m), 2)
    kwargs = {k: v for k, v in gate_kwargs.items() if k == "temperature" and gate in GATES_WITH_TEMPERATURE}
    needs = gate in ("soft-learned", "attention")
    _GLOBAL[d](gate, channels=1 if needs else None, flatten=flatten, **kwargs)  # the checks, now
    return _Site(m, [name], d, lambda c: _GLOBAL[d](gate, channels=c, flatten=flatten, **kwargs), needs)


# --------------------------------------------------------------------------------------------------
# Channels: one dry forward


def _dry_run(model: nn.Module, sites: list[_Site], example_input) -> dict[int, tuple[int, torch.device]]:
    """{id(pool): (C, device)} of each pool's input, from one forward of ``example_input``."""
    want = [s for s in sites if s.needs_channels]
    if example_input is None:
        names = ", ".join(repr(s.names[0]) for s in want[:4]) + (", …" if len(want) > 4 else "")
        raise ValueError(
            f"the new layers have weights per channel (a gate among {list(GATES_WITH_WEIGHTS)} or "
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
