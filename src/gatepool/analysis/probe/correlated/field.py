"""The state of one (C, H, W) tensor, over the batch (:class:`Field`), and the lag helpers every rule uses:

    m(c, p)      the mean at channel c, position p (a map: borders, the data's layout, MNIST's margins)
    v(c, p)      the variance there
    ρ(c, e)      the correlation at spatial lag e, for every lag of the map (2H−1, 2W−1), ρ(c, 0) = 1

    Cov(x_cp, x_c'q) = δ_cc' · √(v_cp v_cq) · ρ_c(q − p)

and, where a rule knows it, the law's shape at each position: its skewness γ₁ = κ₃/v^{3/2} and excess
kurtosis γ₂ = κ₄/v² (None: 0, a Gaussian given its mean and variance).

``T(c, e) = Σ_p Cov(x_p, x_{p+e})``, the sum over the valid pairs, is what linear rules move;
``ρ = T / Σ_p √(v_p v_{p+e})`` turns it back into the state.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch

_DT = torch.float64


@dataclass
class Field:
    """Mean map (C, H, W), variance map (C, H, W), correlation over all lags (C, 2H−1, 2W−1).

    ``yy`` (gradients only, optional): per channel Σ_{p,q} E[g_p g_q y_p y_q] with y the tensor's value,
    set by a ReLU's backward for the norm before it (:func:`groupnorm_backward`). ``pre_relu``
    (gradients only, optional): the gradient at the input of the ReLU that made this tensor, set by a
    step that knows it jointly (a max pool of a ReLU's output); the ReLU's backward then returns it.
    ``parts`` (optional): (b, law) where this tensor is b + ReLU(y), the two independent (a residual add
    whose stream is a ReLU's output) and ``law`` ReLU(y)'s law per position (:class:`normal.Law`): a
    ReLU of it then takes the skewed sum's own moments.
    ``stream_gate`` (gradients only, optional): set by that ReLU's backward, per position
    P(y > 0 | b + ReLU(y) > 0) / P(y > 0): the gate 1[y > 0] of the stream's ReLU is not independent of
    this one, 1[b + ReLU(y) > 0]; the stream's ReLU scales the gradient it passes by it.
    ``components`` (the input only, optional): (mix (C, r), z) with x − m = mix (z − m_z) at every
    position and z's r channels uncorrelated (:func:`measure_input`): a conv on x folds mix into its
    weights and takes z, where the per-channel state of x would drop the channels' covariance.
    ``skew``, ``kurt`` (values only, optional): the standardized third and fourth cumulants per position
    (C, H, W), γ₁ = κ₃/v^{3/2} and the excess γ₂ = κ₄/v²; None is 0, a Gaussian. A pointwise rule
    sets them (the moments of f under its input's law), a conv sums them (κ of a weighted sum of
    independent taps: Σ w³ κ₃, Σ w⁴ κ₄), a norm's affine map keeps them (γ₁'s sign flipped with γ's),
    and the pointwise rules read them (the Gram–Charlier density, :mod:`pointwise`); every other rule
    drops them. A depthwise conv sums nine rectified inputs with one channel's weights: its output is
    skewed (γ₁ ≈ ±0.5), and the activation after its norm is not that of a Gaussian.
    ``joint`` (values only, optional): {lag e: (k21, k22, k31)} maps (C, H, W), the standardized joint
    cumulants of the pair (P, P + e) where a depthwise conv's outputs share skewed inputs; a norm's
    affine map keeps them, the activation after it reads them (:mod:`joint`); every other rule drops them.
    ``law`` (optional): the law per position where it is not normal (:class:`normal.Law` atoms
    (C, H, W, K)), the positions joined by a Gaussian copula of this stencil (:mod:`law`).
    ``copula`` (values only, optional): the joint law of the pairs (P, P + Δ) at a max pool's neighbour
    lags (:class:`copula.Copula`, beside ``law``): a norm's affine map keeps it, a cat stacks it, the ReLU
    after reads it (:mod:`copula`); every other rule drops it.
    ``regime`` (values only, optional): per sample of the input whether each position's receptive field
    holds a stroke, and the tensor's value where it holds none (:class:`regime.Regime`): a sparse
    input's background or strokes, shared by all channels (:mod:`regime`).
    ``dependence`` (gradients only, optional): (β₁, β₂, r₁, r₂), maps (C, H, W), how the gradient
    depends on the tensor's own value x at its position, ξ = (x − m)/√v:
    E[g² | x] = E[g²] (1 + β₁ He₁(ξ) + β₂ He₂(ξ)); and where g = f'(x) G (a pointwise rule's input, G
    independent of x) the factor's own E[f'(x) | ξ] ∝ 1 + r₁ He₁(ξ) + r₂ He₂(ξ) (r None elsewhere).
    A pointwise rule sets it, a norm's affine map keeps it (β₁, r₁'s sign γ's), a depthwise conv turns
    its output's into its input's (one input moves its few outputs' gates), the pointwise rule whose
    output this is reads it; every other rule drops it (:mod:`pointwise`, :mod:`conv`).
    ``coupling`` (gradients only, optional): the gradient's first-order response to the tensor's own value,
    g = g⁰ + Λ (x − m), through dense 1 × 1 convs (:class:`coupling.Coupling`): an activation sets it, norms,
    1 × 1 convs, stochastic depth and the sum of two gradients carry it, squeeze-and-excitation's gate reads
    it for Σ_p g_p x_p (:mod:`coupling`); every other rule drops it.
    ``weight`` (gradients only, optional): (S, H, W) per sample of the input (of a field with a regime,
    :mod:`regime`) the gradient's share of its channels' mean E[g²] at each position (mean over the samples
    1; None: uniform): a ReLU with a regime reads it for its gate (a gradient larger where the gate is
    open) and sets it, convs, max pools, norms, adds and the sum of two gradients carry it; every other
    rule drops it.
    ``cross`` (gradients only, optional): (v, T) maps (C, H, W) and (C, 2H−1, 2W−1), a signed term of the
    covariance of the sum of this gradient and its tensor's other gradients, its variances and lag sums:
    a residual add's gradient at its stream carries its cross term with the branch's gradient there
    (:mod:`branch_gain`), Y + Yᵀ, which is negative where the two cancel and so no covariance on its own;
    the sum of two gradients adds it (:func:`add_grads`); every other rule drops it.
    ``chan``, ``chan_dc`` (values only, optional): (C, C) the channels' correlation at lag 0, pooled over
    the positions, and that of their sums over the map (:mod:`channels`; None: uncorrelated): a conv and
    a Linear set them and read them for their outputs' variances per channel, norms, activations, pools,
    gates, adds and scales carry them; every other rule drops them.
    ``made`` (values only, optional): the conv of another field this one is, and the activation after it
    (:class:`channels.Made`): its channels' covariance at the lags a pool's window or a conv's taps span,
    and that of fields made from the same source, stacked by a cat (SqueezeNet's Fire), follow from the
    source's. A conv sets it, an activation adds its coefficients, a scale scales it, an add of a constant
    keeps it, a cat stacks it, pools and convs read it; a rule that makes a new variance map leaves it
    behind (:func:`channels.made_of`).
    ``centred`` (gradients only, optional): (C,) the part of the per-sample spatial mean's E[Ḡ²] whose
    mean over the batch is zero (:mod:`centred`): a BatchNorm's backward sets it, convs, activations,
    gates and the sum of two gradients carry it, the next BatchNorm reads it; every other rule drops it.
    """

    mean: torch.Tensor
    var: torch.Tensor
    corr: torch.Tensor
    yy: torch.Tensor | None = field(default=None, repr=False)
    pre_relu: Field | None = field(default=None, repr=False)
    parts: tuple[Field, object] | None = field(default=None, repr=False)
    stream_gate: torch.Tensor | None = field(default=None, repr=False)
    components: tuple[torch.Tensor, Field] | None = field(default=None, repr=False)
    skew: torch.Tensor | None = field(default=None, repr=False)
    kurt: torch.Tensor | None = field(default=None, repr=False)
    law: object | None = field(default=None, repr=False)
    dependence: tuple | None = field(default=None, repr=False)
    joint: dict | None = field(default=None, repr=False)
    regime: object | None = field(default=None, repr=False)
    copula: object | None = field(default=None, repr=False)
    coupling: object | None = field(default=None, repr=False)
    weight: torch.Tensor | None = field(default=None, repr=False)
    cross: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    chan: torch.Tensor | None = field(default=None, repr=False)
    chan_dc: torch.Tensor | None = field(default=None, repr=False)
    made: object | None = field(default=None, repr=False)
    centred: torch.Tensor | None = field(default=None, repr=False)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.mean.shape)  # type: ignore[return-value]

    def lag_sums(self) -> torch.Tensor:
        """T(c, e) = Σ_p Cov(x_p, x_{p+e}) over the valid pairs: ρ · Σ_p √(v_p v_{p+e})."""
        s = self.var.clamp_min(0).sqrt()
        return self.corr * xcorr(s, s)

    def moments(self) -> dict:
        """Pooled over channels and positions: mean, Var (E[x²] − mean²), E[x²]."""
        mean = float(self.mean.mean())
        e2 = float((self.var + self.mean**2).mean())
        return {"mean": mean, "var": max(e2 - mean * mean, 0.0), "e2": e2}


class Deferred:
    """``make()``'s value, made when one of its attributes is first read: a member of the state that a
    rule hands on at a cost that only a later rule's reading repays (a max pool's law and its
    neighbours' joint law, drawn again then: the draws are the same, from a fixed seed)."""

    def __init__(self, make) -> None:
        self._make, self._value = make, None

    def __getattr__(self, name: str):  # only for the names the value has: made on the first
        if self._make is not None:
            self._value, self._make = self._make(), None
        return getattr(self._value, name)


def _fast_len(n: int) -> int:
    """The smallest 2·3·5-smooth length ≥ n (the FFT is several times slower on a prime such as 31)."""
    m = n
    while True:
        k = m
        for p in (2, 3, 5):
            while k % p == 0:
                k //= p
        if k == 1:
            return m
        m += 1


@functools.lru_cache(maxsize=64)
def _lag_fft(H: int, W: int):
    """The FFT shape (N₁, N₂) ≥ (2H−1, 2W−1) for the lags of an H×W map, and the phase
    e^{−2πi (k₁(H−1)/N₁ + k₂(W−1)/N₂)} (N₁, N₂/2 + 1) that turns a real map's spectrum, conjugated,
    into the spectrum of the map flipped (f(H−1−q))."""
    N1, N2 = _fast_len(2 * H - 1), _fast_len(2 * W - 1)
    k1 = torch.arange(N1, dtype=_DT)[:, None] * ((H - 1) / N1)
    k2 = torch.arange(N2 // 2 + 1, dtype=_DT)[None, :] * ((W - 1) / N2)
    angle = -2 * math.pi * (k1 + k2)
    return (N1, N2), torch.polar(torch.ones_like(angle), angle)


def spectra(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The spectra of maps f (..., H, W) and of f flipped, on :func:`_lag_fft`'s shape: their product
    with another map's spectrum, through :func:`lags_of`, is the cross-correlation at every lag."""
    shape, phase = _lag_fft(*f.shape[-2:])
    F = torch.fft.rfft2(f, s=shape)
    return F, phase * F.conj()


def lags_of(X: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """The inverse FFT of a product of spectra (:func:`spectra`) of H×W maps: (..., 2H−1, 2W−1)."""
    shape, _ = _lag_fft(H, W)
    return torch.fft.irfft2(X, s=shape)[..., : 2 * H - 1, : 2 * W - 1]


def xcorr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., 2H−1, 2W−1): ``out[..., H−1+e_h, W−1+e_w] = Σ_q a(q) b(q+e)`` over q, q+e inside the map.

    The linear convolution of b with a flipped, by FFTs of at least 2H−1 (no wrap-around): its outputs
    come out in that (centred) order."""
    H, W = a.shape[-2:]
    Fa, Fa_flip = spectra(a)
    Fb = Fa if b is a else torch.fft.rfft2(b, s=_lag_fft(H, W)[0])
    return lags_of(Fa_flip * Fb, H, W)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den where den is not ~0 (relative to its largest value), else 0; clamped to [−1, 1]."""
    big = den.flatten(-2).amax(-1)[..., None, None].clamp_min(1e-300)
    ok = den > 1e-9 * big
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(den)).clamp(
        -1, 1
    )


def _field_from_sums(mean: torch.Tensor, var: torch.Tensor, T: torch.Tensor, yy=None) -> Field:
    """The state from a mean map, a variance map and the lag sums T (ρ(0) = 1 exactly)."""
    var = var.clamp_min(0)
    s = var.sqrt()
    corr = _ratio(T, xcorr(s, s))
    H, W = var.shape[-2:]
    corr[:, H - 1, W - 1] = 1.0
    return Field(mean, var, corr, yy)


def neighbour_corr(f: Field, lag: int) -> float:
    """Correlation at ``lag`` positions along H and along W (their mean), pooled over channels:
    Σ_c T_c(e) / Σ_c Σ_p √(v_p v_{p+e})."""
    C, H, W = f.shape
    if lag >= max(H, W):
        return math.nan
    s = f.var.clamp_min(0).sqrt()
    G = xcorr(s, s)
    T = f.corr * G
    out = []
    for eh, ew in ((lag, 0), (0, lag)):
        if eh < H and ew < W:
            g = float(G[:, H - 1 + eh, W - 1 + ew].sum())
            out.append(float(T[:, H - 1 + eh, W - 1 + ew].sum()) / g if g > 0 else math.nan)
    return float(np.mean(out))


def _at_lag(corr: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """ρ(c, d) (C,), 0 beyond the map."""
    H, W = (corr.shape[-2] + 1) // 2, (corr.shape[-1] + 1) // 2
    if abs(dh) > H - 1 or abs(dw) > W - 1:
        return torch.zeros(corr.shape[0], dtype=corr.dtype)
    return corr[:, H - 1 + dh, W - 1 + dw]


def _valid(f: torch.Tensor, dh: int, dw: int):
    """(f(p), f(p + d)) over the positions p with both inside: two (..., H−|dh|, W−|dw|) views."""
    H, W = f.shape[-2:]
    a = f[..., max(0, -dh) : H - max(0, dh), max(0, -dw) : W - max(0, dw)]
    b = f[..., max(0, dh) : H - max(0, -dh), max(0, dw) : W - max(0, -dw)]
    return a, b


def _shifted(f: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """g(q) = f(q + d), zero outside."""
    H, W = f.shape[-2:]
    out = torch.zeros_like(f)
    h0, h1 = max(0, -dh), min(H, H - dh)
    w0, w1 = max(0, -dw), min(W, W - dw)
    if h0 < h1 and w0 < w1:
        out[..., h0:h1, w0:w1] = f[..., h0 + dh : h1 + dh, w0 + dw : w1 + dw]
    return out


def _rho_strided(corr, in_hw, out_hw, stride, ch, cw):
    """ρ(s·Δ + c) for every output lag Δ: (C, 2Ho−1, 2Wo−1), zero outside the input's lags."""
    (H, W), (Ho, Wo), (sh, sw) = in_hw, out_hw, stride
    ih = (H - 1) + sh * torch.arange(-(Ho - 1), Ho) + ch
    iw = (W - 1) + sw * torch.arange(-(Wo - 1), Wo) + cw
    okh, okw = (ih >= 0) & (ih < 2 * H - 1), (iw >= 0) & (iw < 2 * W - 1)
    out = corr[:, ih.clamp(0, 2 * H - 2)][:, :, iw.clamp(0, 2 * W - 2)]
    return out * (okh[:, None] & okw[None, :]).to(out.dtype)


def unit_noise(channels: int, size: tuple[int, int] = (1, 1)) -> Field:
    """The backward seed: ∂L/∂out ~ N(0, 1), independent over channels and positions (a (F, H, W) field:
    (F, 1, 1) for logits, the output's map where the model ends in one)."""
    H, W = size
    corr = torch.zeros((channels, 2 * H - 1, 2 * W - 1), dtype=_DT)
    corr[:, H - 1, W - 1] = 1.0
    return Field(torch.zeros((channels, H, W), dtype=_DT), torch.ones((channels, H, W), dtype=_DT), corr)
