"""An adaptive average pool whose windows are uneven, overlap or repeat: AlexNet's ``AdaptiveAvgPool2d((6,
6))`` and VGG's ``((7, 7))`` on the smaller maps of a 64 × 64 input (1 × 1 or 2 × 2: every output reads a
window, neighbouring windows share taps or are one). Output i along a side of n averages the window
[⌊i n / o⌋, ⌈(i + 1) n / o⌉) (torch's), so the pool is a linear map of the positions, y = A x, A = A_H ⊗ A_W.

forward   m_out = A m; per channel Cov_out = A Cov_in Aᵀ with Cov_in(p, q) = √(v_p v_q) ρ(q − p) (the
          whole H·W × H·W matrix, exact at every position: such pools see small maps); the variance map
          its diagonal, the lag sums T(Δ) = Σ_P Cov_out(P, P + Δ)
backward  g_in = Aᵀ g: Cov = Aᵀ Cov_g A, the same sums

Even windows (n a multiple of o) are a strided box filter: :func:`conv.box_conv` (any map size). An
``AvgPool2d`` in ceil mode or without ``count_include_pad`` is the same linear map of its own windows
(:class:`AvgPoolWindows`); at stride 1 a stencil of border-dependent weights (:mod:`stencil`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.channels import window_channels
from gatepool.analysis.probe.correlated.conv import box_conv
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.global_pool import GlobalAvgPool
from gatepool.analysis.probe.correlated.positions import covariance, from_covariance
from gatepool.analysis.probe.correlated.registry import pair, register_correlated_rule
from gatepool.analysis.probe.correlated.stencil import Stencil, pool_stencil

_MAX_POSITIONS = 1024  # the input's and the output's H·W at most: (C, H·W, H·W) covariances in float64


def windows(n: int, o: int) -> torch.Tensor:
    """(o, n): row i the mean over torch's adaptive window [⌊i n / o⌋, ⌈(i + 1) n / o⌉)."""
    A = torch.zeros((o, n), dtype=_DT)
    for i in range(o):
        a, b = (i * n) // o, -((-(i + 1) * n) // o)
        A[i, a:b] = 1.0 / (b - a)
    return A


class AdaptiveAvgPool:
    """``nn.AdaptiveAvgPool2d(output_size)`` of the field through its window matrix A = A_H ⊗ A_W."""

    def __init__(self, output_size: tuple[int, int]) -> None:
        if len(output_size) != 2 or not all(isinstance(o, int) and o >= 1 for o in output_size):
            raise ValueError(f"output_size must be two ints ≥ 1, got {output_size!r}")
        self.out = tuple(output_size)

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        if max(H * W, self.out[0] * self.out[1]) > _MAX_POSITIONS:
            raise NotImplementedError(f"adaptive pool {H}×{W} → {self.out}: at most {_MAX_POSITIONS} "
                                      f"positions a side for uneven windows")  # fmt: skip
        self.in_hw = (H, W)
        self.A = torch.kron(windows(H, self.out[0]), windows(W, self.out[1]))  # (Ho·Wo, H·W)
        mean = (x.mean.reshape(C, -1) @ self.A.T).reshape(C, *self.out)
        return from_covariance(mean, self.A @ covariance(x) @ self.A.T)

    def backward(self, g: Field) -> Field:
        C = g.shape[0]
        K = self.A.T @ covariance(g) @ self.A
        return from_covariance(torch.zeros((C, *self.in_hw), dtype=_DT), K)


def avg_windows(n: int, k: int, s: int, p: int, ceil_mode: bool, count_include_pad: bool) -> torch.Tensor:
    """(o, n): row i the weights of ``avg_pool2d``'s window i along a side of n (torch's sizes; the
    divisor the taps inside the map, or with ``count_include_pad`` the window within the padding)."""
    o = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= n + p:
        o -= 1
    A = torch.zeros((o, n), dtype=_DT)
    for i in range(o):
        a, b = i * s - p, min(i * s - p + k, n + p)
        lo, hi = max(a, 0), min(b, n)
        A[i, lo:hi] = 1.0 / ((b - a) if count_include_pad else (hi - lo))
    return A


class AvgPoolWindows(AdaptiveAvgPool):
    """``nn.AvgPool2d`` in ceil mode or without ``count_include_pad`` (timm's ResNet-D shortcut
    ``AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)``): its window matrix A = A_H ⊗ A_W."""

    def __init__(self, kernel, stride, padding, ceil_mode: bool, count_include_pad: bool) -> None:
        self.k, self.s, self.p = kernel, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        A_h, A_w = (avg_windows(n, k, s, p, self.ceil_mode, self.count_include_pad)
                    for n, k, s, p in zip((H, W), self.k, self.s, self.p))  # fmt: skip
        if max(H * W, len(A_h) * len(A_w)) > _MAX_POSITIONS:
            raise NotImplementedError(f"avg pool of a {H}×{W} map in ceil mode or without count_include_pad: "
                                      f"at most {_MAX_POSITIONS} positions")  # fmt: skip
        self.in_hw, self.A = (H, W), torch.kron(A_h, A_w)
        mean = (x.mean.reshape(C, -1) @ self.A.T).reshape(C, len(A_h), len(A_w))
        return from_covariance(mean, self.A @ covariance(x) @ self.A.T)


def _pooled_channels(x: Field, out: Field, kernel=None) -> Field:
    """``out``, an average over positions of ``x`` the same in every channel, with x's channel correlations
    (:mod:`channels`): the mean over the whole map has the correlation of x's sums (exact); an average
    over ``kernel`` windows keeps Q, and its R sums x's channels' correlations over the window's lags where
    x has them (:func:`window_channels`), else is x's R."""
    whole = out.shape[1:] == (1, 1)
    if whole:
        out.chan, out.chan_dc = x.chan_dc, x.chan_dc
        return out
    R = None if kernel is None or x.chan is None else window_channels(x, kernel)
    out.chan, out.chan_dc = (x.chan if R is None else R), x.chan_dc
    return out


@register_correlated_rule(nn.AdaptiveAvgPool2d)
class AdaptiveAvgPool2dStep:
    """AdaptiveAvgPool2d: the box filter of the window an output averages (the whole map: its closed form,
    :mod:`global_pool`); uneven, overlapping or
    repeated windows (a map smaller than the output) by their window matrix (:class:`AdaptiveAvgPool`)."""

    def __init__(self, m: nn.AdaptiveAvgPool2d) -> None:
        self.out = tuple(pair(m.output_size))

    def forward(self, x: Field):
        C, H, W = x.shape
        out = tuple(o if o is not None else n for o, n in zip(self.out, (H, W)))
        if H % out[0] or W % out[1]:
            self.conv = AdaptiveAvgPool(out)
        elif out == (1, 1):
            self.conv = GlobalAvgPool()
        else:
            k = (H // out[0], W // out[1])
            self.conv = box_conv(C, k, k, (0, 0))
            return _pooled_channels(x, self.conv.forward(x), k)
        return _pooled_channels(x, self.conv.forward(x))

    def backward(self, g):
        return self.conv.backward(g)


@register_correlated_rule(nn.AvgPool2d)
class AvgPool2dStep:
    """AvgPool2d: a box filter; in ceil mode or without count_include_pad its window matrix, at stride 1
    a stencil with border-dependent weights (:mod:`stencil`)."""

    def __init__(self, m: nn.AvgPool2d) -> None:
        if m.divisor_override:
            raise NotImplementedError("avg pool rule: no divisor_override")
        self.k = pair(m.kernel_size)
        self.s = pair(m.stride) if m.stride else self.k
        self.p = pair(m.padding)
        self.modes = (bool(m.ceil_mode), bool(m.count_include_pad))

    def forward(self, x):
        if self.modes == (False, True):
            self.conv = box_conv(x.shape[0], self.k, self.s, self.p)
        elif self.s == (1, 1):  # border windows divided by their own taps: a stencil, any map size
            self.conv = self.stencil(x)
        else:
            self.conv = AvgPoolWindows(self.k, self.s, self.p, *self.modes)
        return _pooled_channels(x, self.conv.forward(x), self.k)

    def stencil(self, x, minus_identity: bool = False) -> Stencil:
        """The stride-1 pool of ``x`` (or ``pool(x) − x``) as a :class:`stencil.Stencil`."""
        C, H, W = x.shape
        A = (avg_windows(n, k, 1, p, *self.modes) for n, k, p in zip((H, W), self.k, self.p))
        return pool_stencil(C, *A, self.k, self.p, minus_identity)

    def backward(self, g):
        return self.conv.backward(g)
