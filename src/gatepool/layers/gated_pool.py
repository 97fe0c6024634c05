"""GatedPool1d/2d/3d: one pooling layer, six gates.

Every pooling is a gated sum over a window of values v_1 … v_n; the kinds differ only in who sets g:

    out = Σ_j g_j · v_j

    gate            g over a window                                       parameters
    "max"           hardmax(v): one-hot at the largest                      —
    "avg"           1/n (n = positions inside the input)                    —
    "soft"          softmax(v / τ), τ fixed (τ = 1 is SoftPool)             —
    "soft-learned"  softmax(v / τ_c), one τ per channel, learned            log τ  (C,), starts at log τ₀
    "attention"     softmax(s / τ), s_j = x_j · w; values v_j = V x_j       score w (1×C), value V (C×C)
    "conv"          w_{c,j}: set by position j, not by content              mixing (C, 1, *kernel_size)

For the soft gates ∂out/∂v_j = g_j (1 + (v_j − out)/τ): every input in the window gets a gradient,
where max gives it to one input only. "attention" scores each position by a learned 1×1 projection of
its channel vector x_j (one score per position, shared by the channels) and pools a learned 1×1 value
projection; it starts with V = I and w ~ N(0, 1/C), so at init it is soft pooling with a random score.
"conv" is a depthwise k×k conv with stride s: its gates are its weights, the same for every input; it
starts at w = 1/K, i.e. as average pooling, and is free to learn any position weights.

Padding: padded positions get gate 0. For "max" this is torch's −inf padding; for "avg" it is
``count_include_pad=False`` (the mean of the inputs the window covers); for "conv" padded zeros add nothing.

``return_gates=True``: ``forward`` returns ``(out, gates)``, gates ``(N, C, *out_spatial, K)``,
K = ∏ kernel_size, window positions row-major (``(C, *out_spatial, K)`` unbatched).
  "max": the one-hot hardmax (first maximum on ties, as torch);  "avg": 1/n at the covered positions;
  "soft", "soft-learned": softmax(v/τ);  "attention": the score softmax, the same for every channel;
  "conv": the weights, input-independent (every input in the window gets a gradient).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers.soft_pool import (
    IntOrTuple,
    PoolGeometry,
    check_temperature,
    check_window_args,
    compute_dtype,
    like_input_format,
    pool_geometry,
    soft_pool_tiled,
    soft_pool_unfold,
    softmax_pool_unfold,
    unfold_windows,
    window_mask,
)

GATES = ("max", "avg", "soft", "soft-learned", "attention", "conv")
GATES_WITH_WEIGHTS = ("soft-learned", "attention", "conv")
GATES_WITH_TEMPERATURE = ("soft", "soft-learned", "attention")

__all__ = ["GATES", "GatedPool1d", "GatedPool2d", "GatedPool3d", "GatedPoolNd"]

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_CONV_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


class GatedPoolNd(nn.Module):
    """Gated pooling in ``dim`` spatial dimensions (use GatedPool1d / 2d / 3d).

    Args:
        gate: one of ``"max", "avg", "soft", "soft-learned", "attention", "conv"``.
        kernel_size, stride, padding, ceil_mode: as torch's pools (stride None = kernel_size,
            0 ≤ padding ≤ kernel_size/2).
        channels: C; required by the gates with weights ("soft-learned", "attention", "conv").
        temperature: τ > 0 of the soft gates (the start value for "soft-learned"); must stay 1.0
            for "max", "avg", "conv", which have none.
        return_gates: forward returns ``(out, gates)``, gates ``(N, C, *out_spatial, K)``.
    """

    dim: int = 2

    def __init__(
        self,
        gate: str,
        kernel_size: IntOrTuple = 2,
        stride: IntOrTuple | None = None,
        padding: IntOrTuple = 0,
        ceil_mode: bool = False,
        *,
        channels: int | None = None,
        temperature: float = 1.0,
        return_gates: bool = False,
    ) -> None:
        super().__init__()
        if gate not in GATES:
            raise ValueError(f"gate={gate!r} is unknown; choose one of {list(GATES)}")
        bad_channels = isinstance(channels, bool) or not isinstance(channels, int) or channels < 1
        if channels is not None and bad_channels:
            raise ValueError(f"channels must be an int ≥ 1 (or None for max/avg/soft), got {channels!r}")
        if gate in GATES_WITH_WEIGHTS and channels is None:
            raise ValueError(f"gate={gate!r} has weights: pass channels=C (an int ≥ 1)")
        check_temperature(temperature)
        if gate not in GATES_WITH_TEMPERATURE and temperature != 1.0:
            raise ValueError(
                f"temperature applies to the gates {list(GATES_WITH_TEMPERATURE)} only; "
                f"gate={gate!r} needs temperature=1.0, got {temperature}"
            )
        d = self.dim
        self.gate = gate
        self.kernel_size, self.stride, self.padding = check_window_args(kernel_size, stride, padding, d)
        self.ceil_mode = bool(ceil_mode)
        self.channels = channels
        self.return_gates = bool(return_gates)
        self.fixed_temperature = float(temperature)
        K = math.prod(self.kernel_size)
        if gate == "soft-learned":
            self.log_temperature = nn.Parameter(torch.full((channels,), math.log(temperature)))  # log τ_c
        elif gate == "attention":
            self.score = _CONV[d](channels, 1, 1, bias=False)  # s_j = x_j · w
            self.value = _CONV[d](channels, channels, 1, bias=False)  # v_j = V x_j
            nn.init.normal_(self.score.weight, 0.0, channels**-0.5)  # w ~ N(0, 1/C): Var(s) = Var(x)
            with torch.no_grad():
                self.value.weight.copy_(torch.eye(channels).view(channels, channels, *([1] * d)))  # V = I
        elif gate == "conv":
            self.mixing = nn.Parameter(torch.full((channels, 1, *self.kernel_size), 1.0 / K))  # avg at init

    @property
    def temperature(self) -> torch.Tensor | float:
        """τ: the per-channel tensor ``exp(log τ)`` of shape (C,) for "soft-learned", else the float."""
        if self.gate == "soft-learned":
            return self.log_temperature.exp()
        return self.fixed_temperature

    def extra_repr(self) -> str:
        s = f"gate={self.gate!r}, kernel_size={self.kernel_size}, stride={self.stride}"
        s += f", padding={self.padding}"
        if self.ceil_mode:
            s += ", ceil_mode=True"
        if self.channels is not None:
            s += f", channels={self.channels}"
        if self.gate in ("soft", "attention") and self.fixed_temperature != 1.0:
            s += f", temperature={self.fixed_temperature}"
        return s

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        d = self.dim
        geo = pool_geometry(x, d, self.kernel_size, self.stride, self.padding, self.ceil_mode)
        if self.channels is not None and x.shape[-d - 1] != self.channels:
            raise ValueError(
                f"input has {x.shape[-d - 1]} channels; this pool was built for channels={self.channels}"
            )
        xb = x if geo.batched else x.unsqueeze(0)  # (N, C, *spatial)
        xc = xb.to(compute_dtype(x.dtype))
        out, gates = getattr(self, "_" + self.gate.replace("-", "_"))(xc, geo)
        out = like_input_format(out, xb).to(x.dtype)
        if not geo.batched:
            out = out.squeeze(0)
        if not self.return_gates:
            return out
        gates = gates.expand(xb.shape[0], xb.shape[1], *gates.shape[2:]).to(x.dtype)
        return out, (gates if geo.batched else gates.squeeze(0))

    # Each gate: (N, C, *spatial) in the compute dtype -> out (N, C, *out), gates (N, C|1, *out, K) or None.

    def _max(self, x: torch.Tensor, geo: PoolGeometry):
        out = _MAX_POOL[self.dim](x, geo.kernel_size, geo.stride, geo.padding, ceil_mode=geo.ceil_mode)
        if not self.return_gates:
            return out, None
        windows = unfold_windows(x.detach(), geo, fill=float("-inf"))  # (N, C, *out, K)
        hard = windows.argmax(-1)  # first maximum, as torch's max pool
        return out, F.one_hot(hard, geo.window_size).to(x.dtype)

    def _avg(self, x: torch.Tensor, geo: PoolGeometry):
        out = _AVG_POOL[self.dim](
            x, geo.kernel_size, geo.stride, geo.padding, ceil_mode=geo.ceil_mode, count_include_pad=False
        )
        if not self.return_gates:
            return out, None
        mask = window_mask(geo, x.device)
        if mask is None:
            gates = torch.full((*geo.out_size, geo.window_size), 1.0 / geo.window_size, dtype=x.dtype)
        else:
            gates = mask.to(x.dtype) / mask.sum(-1, keepdim=True)  # 1/n over the covered positions
        return out, gates.to(x.device).expand(x.shape[0], x.shape[1], *gates.shape)

    def _soft(self, x: torch.Tensor, geo: PoolGeometry, temperature: float | torch.Tensor | None = None):
        tau = self.fixed_temperature if temperature is None else temperature
        if geo.tiles and not self.return_gates:
            return soft_pool_tiled(x, geo, tau), None
        return soft_pool_unfold(x, geo, tau)

    def _soft_learned(self, x: torch.Tensor, geo: PoolGeometry):
        return self._soft(x, geo, self.temperature.to(x.dtype))  # τ = exp(log τ) > 0 by construction

    def _attention(self, x: torch.Tensor, geo: PoolGeometry):
        w_s, w_v = self.score.weight.to(x.dtype), self.value.weight.to(x.dtype)
        scores = _CONV_FN[self.dim](x, w_s)  # (N, 1, *spatial)
        if self.fixed_temperature != 1.0:
            scores = scores / self.fixed_temperature
        values = _CONV_FN[self.dim](x, w_v)  # (N, C, *spatial)
        return softmax_pool_unfold(values, scores, geo)  # gates (N, 1, *out, K)

    def _conv(self, x: torch.Tensor, geo: PoolGeometry):
        pads: list[int] = []
        for p, r in zip(reversed(geo.padding), reversed(geo.pad_right)):
            pads += [p, r]
        xp = F.pad(x, pads) if any(pads) else x  # zeros: padded positions add nothing
        w = self.mixing.to(x.dtype)  # (C, 1, *kernel_size)
        out = _CONV_FN[self.dim](xp, w, stride=geo.stride, groups=x.shape[1])
        if not self.return_gates:
            return out, None
        gates = w.reshape(1, w.shape[0], *([1] * geo.dim), geo.window_size)  # (1, C, 1…, K)
        mask = window_mask(geo, x.device)
        if mask is not None:
            gates = gates * mask
        return out, gates.expand(x.shape[0], -1, *geo.out_size, -1)


class GatedPool1d(GatedPoolNd):
    """Gated pooling over ``(N, C, L)`` or ``(C, L)``; see :class:`GatedPoolNd`."""

    dim = 1


class GatedPool2d(GatedPoolNd):
    """Gated pooling over ``(N, C, H, W)`` or ``(C, H, W)``; see :class:`GatedPoolNd`."""

    dim = 2


class GatedPool3d(GatedPoolNd):
    """Gated pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``; see :class:`GatedPoolNd`."""

    dim = 3
