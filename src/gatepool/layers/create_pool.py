"""``create_pool(gate, kernel_size, stride, padding)``: a pooling layer by gate name, in timm's order.

    create_pool("max", 2)                           # nn.MaxPool2d(2): torch's own kernel
    create_pool("avg", 3, 2, 1, dim=1)              # nn.AvgPool1d(3, 2, 1)
    create_pool("soft-learned", 2, channels=32)     # SoftPool2d(2, learn_temperature=True, channels=32)
    create_pool("attention", 3, 2, 1, channels=64)  # AttentionGatePool2d(3, 2, 1, channels=64)

As timm's ``create_pool2d(pool_type, kernel_size, stride=None, **kwargs)``, the name comes first and the
window arguments follow in torch's order. ``"max"`` and ``"avg"`` give torch's ``nn.MaxPool{dim}d`` /
``nn.AvgPool{dim}d`` (their kernels are the fast ones), unless asked for what those lack
(``return_weights``, or ``dilation`` for avg): then ``GatedPool{dim}d`` with that gate, which equals torch's
wherever both apply. ``channels`` is the width of the layer's input: required by the gates with weights,
ignored by torch's pools.
"""

from __future__ import annotations

import torch.nn as nn

from gatepool.layers import gate_table, gated_pool
from gatepool.layers.windows import IntOrTuple, check_window_args
from gatepool.utils.checks import check_int


def list_pools() -> list[str]:
    """The gate names :func:`create_pool` accepts."""
    return list(gate_table.names())


def create_pool(
    gate: str,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    *,
    dim: int = 2,
    channels: int | None = None,
    **kwargs,
) -> nn.Module:
    """A pooling layer with gate ``gate`` (one of :func:`list_pools`) in ``dim`` spatial dimensions.

    ``kwargs`` go to the layer: ``dilation``, ``ceil_mode``, ``return_indices`` (max),
    ``count_include_pad`` (avg), ``temperature`` (soft, soft-learned, attention), ``return_weights``.
    """
    if not isinstance(gate, str) or gate not in gate_table.names():
        raise ValueError(f"pool name {gate!r} is unknown; choose one of {list(gate_table.names())}")
    if isinstance(dim, bool) or dim not in (1, 2, 3):
        raise ValueError(f"dim must be 1, 2 or 3 (spatial dimensions), got {dim!r}")
    check_window_args(kernel_size, stride, padding, kwargs.get("dilation", 1), dim)  # errors now, not later
    check_int(channels, "channels", optional=True)  # None: max, avg and soft need none
    row = gate_table.row(gate)
    if row.torch and set(kwargs) <= row.torch_kwargs:  # torch's module takes them all (avg: no dilation)
        return row.torch_module(dim)(kernel_size, stride, padding, **kwargs)
    layer = getattr(gated_pool, f"{row.layer}{dim}d")  # GatedPool2d, SoftPool2d, AttentionGatePool2d
    return layer._create(gate, kernel_size, stride, padding, channels=channels, **kwargs)
