"""``create_pool(name, channels, kernel_size)``: a pooling layer by gate name, for models and the CLI.

    create_pool("max")                       # GatedPool2d(gate="max", kernel_size=2)
    create_pool("soft-learned", channels=32)  # one learned τ per channel
    create_pool("attention", 64, 3, 2, dim=1, padding=1)
"""

from __future__ import annotations

import torch.nn as nn

from gatepool.layers.gated_pool import GATES, GatedPool1d, GatedPool2d, GatedPool3d, GatedPoolNd

_BY_DIM: dict[int, type[GatedPoolNd]] = {1: GatedPool1d, 2: GatedPool2d, 3: GatedPool3d}


def list_pools() -> list[str]:
    """The gate names :func:`create_pool` accepts."""
    return list(GATES)


def create_pool(
    name: str,
    channels: int | None = None,
    kernel_size: int | tuple[int, ...] = 2,
    stride: int | tuple[int, ...] | None = None,
    *,
    dim: int = 2,
    **kwargs,
) -> nn.Module:
    """A ``GatedPool{dim}d`` with gate ``name`` (one of :func:`list_pools`).

    ``kwargs`` go to the layer: ``padding``, ``ceil_mode``, ``temperature``, ``return_gates``.
    """
    if name not in GATES:
        raise ValueError(f"pool name {name!r} is unknown; choose one of {list(GATES)}")
    if dim not in _BY_DIM:
        raise ValueError(f"dim must be 1, 2 or 3 (spatial dimensions), got {dim!r}")
    return _BY_DIM[dim](name, kernel_size, stride, channels=channels, **kwargs)
