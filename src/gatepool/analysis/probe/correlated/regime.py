"""The regime per position that all channels share: a sparse input's background or strokes.

On a sparse image (a digit on an empty canvas) a tensor's value at position p is, in each sample,
either the network's image of the empty background there (the receptive field of p holds no stroke)
or something else, and that holds for all channels at once. ``Field.regime`` carries it:

    masks  (S, H, W)  per sample of the input, whether the receptive field of p holds a stroke
                      (the input's own support: x > its background, measured once, :func:`measure_input`)
    bg     (C, H, W)  the tensor's value where it holds none: the modules applied to the background

so that per position x = bg with probability 1 − π (π = the masks' mean: a point mass, the same in
every sample where the receptive field is empty) and else a stroke component whose moments follow
from the state's own, m = (1 − π) bg + π m_s, E[x²] = (1 − π) bg² + π (v_s + m_s²) (:func:`split`).

The rules move it exactly (a module maps an empty receptive field to the same value in every sample):

    conv      masks: any stroke among the taps (a max over the window); bg: the conv of bg (padding 0)
    max pool  masks and bg: the max over the window (the padding never wins)
    norm      masks kept; bg through the norm's affine map at its predicted statistics
    ReLU      masks kept; bg rectified
    add       masks: either term's; bg: the sum (the two terms in the same regime at each position)

and a residual add with a regime takes the mixture's law (:func:`mixture_law`: the point mass at bg
and the stroke component as a normal), which the max pool and the norm after it carry as any law; a
ReLU of a field with a regime and no law (a conv over more than ``law.FAN_IN`` inputs dropped it) takes
its moments and its gate from the mixture (:func:`relu_mixture`): the point mass at bg passes or not
as a whole, the stroke component as a normal of its moments. Every other rule drops the regime.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.field import _DT
from gatepool.analysis.probe.correlated.normal import relu_moments_map

_MIN_SHARE = 1e-3  # a stroke share below this: the position is all background


@dataclass
class Regime:
    """Per sample whether each position's receptive field holds a stroke (``masks``, (S, H, W) bool),
    and the tensor's value where it does not (``bg``, (C, H, W))."""

    masks: torch.Tensor
    bg: torch.Tensor

    @property
    def share(self) -> torch.Tensor:
        """π (H, W): the share of the samples whose receptive field at p holds a stroke."""
        return self.masks.to(_DT).mean(0)


def of_input(batch: torch.Tensor) -> Regime:
    """The regime of a sparse input (B, C, H, W): a stroke where any channel is above its smallest
    value (the background), the background that value."""
    x = batch.detach().to("cpu", _DT)
    low = x.amin((0, 2, 3))  # (C,)
    masks = (x > low[None, :, None, None]).any(1)
    return Regime(masks, low[:, None, None].expand(x.shape[1:]).clone())


def _windows(t: torch.Tensor, kernel, stride, padding, ceil_mode: bool = False) -> torch.Tensor:
    """The max over each window (the padding never wins) of t (N, H, W)."""
    return F.max_pool2d(t[:, None], kernel, stride, padding, ceil_mode=ceil_mode)[:, 0]


def conv(r: Regime, W: torch.Tensor, bias, stride, padding) -> Regime:
    """Through a conv of weights W (Co, Ci, kh, kw) (dense), ``bias`` (Co,) or None."""
    masks = _windows(r.masks.to(_DT), W.shape[-2:], stride, padding) > 0
    bg = F.conv2d(r.bg[None], W, bias, stride, padding)[0]
    return Regime(masks, bg)


def max_pool(r: Regime, kernel, stride, padding, ceil_mode: bool = False) -> Regime:
    """Through a max pool: both the max over each window."""
    masks = _windows(r.masks.to(_DT), kernel, stride, padding, ceil_mode) > 0
    bg = _windows(r.bg, kernel, stride, padding, ceil_mode)
    return Regime(masks, bg)


def affine(r: Regime, scale: torch.Tensor, shift: torch.Tensor) -> Regime:
    """Through y = scale · x + shift (a norm at its predicted statistics; maps broadcasting to bg)."""
    return Regime(r.masks, scale * r.bg + shift)


def relu(r: Regime) -> Regime:
    return Regime(r.masks, r.bg.clamp_min(0))


def add(a: Regime | None, b: Regime | None) -> Regime | None:
    """Of a sum: a stroke where either has one, the backgrounds added; None unless both have one."""
    if a is None or b is None or a.masks.shape != b.masks.shape:
        return None
    return Regime(a.masks | b.masks, a.bg + b.bg)


def split(mean: torch.Tensor, var: torch.Tensor, r: Regime):
    """(π, m_s, v_s): the stroke share (H, W) and the stroke component's mean and variance (C, H, W),
    from the field's mean and variance and the point mass at bg of weight 1 − π."""
    pi = r.share.expand_as(mean)
    some = pi > _MIN_SHARE
    p = torch.where(some, pi, torch.ones_like(pi))
    e2 = var + mean * mean
    ms = torch.where(some, (mean - (1 - pi) * r.bg) / p, mean)
    vs = torch.where(some, (e2 - (1 - pi) * r.bg**2) / p - ms * ms, var).clamp_min(0)
    return pi, ms, vs


def relu_mixture(mean: torch.Tensor, var: torch.Tensor, r: Regime):
    """(E[ReLU x], E[ReLU(x)²], P(x > 0)) per position of the mixture (1 − π) δ_bg + π N(m_s, v_s)."""
    pi, ms, vs = split(mean, var, r)
    mu_s, e2_s, pos_s = relu_moments_map(ms, vs)
    b = r.bg.clamp_min(0)
    mu = (1 - pi) * b + pi * mu_s
    e2 = (1 - pi) * b * b + pi * e2_s
    pos = (1 - pi) * (r.bg > 0).to(_DT) + pi * pos_s
    return mu, e2, pos


def mixture_law(mean: torch.Tensor, var: torch.Tensor, r: Regime, atoms: int = 64):
    """The law per position (:class:`normal.Law`, ``atoms`` atoms on :func:`law.levels`' bins) of the
    mixture (1 − π) δ_bg + π N(m_s, v_s): a residual add's, whose two terms share the background (where
    a law of the sum of independent terms would smear the background's spike with the branch's variance).
    The normal as ``atoms`` equal masses, each its mean over its bin."""
    from gatepool.analysis.probe.correlated.law import rebin
    from gatepool.analysis.probe.correlated.normal import _pdf

    pi, ms, vs = split(mean, var, r)
    u = torch.linspace(0, 1, atoms + 1, dtype=_DT)
    z = (2**0.5) * torch.erfinv((2 * u - 1).clamp(-1 + 1e-15, 1 - 1e-15))
    dens = _pdf(z)
    dens[0] = dens[-1] = 0.0
    cond = atoms * (dens[:-1] - dens[1:])  # E[z | z in bin k] of a standard normal
    x = torch.cat([r.bg[..., None], ms[..., None] + vs.sqrt()[..., None] * cond], -1)
    w = torch.cat([(1 - pi)[..., None], (pi / atoms)[..., None].expand(*pi.shape, atoms)], -1)
    return rebin(x, w, atoms)
