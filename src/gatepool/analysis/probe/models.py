"""Models from other libraries for the probe, at initialization, without the network.

    build_model("torchvision:resnet18")     torchvision.models.get_model(name, weights=None)
    build_model("timm:resnet18")            timm.create_model(name, pretrained=False)

Either library missing: a one-line ValueError naming the spec and ``pip install gatepool[vision]``.
"""

from __future__ import annotations

import importlib

import torch.nn as nn

__all__ = ["build_model"]

_LIBRARIES = ("torchvision", "timm")


def build_model(spec: str) -> nn.Module:
    """The model ``spec`` ("torchvision:NAME" or "timm:NAME") with random weights (none downloaded)."""
    library, sep, name = spec.partition(":")
    if not sep or library not in _LIBRARIES or not name:
        raise ValueError(
            f"model spec {spec!r}: expected library:NAME with library one of "
            f"{', '.join(_LIBRARIES)} (e.g. torchvision:resnet18)"
        )
    try:
        lib = importlib.import_module(library)
    except ImportError:
        raise ValueError(
            f"model spec {spec!r} needs {library}, which is not installed: pip install gatepool[vision]"
        ) from None
    try:
        if library == "torchvision":
            return importlib.import_module("torchvision.models").get_model(name, weights=None)
        return lib.create_model(name, pretrained=False)
    except (ValueError, KeyError, RuntimeError) as e:  # an unknown name
        raise ValueError(f"model spec {spec!r}: {library} has no model {name!r} ({e})") from None
