"""Where the probe finds a rule: one registry for module rules, function rules and correlated rules.

    reg = Registry("module_type", modules=True, functions=False)
    reg.register(MyBlock, rule)          # or @reg.register(MyBlock) above the rule; a later call replaces it
    reg.lookup(MyBlock)                  # a module class: the nearest registered class in its __mro__
    reg.lookup(torch.roll), reg.lookup("view")   # a function, or a method's name: that key only

The ideal walk's module rules (:func:`rules.register_rule`), its function rules
(:func:`functions.register_function_rule`) and the correlated walk's rules
(:func:`correlated_predict.register_correlated_rule`, module classes and functions both) are each one
:class:`Registry`; what a rule is called with and returns is theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn as nn

__all__ = ["Registry"]


class Registry:
    """Rules by key: module classes (``modules``: found for their subclasses too) and functions or method
    names (``functions``); ``arg`` names the key in the errors of :meth:`register`."""

    def __init__(
        self, arg: str, *, modules: bool, functions: bool, entries: dict[Any, Callable] | None = None
    ) -> None:
        if not (modules or functions):
            raise ValueError("a registry holds module rules, function rules or both")
        self.arg, self.modules, self.functions = arg, modules, functions
        self._rules: dict[Any, Callable] = {}
        for key, rule in (entries or {}).items():
            self.register(key, rule)

    def _check(self, key) -> None:
        if self.modules and isinstance(key, type):
            if not issubclass(key, nn.Module):
                raise TypeError(f"{self.arg} must be an nn.Module subclass, got {key!r}")
            return
        if self.functions and (callable(key) or isinstance(key, str)):
            return
        allowed = [w for w, ok in (("an nn.Module subclass", self.modules),
                                   ("a callable or a method name", self.functions)) if ok]  # fmt: skip
        raise TypeError(f"{self.arg} must be {' or '.join(allowed)}, got {key!r}")

    def register(self, key, rule: Callable | None = None):
        """Use ``rule`` for ``key``; returns ``rule``. Without ``rule``, a decorator."""
        self._check(key)
        if rule is None:
            return lambda r: self.register(key, r)
        if not callable(rule):
            raise TypeError(f"rule must be callable, got {type(rule).__name__}")
        self._rules[key] = rule
        return rule

    def lookup(self, key) -> Callable | None:
        """The rule of ``key``: of a module class, the nearest registered class in its ``__mro__``."""
        owner = self.owner(key)
        return None if owner is None else self._rules[owner]

    def owner(self, key):
        """The key whose rule :meth:`lookup` finds: of a module class, the nearest registered class in its
        ``__mro__``; else ``key`` if it is registered; else None."""
        if self.modules and isinstance(key, type):
            return next((c for c in key.__mro__ if c in self._rules), None)
        try:
            return key if key in self._rules else None
        except TypeError:  # an unhashable key
            return None

    def copy(self) -> Registry:
        """A registry with the same rules (a test registers into it, leaving these as they are)."""
        return Registry(self.arg, modules=self.modules, functions=self.functions, entries=self._rules)

    def __contains__(self, key) -> bool:
        return self.lookup(key) is not None
