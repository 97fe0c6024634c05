"""The regime per position that all channels share: a sparse input's background or strokes.

On a sparse image (a digit on an empty canvas) a tensor's value at position p is, in each sample,
either the network's image of the empty background there (the receptive field of p holds no stroke)
or something else, and that holds for all channels at once. ``Field.regime`` carries it:

    masks  (S, H, W)  per sample of the input, whether the receptive field of p holds a stroke
                      (the input's own support: x > its background, measured once, :func:`measure_input`)
    bg     (C, H, W)  the tensor's value where it holds none: the modules applied to the background
    energy (S, H, W)  per sample the channels' mean of (x − bg)² at p (0 where the mask is off)

so that per position and sample x − bg = ρ_s (μ' + σ' z), z a standard normal per channel,
ρ_s = sqrt(e_s / E_s[e]) the sample's scale (0: the point mass at bg, where the receptive field is
empty), μ' and σ' from the state's own mean and variance: E[x] − bg = μ' E[ρ],
E[(x − bg)²] = (μ'² + σ'²) E[ρ²] (:func:`split`). A scale mixture: a receptive field at the strokes'
edge or in a sample with little ink gets a small scale, one inside the strokes a large one (the
stream's heavy tail, which one stroke normal has none of).

The rules move it (a module maps an empty receptive field to the same value in every sample; the
energy as the expectation over the weights of the deviation's square, then levelled per position to
the state's E[(x − bg)²] averaged over the channels, :func:`level`):

    conv      masks: any stroke among the taps (a max over the window); bg: the conv of bg (padding 0);
              energy Σ_t K_t e(p + t), K_t = mean_o Σ_i W_{o,i,t}²
    max pool  masks, bg and energy: the max over the window (the padding never wins)
    norm      masks kept; bg through the norm's affine map at its predicted statistics; energy times
              the channels' mean scale²
    ReLU      masks kept; bg rectified; energy per sample E[(ReLU x − ReLU bg)²] of its component
    add       masks: either term's; bg: the sum (the two terms in the same regime at each position);
              energy the sum

and a residual add with a regime takes the scale mixture's law (:func:`mixture_law`), which the max
pool and the norm after it carry as any law; a ReLU of a field with a regime and no law (a conv over
``law.FAN_IN`` inputs or more dropped it) takes its moments and its gate from the mixture
(:func:`relu_mixture`): each sample's component a normal of its scale. Every other rule drops the
regime. Without an energy (``Regime(masks, bg)``) every stroke sample has the same scale: the
mixture (1 − π) δ_bg + π N(m_s, v_s).
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
    the tensor's value where it does not (``bg``, (C, H, W)), and per sample the channels' mean squared
    deviation from bg at each position (``energy``, (S, H, W), 0 where the mask is off; None: the masks'
    two values, a stroke component of one scale)."""

    masks: torch.Tensor
    bg: torch.Tensor
    energy: torch.Tensor | None = None

    @property
    def share(self) -> torch.Tensor:
        """π (H, W): the share of the samples whose receptive field at p holds a stroke."""
        return self.masks.to(_DT).mean(0)

    def scales(self) -> torch.Tensor:
        """ρ (S, H, W): each sample's deviation scale at p relative to the samples' root mean square there,
        sqrt(e_s / mean_s e) (0 where the mask is off; E_s[ρ²] = 1 wherever a sample has a stroke)."""
        e = self.masks.to(_DT) if self.energy is None else self.energy.clamp_min(0) * self.masks
        return _unit(e).sqrt()


def of_input(batch: torch.Tensor) -> Regime:
    """The regime of a sparse input (B, C, H, W): a stroke where any channel is above its smallest
    value (the background), the background that value, the energy the channels' mean squared deviation
    from it."""
    x = batch.detach().to("cpu", _DT)
    low = x.amin((0, 2, 3))  # (C,)
    dev = x - low[None, :, None, None]
    masks = (dev > 0).any(1)
    return Regime(masks, low[:, None, None].expand(x.shape[1:]).clone(), (dev * dev).mean(1))


def _windows(t: torch.Tensor, kernel, stride, padding, ceil_mode: bool = False) -> torch.Tensor:
    """The max over each window (the padding never wins) of t (N, H, W)."""
    return F.max_pool2d(t[:, None], kernel, stride, padding, ceil_mode=ceil_mode)[:, 0]


def conv(r: Regime, W: torch.Tensor, bias, stride, padding) -> Regime:
    """Through a conv of weights W (Co, Ci, kh, kw) (dense), ``bias`` (Co,) or None. The energy: the
    expectation over the output channels of the deviation's square, Σ_t K_t e(p + t) with
    K_t = (1/Co) Σ_{o,i} W_{o,i,t}² (each input channel's squared deviation taken as their mean, e)."""
    masks = _windows(r.masks.to(_DT), W.shape[-2:], stride, padding) > 0
    bg = F.conv2d(r.bg[None], W, bias, stride, padding)[0]
    energy = None
    if r.energy is not None:
        K = (W.to(_DT) ** 2).sum(1).mean(0)  # (kh, kw)
        energy = F.conv2d(r.energy[:, None], K[None, None], None, stride, padding)[:, 0] * masks
    return Regime(masks, bg, energy)


def max_pool(r: Regime, kernel, stride, padding, ceil_mode: bool = False) -> Regime:
    """Through a max pool: masks and bg the max over each window; the energy the window's largest."""
    masks = _windows(r.masks.to(_DT), kernel, stride, padding, ceil_mode) > 0
    bg = _windows(r.bg, kernel, stride, padding, ceil_mode)
    energy = None if r.energy is None else _windows(r.energy, kernel, stride, padding, ceil_mode)
    return Regime(masks, bg, energy)


def affine(r: Regime, scale: torch.Tensor, shift: torch.Tensor) -> Regime:
    """Through y = scale · x + shift (a norm at its predicted statistics; maps broadcasting to bg); the
    energy times the channels' mean scale²."""
    energy = None if r.energy is None else r.energy * float((scale * scale).mean())
    return Regime(r.masks, scale * r.bg + shift, energy)


def relu(r: Regime, mean: torch.Tensor | None = None, var: torch.Tensor | None = None) -> Regime:
    """Through a ReLU: bg rectified; with the input's mean and variance (C, H, W), each sample's energy
    its component's E[(ReLU x − ReLU bg)²] averaged over the channels (:func:`relu_of`), else none."""
    if mean is None or r.energy is None:
        return Regime(r.masks, r.bg.clamp_min(0))
    return relu_of(mean, var, r)[3]


def add(a: Regime | None, b: Regime | None) -> Regime | None:
    """Of a sum: a stroke where either has one, the backgrounds added, the energies added (the two
    deviations uncorrelated); None unless both have one."""
    if a is None or b is None or a.masks.shape != b.masks.shape:
        return None
    energy = None if a.energy is None or b.energy is None else a.energy + b.energy
    return Regime(a.masks | b.masks, a.bg + b.bg, energy)


def level(r: Regime, mean: torch.Tensor, var: torch.Tensor) -> Regime:
    """The energy rescaled per position so that its mean over the samples is the field's own
    E[(x − bg)²] averaged over the channels (the moves give each sample's share, the state its level)."""
    if r.energy is None:
        return r
    m2 = (var + (mean - r.bg) ** 2).mean(0)
    e = r.energy * r.masks
    have = e.mean(0)
    factor = torch.where(have > 0, m2 / have.clamp_min(1e-300), torch.zeros_like(have))
    return Regime(r.masks, r.bg, e * factor)


def split(mean: torch.Tensor, var: torch.Tensor, r: Regime, rho=None, w=None):
    """(μ', σ'²) (C, H, W): per position x − bg = ρ (μ' + σ' z) in each component (z standard normal),
    from the field's mean and variance: μ' = (mean − bg) / E[ρ], σ'² = E[(x − bg)²] / E[ρ²] − μ'²
    (μ' shrunk to keep σ'² ≥ 0). ``rho``, ``w`` (K, H, W): the components' scales and weights,
    :func:`components` by default."""
    if rho is None:
        rho, w = components(r)
    e1, e2 = (w * rho).sum(0), (w * rho * rho).sum(0)
    some = e2 > _MIN_SHARE
    d = mean - r.bg
    m2 = var + d * d
    mp = torch.where(some, d / torch.where(some, e1, torch.ones_like(e1)), d)
    m2p = torch.where(some, m2 / torch.where(some, e2, torch.ones_like(e2)), m2)
    mp = mp.clamp(-m2p.sqrt(), m2p.sqrt())
    return mp, (m2p - mp * mp).clamp_min(0)


def components(r: Regime):
    """(ρ, weights) (K, H, W): the mixture's components per position, one a sample (ρ_s, 1/S) with an
    energy; without one, the point mass and the strokes' one scale (0 and 1/√π, weights 1 − π and π)."""
    if r.energy is None:
        pi = r.share
        one = torch.where(pi > 0, pi.clamp_min(1e-300).rsqrt(), torch.zeros_like(pi))
        return torch.stack([torch.zeros_like(pi), one]), torch.stack([1 - pi, pi])
    rho = r.scales()
    return rho, torch.full_like(rho, 1 / len(rho))


def _chunks(mean, var, r: Regime, size: int = 32):
    """(the components' indices, (mean, var) (n, C, H, W) of each one's N(bg + ρμ', ρ²σ'²), weights
    (n, 1, H, W))."""
    rho, w = components(r)
    mp, vp = split(mean, var, r, rho, w)
    for i in torch.arange(len(rho)).split(size):
        q = rho[i][:, None]
        yield i, (r.bg + q * mp, q * q * vp), w[i][:, None]


def relu_mixture(mean: torch.Tensor, var: torch.Tensor, r: Regime):
    """(E[ReLU x], E[ReLU(x)²], P(x > 0)) per position of the mixture over the components
    N(bg + ρ μ', ρ² σ'²) (ρ = 0: the point mass at bg)."""
    return relu_of(mean, var, r)[:3]


def relu_of(mean: torch.Tensor, var: torch.Tensor, r: Regime):
    """(E[ReLU x], E[ReLU(x)²], P(x > 0), the output's regime) in one pass over the components: the
    mixture's moments and gate per position, and with an energy each sample's
    E[(ReLU x − ReLU bg)²] averaged over the channels, its output energy."""
    b = r.bg.clamp_min(0)
    mu, e2, pos = torch.zeros_like(mean), torch.zeros_like(mean), torch.zeros_like(mean)
    energy = None if r.energy is None else torch.zeros_like(r.energy)
    for i, (m, v), w in _chunks(mean, var, r):
        a, e, c = relu_moments_map(m, v)
        mu, e2, pos = mu + (w * a).sum(0), e2 + (w * e).sum(0), pos + (w * c).sum(0)
        if energy is not None:
            energy[i] = (e - 2 * b * a + b * b).mean(1).clamp_min(0) * r.masks[i]
    return mu, e2, pos, Regime(r.masks, b, energy)


def mixture_law(mean: torch.Tensor, var: torch.Tensor, r: Regime, atoms: int = 64, groups: int = 8):
    """The law per position (:class:`normal.Law`, ``atoms`` atoms on :func:`law.levels`' bins) of the
    mixture over the samples of N(bg + ρ_s μ', ρ_s² σ'²): a residual add's, whose two terms share the
    background (where a law of the sum of independent terms would smear the background's spike with
    the branch's variance). The samples' scales sorted per position into ``groups`` equal groups, each
    its root mean square; each group's normal as 16 equal masses, each its mean over its bin."""
    from gatepool.analysis.probe.correlated.law import rebin
    from gatepool.analysis.probe.correlated.normal import _pdf

    rho = r.scales().sort(0).values
    rho = torch.stack([g.pow(2).mean(0).sqrt() for g in rho.tensor_split(groups, 0)])  # (G, H, W)
    mp, vp = split(mean, var, r, rho, torch.full_like(rho, 1 / len(rho)))
    k = 16
    u = torch.linspace(0, 1, k + 1, dtype=_DT)
    z = (2**0.5) * torch.erfinv((2 * u - 1).clamp(-1 + 1e-15, 1 - 1e-15))
    dens = _pdf(z)
    dens[0] = dens[-1] = 0.0
    cond = k * (dens[:-1] - dens[1:])  # E[z | z in bin j] of a standard normal
    q = rho.permute(1, 2, 0)[None, ..., None]  # (1, H, W, G, 1)
    x = r.bg[..., None, None] + q * (mp[..., None, None] + vp.sqrt()[..., None, None] * cond)
    x = x.flatten(-2)
    return rebin(x, torch.full_like(x, 1 / x.shape[-1]), atoms)


# The gradient's side. A gradient Field's ``weight`` (S, H, W): per sample of the input its share of the
# channels' mean E[g²] at each position (the mean over the samples 1, 0 where every sample's is 0). It
# starts uniform (None) at the head's pool and moves back as the value's energy moves forward, each
# step the expectation over the weights (its E[g²] per position the state's own):
#
#     ReLU      E[g² 1[x > 0]] = E[g²] mean_s(w_s P_s) per channel and position, P_s = P(x > 0) in
#               sample s's component (:func:`gate_weights`: the weights and the gate from the same
#               components, the law's P(x > 0) not read); the input's weights w_s mean_c P_s
#     conv      Σ_t K_t G(q − t), K_t = mean_i Σ_o W_{o,i,t}², G = w times the output's E[g²]
#     max pool  each window's G shared evenly by its taps
#     norm, add kept; the sum of two gradients of one tensor: the E[g²]-weighted mean (:func:`join`)


def _unit(G: torch.Tensor) -> torch.Tensor:
    """G (S, H, W) ≥ 0 over its mean over the samples per position (0 where that is 0)."""
    m = G.mean(0)
    return G / torch.where(m > 0, m, torch.ones_like(m))


def gate_weights(mean: torch.Tensor, var: torch.Tensor, r: Regime, w: torch.Tensor | None):
    """(the gate (C, H, W), the input's weights (S, H, W)) of a ReLU whose input (mean, var, regime ``r``
    with an energy) gets a gradient of per-sample weights ``w`` (None: uniform): E[g² 1[x > 0]] =
    E[g²] mean_s(w_s P_s) / mean_s(w_s), P_s (C, H, W) the gate of sample s's component
    N(bg + ρ_s μ', ρ_s² σ'²) (:func:`split`; 1[bg > 0] where ρ_s = 0); the gradient at the input is
    g 1[x > 0], its weights w_s mean_c P_s. Uniform weights give the mixture's P(x > 0)."""
    S = len(r.masks)
    w = torch.ones(r.masks.shape, dtype=_DT) if w is None else w
    num, pos = torch.zeros_like(mean), torch.zeros_like(mean)
    out = torch.zeros(r.masks.shape, dtype=_DT)
    for i, (m, v), _ in _chunks(mean, var, r):
        c = relu_moments_map(m, v)[2]  # (n, C, H, W): each component's gate
        num, pos = num + (w[i][:, None] * c).sum(0) / S, pos + c.sum(0) / S
        out[i] = w[i] * c.mean(1)
    wm = w.mean(0)
    gate = torch.where(wm > 0, num / torch.where(wm > 0, wm, torch.ones_like(wm)), pos)  # no weight: P
    return gate, _unit(out)


def conv_back(w: torch.Tensor, g_var: torch.Tensor, W: torch.Tensor, stride, padding, in_hw) -> torch.Tensor:
    """The weights at a conv's input (size ``in_hw``) from its output's ``w`` (S, Ho, Wo) and E[g²]
    ``g_var`` (Co, Ho, Wo): Σ_t K_t G(q − t), G = w mean_o g_var, K_t = mean_i Σ_o W_{o,i,t}²."""
    K = (W.to(_DT) ** 2).sum(0).mean(0)
    G = w * g_var.mean(0)
    k = K.shape
    pad = [n - ((o - 1) * s - 2 * p + kk) for n, o, s, p, kk in zip(in_hw, G.shape[1:], stride, padding, k)]
    out = F.conv_transpose2d(G[:, None], K[None, None], None, stride, padding, output_padding=pad)[:, 0]
    return _unit(out)


def pool_back(w: torch.Tensor, g_var: torch.Tensor, kernel, stride, padding, in_hw) -> torch.Tensor:
    """The weights at a max pool's input from its output's: each window's G = w mean_c g_var shared
    evenly by its taps (which tap wins is the pool's own gradient rule; the share is the samples')."""
    G = w * g_var.mean(0)
    K = torch.ones(kernel, dtype=_DT) / (kernel[0] * kernel[1])
    out = torch.zeros((len(w), *in_hw), dtype=_DT)
    full = F.conv_transpose2d(G[:, None], K[None, None], None, stride, padding)[:, 0]
    h, wd = min(in_hw[0], full.shape[1]), min(in_hw[1], full.shape[2])
    out[:, :h, :wd] = full[:, :h, :wd]
    return _unit(out)


def join(wa, va: torch.Tensor, wb, vb: torch.Tensor):
    """The weights of the sum of two gradients of one tensor (independent: their E[g²] add), each
    weighted by its channels' mean E[g²] per position; None where either has none."""
    if wa is None or wb is None or wa.shape != wb.shape:
        return None
    return _unit(wa * va.mean(0) + wb * vb.mean(0))
