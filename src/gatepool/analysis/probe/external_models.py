"""Models from other libraries for the probe, at initialization, without the network.

    build_model("torchvision:resnet18")     torchvision.models.get_model(name, weights=None)
    build_model("timm:resnet18")            timm.create_model(name, pretrained=False)

Either library missing: a one-line ValueError naming the spec and ``pip install gatepool[vision]``.
``resized_digits(digits, size)`` turns (B, 1, 28, 28) digits into the (B, 3, size, size) images such a
model takes.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["build_model", "resized_digits"]

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


def resized_digits(digits: torch.Tensor, size: int) -> torch.Tensor:
    """(B, 1, 28, 28) digits as (B, 3, size, size) images: bilinear resize, the channel repeated."""
    if digits.dim() != 4 or digits.shape[1] != 1:
        raise ValueError(f"digits must be (B, 1, H, W), got shape {tuple(digits.shape)}")
    x = F.interpolate(digits, size=(size, size), mode="bilinear", align_corners=False)  # (B, 1, S, S)
    return x.expand(-1, 3, -1, -1).contiguous()  # (B, 3, S, S)
