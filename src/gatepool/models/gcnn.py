"""Group convolutions on p4 (translations and 90° rotations) and the two nets of Cohen & Welling (2016).

A feature map on p4 is a stack of four planes, one per rotation r ∈ {0, 1, 2, 3} (quarter turns):
``(B, C, 4, H, W)``. With ρ the quarter turn of the plane and ψ a filter (a correlation, as torch's):

    lifting   Z2 → p4    [f ⋆ ψ](r, x) = Σ_y      f(y)    · (ρ^r ψ)(y − x)
    group     p4 → p4    [f ⋆ ψ](r, x) = Σ_{s,y}  f(s, y) · (ρ^r ψ)(s − r mod 4, y − x)
    pooling   p4 → Z2    max over r (invariant), then the spatial max pool of the last layer

Turning the input by ρ turns every output plane by ρ and shifts the rotation axis by one step
(``torch.roll(·, 1, dims=2)``): the layers are *equivariant*, and the max over r makes the net's logits
*invariant* to quarter turns — exactly, up to float rounding, on a square input whose spatial steps keep
the grid's centre (odd kernels without stride, valid padding, 2×2 pools on even sizes). Both layers are
one ``conv2d`` with the four turned (and rolled) copies of the filter stacked along the output channels,
so the cost of a layer is that of a plain convolution with 4× the output (and, for p4 → p4, input) maps.

The nets are Cohen & Welling's for MNIST-rot (ICML 2016, §8.1): seven layers of valid 3×3 convolutions
(the last 4×4), batch norm and ReLU after each but the last, a 2×2 max pool after the second:

    28 → 26 → 24 → pool 12 → 10 → 8 → 6 → 4 → 1              (B, 10) logits

``z2cnn`` has ``channels`` = 20 plain maps per layer; ``p4cnn`` has 10 p4 maps (10 × 4 planes) and pools
over the rotations at the end. "The same width" is counted as Cohen & Welling did, by parameters: a
p4 → p4 layer with C maps has C·C·4·9 weights, a plain one with C' = 2C maps C'·C'·9 = 4·C·C·9, the same.
With the defaults ``z2cnn`` has 21,630 parameters, ``p4cnn`` 24,620 (its last layer holds 4× the
weights of ``z2cnn``'s for half the maps); the p4 net costs about 4× the multiply-adds.
Batch norm on p4 maps shares one mean and variance per map over its four planes (``BatchNorm3d``), so it
keeps the equivariance.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.models.registry import register_model
from gatepool.utils.checks import check_int

ROTATIONS = 4  # |p4's rotation part|: quarter turns


def _he_normal_(weight: torch.Tensor, fan_in: int) -> None:
    nn.init.normal_(weight, 0.0, (2.0 / fan_in) ** 0.5)  # Var(w) = 2/fan_in: unit-variance ReLU inputs


class P4LiftConv2d(nn.Module):
    """Z2 → p4: ``(B, C_in, H, W)`` → ``(B, C_out, 4, H', W')``, plane r the filter turned r quarter turns.

    Arguments as ``nn.Conv2d``'s (stride 1; ``padding`` an int or ``"valid"``/``"same"``).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int | str = 0,
                 bias: bool = True) -> None:
        super().__init__()
        self.in_channels = check_int(in_channels, "in_channels", 1)
        self.out_channels = check_int(out_channels, "out_channels", 1)
        self.kernel_size = check_int(kernel_size, "kernel_size", 1)
        self.padding = padding
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None  # one per map: invariant
        _he_normal_(self.weight, in_channels * kernel_size**2)

    def filters(self) -> torch.Tensor:
        """The stacked filter bank (C_out·4, C_in, k, k): output channel c·4 + r is ρ^r ψ_c."""
        turned = [torch.rot90(self.weight, r, dims=(-2, -1)) for r in range(ROTATIONS)]
        return torch.stack(turned, 1).flatten(0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, H, W) -> (B, C_out, 4, H', W')
        bias = None if self.bias is None else self.bias.repeat_interleave(ROTATIONS)
        y = F.conv2d(x, self.filters(), bias, padding=self.padding)  # (B, C_out·4, H', W')
        return y.unflatten(1, (self.out_channels, ROTATIONS))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"padding={self.padding}, bias={self.bias is not None}")


class P4Conv2d(nn.Module):
    """p4 → p4: ``(B, C_in, 4, H, W)`` → ``(B, C_out, 4, H', W')`` (see the module docstring).

    Arguments as ``nn.Conv2d``'s (stride 1); the weight is ``(C_out, C_in, 4, k, k)``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int | str = 0,
                 bias: bool = True) -> None:
        super().__init__()
        self.in_channels = check_int(in_channels, "in_channels", 1)
        self.out_channels = check_int(out_channels, "out_channels", 1)
        self.kernel_size = check_int(kernel_size, "kernel_size", 1)
        self.padding = padding
        k = kernel_size
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, ROTATIONS, k, k))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        _he_normal_(self.weight, in_channels * ROTATIONS * k * k)

    def filters(self) -> torch.Tensor:
        """The stacked bank (C_out·4, C_in·4, k, k): for output plane r, ψ's rotation axis rolled by r
        (plane s reads ψ(s − r)) and each plane turned r quarter turns."""
        turned = [torch.rot90(torch.roll(self.weight, r, dims=2), r, dims=(-2, -1)) for r in range(ROTATIONS)]
        return torch.stack(turned, 1).flatten(0, 1).flatten(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, 4, H, W) -> (B, C_out, 4, H', W')
        if x.dim() != 5 or x.shape[1:3] != (self.in_channels, ROTATIONS):
            raise ValueError(f"P4Conv2d expects x of shape (B, {self.in_channels}, {ROTATIONS}, H, W), got "
                             f"{tuple(x.shape)}")
        bias = None if self.bias is None else self.bias.repeat_interleave(ROTATIONS)
        y = F.conv2d(x.flatten(1, 2), self.filters(), bias, padding=self.padding)  # (B, C_out·4, H', W')
        return y.unflatten(1, (self.out_channels, ROTATIONS))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"padding={self.padding}, bias={self.bias is not None}")


def p4_max_pool2d(x: torch.Tensor, kernel_size: int, stride: int | None = None) -> torch.Tensor:
    """``F.max_pool2d`` on every plane of a p4 map: ``(B, C, 4, H, W)`` → ``(B, C, 4, H', W')``."""
    y = F.max_pool2d(x.flatten(1, 2), kernel_size, stride)  # (B, C·4, H', W')
    return y.unflatten(1, x.shape[1:3])


def rotation_pool(x: torch.Tensor) -> torch.Tensor:
    """Max over the rotation planes: ``(B, C, 4, H, W)`` → ``(B, C, H, W)``, invariant to the roll."""
    return x.amax(dim=2)


class CohenWellingCNN(nn.Module):
    """The seven-layer MNIST-rot net, on Z2 (``group="z2"``) or p4 (``group="p4"``); see the module doc.

    ``channels``: maps per layer (plain maps on Z2, p4 maps of four planes each on p4).
    """

    KERNELS = (3, 3, 3, 3, 3, 3, 4)  # the last layer sees the whole 4×4 map
    POOL_AFTER = 2  # a 2×2 max pool after this many layers

    def __init__(self, group: str = "p4", channels: int = 10, num_classes: int = 10,
                 in_chans: int = 1) -> None:
        super().__init__()
        if group not in ("z2", "p4"):
            raise ValueError(f"group must be 'z2' or 'p4', got {group!r}")
        self.group = group
        channels = check_int(channels, "channels", 1)
        check_int(num_classes, "num_classes", 1)
        check_int(in_chans, "in_chans", 1)
        widths = [in_chans] + [channels] * (len(self.KERNELS) - 1) + [num_classes]
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        for i, k in enumerate(self.KERNELS):
            last = i == len(self.KERNELS) - 1
            c_in, c_out = widths[i], widths[i + 1]
            if group == "z2":
                conv = nn.Conv2d(c_in, c_out, k, bias=last)
                _he_normal_(conv.weight, c_in * k * k)
                if last:
                    nn.init.zeros_(conv.bias)
            else:
                conv = (P4LiftConv2d if i == 0 else P4Conv2d)(c_in, c_out, k, bias=last)
            self.convs.append(conv)
            if not last:
                self.norms.append(nn.BatchNorm2d(c_out) if group == "z2" else nn.BatchNorm3d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 28, 28) -> (B, classes)
        for i, norm in enumerate(self.norms):
            x = F.relu(norm(self.convs[i](x)))  # z2: (B, C, H, W); p4: (B, C, 4, H, W)
            if i + 1 == self.POOL_AFTER:
                x = F.max_pool2d(x, 2) if self.group == "z2" else p4_max_pool2d(x, 2)
        x = self.convs[-1](x)  # z2: (B, classes, 1, 1); p4: (B, classes, 4, 1, 1)
        if self.group == "p4":
            x = rotation_pool(x)  # (B, classes, 1, 1)
        return x.amax(dim=(-2, -1))  # (B, classes): 1×1 on 28×28 inputs, a global max on larger ones


@register_model("z2cnn")
def z2cnn(channels: int = 20, num_classes: int = 10, in_chans: int = 1) -> CohenWellingCNN:
    """Cohen & Welling's plain CNN for MNIST-rot: 20 maps per layer, 21,630 parameters."""
    return CohenWellingCNN("z2", channels, num_classes, in_chans)


@register_model("p4cnn")
def p4cnn(channels: int = 10, num_classes: int = 10, in_chans: int = 1) -> CohenWellingCNN:
    """Cohen & Welling's P4CNN: 10 p4 maps per layer (as many weights as 20 plain maps), 24,620
    parameters; its logits are invariant to quarter turns of the input."""
    return CohenWellingCNN("p4", channels, num_classes, in_chans)
