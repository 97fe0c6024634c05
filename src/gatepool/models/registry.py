"""Models by name: ``create_model("residual_cnn", pool="soft")``, ``list_models()``; with
``pretrained=True`` the shipped lecture weights (``gatepool.models.pretrained``).

A model file registers its constructor with ``@register_model("name")``. Importing this module
imports the ``gatepool.models`` package first, whose ``__init__`` imports every model file, so every
model is registered before the first lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.nn as nn

_MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register a model constructor under ``name``."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _MODELS and _MODELS[name] is not fn:
            raise ValueError(f"model name {name!r} is registered twice")
        _MODELS[name] = fn
        return fn

    return deco


def list_models() -> list[str]:
    """Names accepted by :func:`create_model`, sorted."""
    return sorted(_MODELS)


def model_entrypoint(name: str) -> Callable[..., nn.Module]:
    """The constructor registered as ``name`` (as timm's ``model_entrypoint``)."""
    if name not in _MODELS:
        raise ValueError(f"model={name!r} is unknown; choose one of {sorted(_MODELS)}")
    return _MODELS[name]


def create_model(name: str, pretrained: bool | str = False, **kwargs) -> nn.Module:
    """Build the model registered as ``name`` with keyword arguments ``kwargs``.

    ``pretrained=True`` loads the shipped lecture weights for that model and kwargs (their SHA-256
    verified first; see :mod:`gatepool.models.pretrained`); a string names the shipped weights
    (``"conv_attention-s1"``). No shipped weights for the combination: a ValueError listing what ships.
    """
    if pretrained is not False:
        model_entrypoint(name)  # an unknown name: the registry's error first
        return load_pretrained(name, pretrained, kwargs)
    return model_entrypoint(name)(**kwargs)


def load_pretrained(name: str, which: bool | str = True, kwargs: dict[str, Any] | None = None,
                    root: str | Path | None = None) -> nn.Module:  # fmt: skip
    """``create_model(name, **card kwargs)`` with the shipped weights loaded (hash verified first); the card
    is attached as ``model.pretrained_card``."""
    from safetensors.torch import load

    from gatepool.models.pretrained import find_card, verified_bytes

    card = find_card(name, kwargs, which, root)
    state = load(verified_bytes(card, root))  # CPU tensors
    model = model_entrypoint(card["model"])(**card["model_kwargs"])
    model.load_state_dict(state)  # strict: a file of another architecture is an error
    model.pretrained_card = card
    return model

