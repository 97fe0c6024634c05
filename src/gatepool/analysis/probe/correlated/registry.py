"""Which rule the correlated walk uses for a module: one :class:`probe.registry.Registry` and its lookup.

    register_correlated_rule(MyBlock, lambda m: MyStep(m.weight))   # a module class: one node, its step
    register_correlated_rule("my_op", rule)                          # a function or a method's name
    rule_for(module)                                                 # the rule the walk takes, or None

Each rule file of this package registers its own modules beside its rule (``conv.py`` nn.Conv2d,
``norms.py`` the norms …), torchvision's and timm's classes by their qualified names
(:func:`register_named_rule`: neither is imported here), so that adding a module is one file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch.nn as nn

from gatepool.analysis.probe.registry import Registry

__all__ = ["function_rule", "pair", "register_correlated_rule", "register_named_rule", "rule_for"]

RULES = Registry("target", modules=True, functions=True)
_FOR_SUBCLASSES: set = set()  # module classes whose rule holds for a subclass with its own forward too
# modules of torchvision and timm by their qualified class names; these come before their base classes
# (a LayerNorm2d is an nn.LayerNorm over the channels, not the last dim)
_NAMED_RULES: dict[str, Callable] = {}


def pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def register_correlated_rule(target, rule=None, *, subclasses: bool = False):
    """Use ``rule`` in the correlated walk for ``target``; returns ``rule`` (without it, a decorator).

    ``target`` a module class (the walk keeps its calls whole, as one node): ``rule(module)`` builds the
    step. Its subclasses get the rule too, but for one that defines its own ``forward`` (it may compute
    something else: timm's ``Conv2dSame`` pads first), unless ``subclasses=True`` says the rule holds
    for every subclass whatever its forward. A function or a method's name (a call node of the traced graph;
    ``torch.fx.wrap`` keeps a function of yours one node): ``rule(*args, **kwargs)`` the call's
    arguments, its tensor input as its :class:`correlated.Field`, constants as they are. The step maps
    one input: ``step.forward(x: Field) -> Field`` (the output's mean map, variance map and correlation
    stencil) and ``step.backward(g: Field) -> Field`` (the gradient's, at the input); a module's step
    that needs the call's other arguments (constants: the map size PVT's attention is called with)
    defines ``bind(*args, **kwargs)``, which the walk calls with them before ``forward``. A rule that has
    no answer raises NotImplementedError: the row says why, and nothing after it is predicted.
    """
    if not isinstance(subclasses, bool):
        raise TypeError(f"subclasses must be a bool, got {type(subclasses).__name__}")
    if subclasses:
        _FOR_SUBCLASSES.add(target)
    else:
        _FOR_SUBCLASSES.discard(target)
    return RULES.register(target, rule)


def register_named_rule(*qualnames: str):
    """A decorator: the rule of the classes or functions of these qualified names
    (``"timm.layers.drop.DropPath"``), a library's modules and functions that this package does not import."""

    def register(rule: Callable) -> Callable:
        for name in qualnames:
            _NAMED_RULES[name] = rule
        return rule

    return register


def function_rule(target):
    """The rule of a call's target (a function or a method's name): registered as itself, or by its
    qualified name (a library's function that this package does not import, :func:`register_named_rule`)."""
    rule = RULES.lookup(target)
    if rule is None and callable(target) and not isinstance(target, type):
        rule = _NAMED_RULES.get(f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}")
    return rule


def rule_for(m: nn.Module):
    """The rule of the nearest class in ``type(m).__mro__`` that has one (torchvision's and timm's classes
    by name, before their bases). Where a class before it defines its own ``forward`` (a subclass that
    may compute something else) the module is still one node, but its rule says it has none, unless
    that rule was registered for every subclass."""
    for cls in type(m).__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in _NAMED_RULES:
            return _NAMED_RULES[name]
        if RULES.owner(cls) is cls:
            return RULES.lookup(cls)
        if "forward" in vars(cls):
            owner = RULES.owner(type(m))
            if owner is None or owner in _FOR_SUBCLASSES:
                return RULES.lookup(owner)
            return functools.partial(_own_forward, base=owner)
    return None


def _own_forward(m: nn.Module, base: type):
    raise NotImplementedError(f"no correlated rule for {type(m).__name__}: its own forward, not "
                              f"{base.__name__}'s (register_correlated_rule)")  # fmt: skip
