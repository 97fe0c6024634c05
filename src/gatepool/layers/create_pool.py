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

from gatepool.layers.gated_pool import (
    GATES,
    AttentionGatePool1d,
    AttentionGatePool2d,
    AttentionGatePool3d,
    GatedPool1d,
    GatedPool2d,
    GatedPool3d,
    SoftPool1d,
    SoftPool2d,
    SoftPool3d,
)
from gatepool.layers.windows import IntOrTuple, check_window_args
from gatepool.utils.checks import check_int

_TORCH = {
    "max": {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d},
    "avg": {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d},
}
_TORCH_KWARGS = {  # what torch's own module takes beyond kernel_size, stride, padding
    "max": {"dilation", "return_indices", "ceil_mode"},
    "avg": {"ceil_mode", "count_include_pad", "divisor_override"},
}
_GATED = {1: GatedPool1d, 2: GatedPool2d, 3: GatedPool3d}
_SOFT = {1: SoftPool1d, 2: SoftPool2d, 3: SoftPool3d}
_ATTENTION = {1: AttentionGatePool1d, 2: AttentionGatePool2d, 3: AttentionGatePool3d}


def list_pools() -> list[str]:
    """The gate names :func:`create_pool` accepts."""
    return list(GATES)


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
    if not isinstance(gate, str) or gate not in GATES:
        raise ValueError(f"pool name {gate!r} is unknown; choose one of {list(GATES)}")
    if isinstance(dim, bool) or dim not in _GATED:
        raise ValueError(f"dim must be 1, 2 or 3 (spatial dimensions), got {dim!r}")
    check_window_args(kernel_size, stride, padding, kwargs.get("dilation", 1), dim)  # errors now, not later
    check_int(channels, "channels", optional=True)  # None: max, avg and soft need none
    dilated = kwargs.get("dilation", 1) not in (1, (1,) * dim)
    if gate in _TORCH and set(kwargs) <= _TORCH_KWARGS[gate] and not (gate == "avg" and dilated):
        return _TORCH[gate][dim](kernel_size, stride, padding, **kwargs)
    window = (kernel_size, stride, padding)
    if gate in ("soft", "soft-learned"):
        return _SOFT[dim](*window, learn_temperature=gate == "soft-learned", channels=channels, **kwargs)
    if gate == "attention":
        return _ATTENTION[dim](*window, channels=channels, **kwargs)
    return _GATED[dim](*window, gate=gate, channels=channels, **kwargs)
