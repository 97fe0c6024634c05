"""Second-order statistics with spatial correlation, and the rules that carry them through modules.

The state of one (C, H, W) tensor, over the batch (:class:`Field`):

    m(c, p)      the mean at channel c, position p (a map: borders, the data's layout, MNIST's margins)
    v(c, p)      the variance there
    ρ(c, e)      the correlation at spatial lag e, for every lag of the map (2H−1, 2W−1), ρ(c, 0) = 1

    Cov(x_cp, x_c'q) = δ_cc' · √(v_cp v_cq) · ρ_c(q − p)

ASSUMPTIONS (the approximation, stated once): the centred field is a variance envelope √v times a
stationary correlation ρ (ρ does not depend on the position); channels are uncorrelated (as in
neural-tangents: cross-channel covariance 0; the input's own channels are made so, :func:`measure_input`);
every value is Gaussian given its mean and variance where a nonlinear rule needs a distribution (but for
the two shapes carried: a max pool of a ReLU's output, the ReLU of a residual sum b + ReLU(y)).
``T(c, e) = Σ_p Cov(x_p, x_{p+e})``, the sum over the valid pairs, is what linear rules move;
``ρ = T / Σ_p √(v_p v_{p+e})`` turns it back into the state.

Rules (each from the module's actual weights; ``sΔ`` the input lag of output lag Δ at stride s):

    conv      mean  m_out = conv(m, W) + b
              var   v_out(p) = Σ_d conv(P_d, W_d)(p),  P_d(q) = √(v_q v_{q+d}) ρ(d),  W_d(u) = W(u) W(u+d)
              lags  T_out(o, Δ) = Σ_i Σ_{u,u'} W[o,i,u] W[o,i,u'] ρ_i(sΔ + u' − u) Σ_P √v(sP+u) √v(sP+sΔ+u'),
                    the output pairs whose taps both land inside the map (away from the border this is
                    Σ_i Σ_d A[o,i,d] T_i(sΔ + d), A[o,i,d] = Σ_u W[o,i,u] W[o,i,u+d]: the filter's
                    autocorrelation)
              back  v_g,in = Σ_Δ convᵀ(Q_Δ, W(u) W(u − sΔ)), the lags the same sum over tap pairs (A(−d))
              input x = mix z (``Field.components``): the weights W·mix on z's uncorrelated channels
    ReLU      per position the rectified normal; per lag Mehler's series, a = m/s,
              Cov(ReLU x_p, ReLU x_q) = Σ_{n≥1} ρⁿ/n! c_n(p) c_n(q), c_1 = sΦ(a), c_n = sφ(a)He_{n−2}(−a)
              to n = 12 (one FFT per term: every lag at once; Price's theorem is its first term), and
              where it converges slowly (|ρ| > 0.5, lags |e| ≤ ``exact_lags``) the bivariate normal
              integral E[ReLU(x_p) ReLU(x_q)] (Gauss–Legendre over x_p of the conditional rectified
              mean: the arccos kernel when the means are 0). Back: Cov(g_p, g_q) · P(x_p > 0, x_q > 0),
              P by the same series (k_n = φ(a)He_{n−1}(−a)) or the same integral.
              Of b + ReLU(y) (``Field.parts``): the skewed sum's own mean and variance (quadrature over
              y), its correlations a normal's of the sum's moments; back, the stream's gate jointly:
              E[g_y²] = E[g²] P(y > 0 | b + ReLU(y) > 0) (``Field.stream_gate``)
    max pool  per window the max of its correlated Gaussian taps (padded taps never win): mean, variance
              and w_j = P(tap j wins) from 2048 draws of the window (its n×n covariance from the stencil,
              a fixed seed), or by Clark's (1961) recursion (``method="clark"``); between windows
              Cov(M_A, M_B) = Σ w_Aj w_Bl Cov(x_j, x_l) (Stein: exact for a max and one Gaussian, first
              order for two), neighbouring windows drawn jointly. Of a ReLU's output: the draws are of
              its input, the max rectified (max ReLU = ReLU max). Back: v_g,in(q) = Σ_P w_P(q) v_g(P)
              + 2 P(q wins P and P') Cov(g_P, g_P') for overlapping windows; winners of windows that
              are not neighbours independent of each other
    BatchNorm train: µ_c, σ_c² over the positions (the variance plus the mean map's spread); eval: the
              running ones; y = γ(x − µ_c)/σ_c + β per channel. Back: γ/σ_c g (O(1/B) terms dropped)
    avg pool  a conv with the box filter (adaptive and global pools too: every position-mean pattern kept)
    GroupNorm the divisor from the predicted group variance: mean over the group of v + m², less µ̄²,
              less the variance of the sample's own group mean, (1/n²) Σ_c Σ_e T_c(e).
              Back: γ/σ · (g − mean(g) − x̂ · mean(g x̂)); over a group E[g_x²] = (E[g²] − E[m_g²] −
              E[t²]) / σ², E[m_g²] = (1/n²) Σ T_g, E[t²] = (1/n²) Σ_{p,q} E[g_p g_q x̂_p x̂_q] (from
              the ReLU after the norm where there is one: g independent of the ReLU's input), and
              1/σ² → E[1/σ_b²] ≈ (1 + Var(σ_b²)/σ̄⁴)/σ̄² for the sample's own fluctuating divisor
    add       x + f(x): the two independent (the stream–branch cross term is zero in expectation over
              the branch's zero-mean last weights: it is not carried); T and v add. Back: the same.
    linear    on (C, 1, 1) features: m_out = W m + b, v_out = W² v; back v_g,in = (W²)ᵀ v_g
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["Field", "measure_field", "measure_fields", "measure_input", "neighbour_corr", "xcorr"]

_DT = torch.float64


@dataclass
class Field:
    """Mean map (C, H, W), variance map (C, H, W), correlation over all lags (C, 2H−1, 2W−1).

    ``yy`` (gradients only, optional): per channel Σ_{p,q} E[g_p g_q y_p y_q] with y the tensor's value,
    set by a ReLU's backward for the norm before it (:func:`groupnorm_backward`). ``pre_relu``
    (gradients only, optional): the gradient at the input of the ReLU that made this tensor, set by a
    step that knows it jointly (a max pool of a ReLU's output); the ReLU's backward then returns it.
    ``parts`` (optional): (b, y) where this tensor is b + ReLU(y), the two independent (a residual add
    whose stream is a ReLU's output): a ReLU of it then takes the skewed sum's own moments.
    ``stream_gate`` (gradients only, optional): set by that ReLU's backward, per position
    P(y > 0 | b + ReLU(y) > 0) / P(y > 0): the gate 1[y > 0] of the stream's ReLU is not independent of
    this one, 1[b + ReLU(y) > 0]; the stream's ReLU scales the gradient it passes by it.
    ``components`` (the input only, optional): (mix (C, r), z) with x − m = mix (z − m_z) at every
    position and z's r channels uncorrelated (:func:`measure_input`): a conv on x folds mix into its
    weights and takes z, where the per-channel state of x would drop the channels' covariance.
    """

    mean: torch.Tensor
    var: torch.Tensor
    corr: torch.Tensor
    yy: torch.Tensor | None = field(default=None, repr=False)
    pre_relu: Field | None = field(default=None, repr=False)
    parts: tuple[Field, Field] | None = field(default=None, repr=False)
    stream_gate: torch.Tensor | None = field(default=None, repr=False)
    components: tuple[torch.Tensor, Field] | None = field(default=None, repr=False)

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


def xcorr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., 2H−1, 2W−1): ``out[..., H−1+e_h, W−1+e_w] = Σ_q a(q) b(q+e)`` over q, q+e inside the map."""
    H, W = a.shape[-2:]
    size = (2 * H - 1, 2 * W - 1)
    c = torch.fft.irfft2(torch.fft.rfft2(a, s=size).conj() * torch.fft.rfft2(b, s=size), s=size)
    return torch.roll(c, shifts=(H - 1, W - 1), dims=(-2, -1))


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


# ---------------------------------------------------------------------------------------------------
# Measurement: the input's statistics (that is the data), and a tensor's for comparison
# ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def measure_field(x: torch.Tensor, chunk: int = 64) -> Field:
    """The :class:`Field` of a batch ``x`` (B, C, H, W) (or (B, F): F channels of 1×1), over the batch.

    Mean and variance per channel and position; T(c, e) the batch mean of Σ_p x̃_p x̃_{p+e}, x̃ = x − m.
    """
    if x.dim() == 2:
        x = x[:, :, None, None]
    if x.dim() != 4:
        raise ValueError(f"x must be (B, C, H, W) or (B, F), got shape {tuple(x.shape)}")
    x = x.detach().to("cpu", _DT)
    mean = x.mean(0)
    xc = x - mean
    var = xc.pow(2).mean(0)
    T = torch.zeros((x.shape[1], 2 * x.shape[2] - 1, 2 * x.shape[3] - 1), dtype=_DT)
    for i in range(0, x.shape[0], chunk):
        part = xc[i : i + chunk]
        T += xcorr(part, part).sum(0)
    return _field_from_sums(mean, var, T / x.shape[0])


def measure_input(batch: torch.Tensor) -> Field:
    """The input's statistics: per channel and position mean and variance, the correlation at every lag,
    and the channels' own covariance as uncorrelated components (``Field.components``).

    The channels of an image are not independent (a grey digit as RGB: three copies of one channel;
    a photograph's colours: mostly one brightness). The pooled channel covariance S = E[(x − m)(x − m)ᵀ]
    (over the batch and the positions, m the mean map) = V Λ Vᵀ; the components z = Vᵀ x with Λ > 1e-9 ·
    max Λ (a copy adds none) are uncorrelated at lag 0 and x − m = V (z − m_z) where S has no other
    direction. A first conv then acts on z with the weights W·V (exact where the channels' covariance
    has the same spatial shape at every lag, as for copies). The prediction
    (:func:`~gatepool.analysis.probe.correlated_predict.predict_correlated`) starts from this and
    nothing else of the batch.
    """
    f = measure_field(batch)
    if batch.dim() != 4 or batch.shape[1] < 2:
        return f
    x = batch.detach().to("cpu", _DT)
    xc = x - x.mean(0)
    S = torch.einsum("bchw,bdhw->cd", xc, xc) / (x.shape[0] * x.shape[2] * x.shape[3])  # (C, C)
    lam, V = torch.linalg.eigh(S)
    V = V[:, lam > 1e-9 * lam.max().clamp_min(1e-300)]  # (C, r)
    return replace(f, components=(V, measure_field(torch.einsum("bchw,cr->brhw", x, V))))


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


# ---------------------------------------------------------------------------------------------------
# Normal integrals
# ---------------------------------------------------------------------------------------------------

_SQRT2 = math.sqrt(2.0)
_GL_X, _GL_W = (torch.tensor(a, dtype=_DT) for a in np.polynomial.legendre.leggauss(48))
_Z = 9.0  # the quadrature runs over z ≤ 9: the rest of the normal has mass 1e-19


def _cdf(x):
    return 0.5 * torch.erfc(-x / _SQRT2)


def _pdf(x):
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _rect_mean(mu, sd):
    """E[ReLU(y)], y ~ N(mu, sd²) (sd may be 0)."""
    sd = sd.clamp_min(1e-300)
    a = mu / sd
    return mu * _cdf(a) + sd * _pdf(a)


def relu_moments_map(m: torch.Tensor, v: torch.Tensor):
    """(E[p], E[p²], P(x > 0)) of p = ReLU(x), x ~ N(m, v), elementwise."""
    s = v.clamp_min(0).sqrt().clamp_min(1e-300)
    a = m / s
    cdf, pdf = _cdf(a), _pdf(a)
    return m * cdf + s * pdf, (m * m + v) * cdf + m * s * pdf, cdf


def relu_of_sum_map(mb, vb, my, vy):
    """(E[p], E[p²], P(p > 0), P(p > 0, y > 0)) of p = ReLU(b + ReLU(y)), b ~ N(mb, vb) and y ~ N(my, vy)
    independent, elementwise (a ResNet's block output whose stream is a ReLU's output: the sum is skewed).

    Given y the inner value is N(mb + ReLU(y), vb): each moment is the rectified normal's, averaged
    over y: its mass Φ(−my/sy) at ReLU(y) = 0, and 48-point Gauss–Legendre over y > 0 (z = (y − my)/sy
    from −my/sy to 9, as :func:`bivariate_relu`)."""
    sy = vy.clamp_min(0).sqrt()
    z0 = (-my / sy.clamp_min(1e-300)).clamp(-_Z, _Z)
    half = (_Z - z0) / 2
    z = z0[..., None] + half[..., None] * (_GL_X + 1)  # (..., n)
    w = half[..., None] * _GL_W * _pdf(z)
    inner = relu_moments_map((mb + my)[..., None] + sy[..., None] * z, vb[..., None])  # given y > 0
    out = tuple(_cdf(z0) * o + (w * i).sum(-1) for o, i in zip(relu_moments_map(mb, vb), inner))
    return (*out, (w * inner[2]).sum(-1))


def bivariate_relu(m1, s1, m2, s2, r):
    """(E[ReLU(x) ReLU(y)], P(x > 0, y > 0)) of a bivariate normal with means m, sds s, correlation r.

    Given z = (x − m1)/s1, y ~ N(m2 + s2 r z, s2² (1 − r²)): E[ReLU(y) | z] is a rectified-normal mean and
    P(y > 0 | z) a Φ; both integrate against φ(z) over z > −m1/s1 by 48-point Gauss–Legendre (smooth
    there). With zero means E[ReLU ReLU] is the arccos kernel s1 s2 (√(1−r²) + (π − arccos r) r) / 2π.
    """
    dead = (s1 <= 1e-150) | (s2 <= 1e-150)
    r = torch.where(dead, torch.zeros_like(r), r).clamp(-1.0, 1.0)
    s1c = s1.clamp_min(1e-300)
    z0 = (-m1 / s1c).clamp(-_Z, _Z)
    half = (_Z - z0) / 2
    z = z0[..., None] + half[..., None] * (_GL_X + 1)  # (..., n)
    w = half[..., None] * _GL_W * _pdf(z)
    mu2 = m2[..., None] + (s2 * r)[..., None] * z
    sd2 = (s2 * (1 - r * r).clamp_min(0).sqrt())[..., None]
    x1 = m1[..., None] + s1[..., None] * z
    e = (w * x1 * _rect_mean(mu2, sd2)).sum(-1)
    p = (w * _cdf(mu2 / sd2.clamp_min(1e-300))).sum(-1)
    return e, p


# ---------------------------------------------------------------------------------------------------
# conv (and every linear map with a kernel: avg pools, the global pool)
# ---------------------------------------------------------------------------------------------------


def _lags(kh: int, kw: int):
    return [(dh, dw) for dh in range(-(kh - 1), kh) for dw in range(-(kw - 1), kw)]


def _shifted(f: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """g(q) = f(q + d), zero outside."""
    H, W = f.shape[-2:]
    out = torch.zeros_like(f)
    h0, h1 = max(0, -dh), min(H, H - dh)
    w0, w1 = max(0, -dw), min(W, W - dw)
    if h0 < h1 and w0 < w1:
        out[..., h0:h1, w0:w1] = f[..., h0 + dh : h1 + dh, w0 + dw : w1 + dw]
    return out


def _shift_prod(W: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """W(u) W(u + d) over the kernel (zero where u + d falls outside): (..., kh, kw)."""
    return W * _shifted(W, dh, dw)


def _shift_prods(W: torch.Tensor, lags, dim: int) -> torch.Tensor:
    """:func:`_shift_prod` of (Co, Ci, kh, kw) weights at every lag, stacked along ``dim`` (0: the
    lag-major (n·Co, Ci, kh, kw), 1: (Co, n·Ci, kh, kw)), written in place (no per-lag copies)."""
    Co, Ci, kh, kw = W.shape
    out = torch.zeros((len(lags), Co, Ci, kh, kw) if dim == 0 else (Co, len(lags), Ci, kh, kw), dtype=W.dtype)
    for n, (dh, dw) in enumerate(lags):
        h0, h1, w0, w1 = max(0, -dh), min(kh, kh - dh), max(0, -dw), min(kw, kw - dw)
        if h0 < h1 and w0 < w1:
            prod = W[..., h0:h1, w0:w1] * W[..., h0 + dh : h1 + dh, w0 + dw : w1 + dw]
            (out[n] if dim == 0 else out[:, n])[..., h0:h1, w0:w1] = prod
    return out.reshape(-1, Ci, kh, kw) if dim == 0 else out.reshape(Co, -1, kh, kw)


def autocorr(W: torch.Tensor) -> torch.Tensor:
    """A[o, i, d] = Σ_u W[o,i,u] W[o,i,u+d]: (C_out, C_in, 2kh−1, 2kw−1), centre d = 0."""
    kh, kw = W.shape[-2:]
    A = torch.zeros((*W.shape[:2], 2 * kh - 1, 2 * kw - 1), dtype=W.dtype)
    for dh, dw in _lags(kh, kw):
        A[:, :, kh - 1 + dh, kw - 1 + dw] = _shift_prod(W, dh, dw).sum((-2, -1))
    return A


def _at_lag(corr: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """ρ(c, d) (C,), 0 beyond the map."""
    H, W = (corr.shape[-2] + 1) // 2, (corr.shape[-1] + 1) // 2
    if abs(dh) > H - 1 or abs(dw) > W - 1:
        return torch.zeros(corr.shape[0], dtype=corr.dtype)
    return corr[:, H - 1 + dh, W - 1 + dw]


class Conv:
    """A 2-D conv from its actual weights (dense over channel pairs; groups by zeros), zero padding."""

    def __init__(self, weight, bias, stride, padding, groups: int = 1) -> None:
        W = weight.detach().to("cpu", _DT)
        if groups > 1:  # block-diagonal dense weight
            co, ci_g = W.shape[:2]
            dense = torch.zeros((co, ci_g * groups, *W.shape[2:]), dtype=_DT)
            per = co // groups
            for g in range(groups):
                dense[g * per : (g + 1) * per, g * ci_g : (g + 1) * ci_g] = W[g * per : (g + 1) * per]
            W = dense
        self.W = W
        self.b = None if bias is None else bias.detach().to("cpu", _DT)
        self.stride, self.padding = stride, padding

    def _taps(self, f: torch.Tensor, out_hw) -> list[torch.Tensor]:
        """f(s·P + u − p) on the output grid for every tap u (zero where it falls in the padding)."""
        (kh, kw), (sh, sw), (ph, pw), (Ho, Wo) = self.W.shape[-2:], self.stride, self.padding, out_hw
        pad = F.pad(f, (pw, pw, ph, ph))
        return [
            pad[:, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw]
            for a in range(kh)
            for b in range(kw)
        ]

    def _tap_offsets(self):
        kh, kw = self.W.shape[-2:]
        return [(a, b) for a in range(kh) for b in range(kw)]

    def _tap_xcorr(self, FS, j, size, Ho, Wo):
        """Σ_P S_j(P) S_l(P + Δ) for every tap l: (k, C, 2Ho−1, 2Wo−1), from the taps' FFTs FS (k, C, …)."""
        return torch.roll(torch.fft.irfft2(FS[j].conj()[None] * FS, s=size), (Ho - 1, Wo - 1), (-2, -1))

    def forward(self, x: Field) -> Field:
        self.x = x
        if x.components is not None:  # x = mix z: the weights W·mix on z's uncorrelated channels
            mix, z = x.components
            folded = Conv(torch.einsum("oiuv,ir->oruv", self.W, mix), None, self.stride, self.padding)
            out = folded.forward(z)
            return replace(out, mean=F.conv2d(x.mean[None], self.W, self.b, self.stride, self.padding)[0])
        mean = F.conv2d(x.mean[None], self.W, self.b, self.stride, self.padding)[0]
        s = x.var.clamp_min(0).sqrt()
        H, W = x.shape[1:]
        lags = [(dh, dw) for dh, dw in _lags(*self.W.shape[-2:]) if abs(dh) < H and abs(dw) < W]  # in the map
        P = torch.cat(
            [s * _shifted(s, dh, dw) * _at_lag(x.corr, dh, dw)[:, None, None] for dh, dw in lags], 0
        )
        Wd = _shift_prods(self.W, lags, 1)  # (Co, nd·Ci, kh, kw)
        var = F.conv2d(P[None], Wd, None, self.stride, self.padding)[0].clamp_min(0)  # (nd·Ci, H, W) in
        # T_out(o, Δ) = Σ_{u,u'} Σ_i W_u W_u' ρ_i(sΔ + u' − u) Σ_P s(sP+u−p) s(sP+sΔ+u'−p): the output pairs
        # exactly (both taps inside the map), every pair of taps
        Ho, Wo = var.shape[1:]
        size = (2 * Ho - 1, 2 * Wo - 1)
        FS = torch.fft.rfft2(torch.stack(self._taps(s, (Ho, Wo))), s=size)  # (k, Ci, …)
        taps, Wf = self._tap_offsets(), self.W.flatten(2)  # Wf (Co, Ci, k)
        rho = {}
        T = torch.zeros((self.W.shape[0], *size), dtype=_DT)
        for j, (a1, b1) in enumerate(taps):
            R = []
            for a2, b2 in taps:
                off = (a2 - a1, b2 - b1)
                if off not in rho:
                    rho[off] = _rho_strided(x.corr, x.shape[1:], (Ho, Wo), self.stride, *off)
                R.append(rho[off])
            ww = (Wf[:, :, j : j + 1] * Wf).permute(2, 0, 1)  # (k, Co, Ci): W_j W_l
            T += torch.einsum("loi,lihw->ohw", ww, torch.stack(R) * self._tap_xcorr(FS, j, size, Ho, Wo))
        T[:, Ho - 1, Wo - 1] = var.sum((1, 2))
        return _field_from_sums(mean, var, T)

    def backward(self, g: Field) -> Field:
        x, (kh, kw), (sh, sw) = self.x, self.W.shape[-2:], self.stride
        H, W = x.shape[1:]
        Ho, Wo = g.shape[1:]
        sg = g.var.clamp_min(0).sqrt()
        deltas = [
            (a, b)
            for a in range(-min((kh - 1) // sh, Ho - 1), min((kh - 1) // sh, Ho - 1) + 1)
            for b in range(-min((kw - 1) // sw, Wo - 1), min((kw - 1) // sw, Wo - 1) + 1)
        ]  # the output lags two taps of one input position span, within the map
        Q = torch.cat([sg * _shifted(sg, a, b) * _at_lag(g.corr, a, b)[:, None, None] for a, b in deltas], 0)
        Wp = _shift_prods(self.W, [(-sh * a, -sw * b) for a, b in deltas], 0)  # W(u) W(u − sΔ)
        # convᵀ(Q, Wp) as one matrix product and a fold (float64 conv_transpose2d is slow on the CPU)
        cols = Wp.reshape(Wp.shape[0], -1).T @ Q.reshape(Q.shape[0], -1)  # (Ci·kh·kw, Ho·Wo)
        var = F.fold(cols[None], (H, W), (kh, kw), padding=self.padding, stride=self.stride)[0].clamp_min(0)
        # T_in(i, e) = Σ_{u,u'} Σ_o W_u W_u' Σ_Δ ρ_g(Δ) Σ_P sg(P) sg(P+Δ) M_u(P) M_u'(P+Δ), e = sΔ + u' − u,
        # M_u the output positions whose tap u lands inside the input. Taps with the same M (all but the
        # border ones) share the sum over P: one FFT product per pair of mask classes.
        masks = self._taps(torch.ones((1, H, W), dtype=_DT), (Ho, Wo))
        classes: list[torch.Tensor] = []
        of = []  # each tap's class
        for m in masks:
            c = next((i for i, k in enumerate(classes) if torch.equal(k, m)), None)
            if c is None:
                classes.append(m)
                c = len(classes) - 1
            of.append(c)
        size = (2 * Ho - 1, 2 * Wo - 1)
        FS = torch.fft.rfft2(torch.stack([sg * m for m in classes]), s=size)  # (K, Co, …)
        kk = max(kh, kw)
        big = torch.zeros((x.shape[0], 2 * H - 1 + 2 * kk, 2 * W - 1 + 2 * kk), dtype=_DT)
        taps, Wf = self._tap_offsets(), self.W.flatten(2)  # Wf (Co, Ci, k)
        members = [[j for j in range(len(taps)) if of[j] == c] for c in range(len(classes))]
        for c1, js in enumerate(members):
            Y = g.corr[None] * self._tap_xcorr(FS, c1, size, Ho, Wo)  # (K, Co, …): ρ_g Σ_P S_c1 S_c2
            for c2, ls in enumerate(members):
                ww = Wf[:, :, js, None] * Wf[:, :, None, ls]  # (Co, Ci, |c1|, |c2|): W_j W_l
                vals = torch.einsum("oijl,ohw->jlihw", ww, Y[c2])
                for a, j in enumerate(js):
                    for b, l in enumerate(ls):
                        (a1, b1), (a2, b2) = taps[j], taps[l]
                        h0, w0 = H - 1 + kk - sh * (Ho - 1) + a2 - a1, W - 1 + kk - sw * (Wo - 1) + b2 - b1
                        big[
                            :, h0 : h0 + sh * (2 * Ho - 2) + 1 : sh, w0 : w0 + sw * (2 * Wo - 2) + 1 : sw
                        ] += vals[a, b]
        T = big[:, kk : kk + 2 * H - 1, kk : kk + 2 * W - 1].clone()
        T[:, H - 1, W - 1] = var.sum((1, 2))
        return _field_from_sums(torch.zeros_like(var), var, T)


def _rho_strided(corr, in_hw, out_hw, stride, ch, cw):
    """ρ(s·Δ + c) for every output lag Δ: (C, 2Ho−1, 2Wo−1), zero outside the input's lags."""
    (H, W), (Ho, Wo), (sh, sw) = in_hw, out_hw, stride
    ih = (H - 1) + sh * torch.arange(-(Ho - 1), Ho) + ch
    iw = (W - 1) + sw * torch.arange(-(Wo - 1), Wo) + cw
    okh, okw = (ih >= 0) & (ih < 2 * H - 1), (iw >= 0) & (iw < 2 * W - 1)
    out = corr[:, ih.clamp(0, 2 * H - 2)][:, :, iw.clamp(0, 2 * W - 2)]
    return out * (okh[:, None] & okw[None, :]).to(out.dtype)


def box_conv(channels: int, kernel, stride, padding) -> Conv:
    """An average pool as a depthwise conv with the box filter 1/(kh·kw) (zero padding counted)."""
    kh, kw = kernel
    w = torch.full((channels, 1, kh, kw), 1.0 / (kh * kw), dtype=_DT)
    return Conv(w, None, stride, padding, groups=channels)


# ---------------------------------------------------------------------------------------------------
# ReLU
# ---------------------------------------------------------------------------------------------------


def _valid(f: torch.Tensor, dh: int, dw: int):
    """(f(p), f(p + d)) over the positions p with both inside: two (..., H−|dh|, W−|dw|) views."""
    H, W = f.shape[-2:]
    a = f[..., max(0, -dh) : H - max(0, dh), max(0, -dw) : W - max(0, dw)]
    b = f[..., max(0, dh) : H - max(0, -dh), max(0, dw) : W - max(0, -dw)]
    return a, b


_SERIES_ORDER = 12  # Mehler's series to ρ¹²: at |ρ| ≤ 0.5 its remainder is < 1e-6 of σ_p σ_q
_SERIES_RHO = 0.5  # above this |ρ| (within ``exact_lags``) the bivariate integral instead
_A_MAX = 38.0  # |m/s| beyond this: φ(a) = 0 in float64 (and a dead position, s = 0, gets ±this)


def _hermite_maps(a: torch.Tensor, order: int) -> list[torch.Tensor]:
    """[He_0(−a), …, He_order(−a)]: the probabilists' Hermite polynomials, He_{k+1} = x He_k − k He_{k−1}."""
    x = -a
    out = [torch.ones_like(a), x]
    for k in range(1, order):
        out.append(x * out[k] - k * out[k - 1])
    return out[: order + 1]


def relu_series_maps(m: torch.Tensor, s: torch.Tensor, order: int = _SERIES_ORDER):
    """Mehler's coefficients of ReLU(m + s z) and of 1[m + s z > 0], z ~ N(0, 1), per position:

        Cov(ReLU(x_p), ReLU(x_q)) = Σ_{n≥1} ρⁿ/n! c_n(p) c_n(q),  c_1 = s Φ(a), c_n = s φ(a) He_{n−2}(−a)
        P(x_p > 0, x_q > 0) = Φ(a_p) Φ(a_q) + Σ_{n≥1} ρⁿ/n! k_n(p) k_n(q),  k_n = φ(a) He_{n−1}(−a)

    (a = m/s; E[f⁽ⁿ⁾(z)] of each function, Mehler's expansion of the bivariate normal). Returns the
    lists c (n = 1…order) and k (n = 1…order), each of maps like ``m``. A dead position (s = 0) has
    c = k = 0."""
    alive = s > 0
    a = torch.where(alive, m / torch.where(alive, s, torch.ones_like(s)), torch.sign(m) * _A_MAX)
    a = a.clamp(-_A_MAX, _A_MAX)
    phi = _pdf(a) * alive
    he = _hermite_maps(a, order)
    c = [s * _cdf(a)] + [s * phi * he[n - 2] for n in range(2, order + 1)]
    k = [phi * he[n - 1] for n in range(1, order + 1)]
    return c, k


def _series_lag_sums(corr: torch.Tensor, maps: list[torch.Tensor], weight: torch.Tensor | None = None):
    """Σ_n ρ(e)ⁿ/n! Σ_p f_n(p) f_n(p+e) for every lag e (one FFT per term), f_n = weight · maps[n−1]."""
    T = torch.zeros_like(corr)
    rn = torch.ones_like(corr)
    for n, f in enumerate(maps, start=1):
        rn = rn * corr / n
        f = f if weight is None else f * weight
        T += rn * xcorr(f, f)
    return T


class ReLU:
    """ReLU of the Gaussian field: per position the rectified normal, per lag Mehler's series (to ρ¹²),
    and the bivariate integral where the series converges slowly (|ρ| > 0.5 within ``exact_lags``)."""

    def __init__(self, exact_lags: int = 4) -> None:
        self.R = exact_lags

    def _half_lags(self, H, W):
        R = self.R
        return [
            (a, b)
            for a in range(0, min(R, H - 1) + 1)
            for b in range(-min(R, W - 1), min(R, W - 1) + 1)
            if a > 0 or b >= 0
        ]

    def forward(self, x: Field) -> Field:
        self.x, self.stream_gate = x, None
        C, H, W = x.shape
        s = x.var.clamp_min(0).sqrt()
        mu, e2, pos = relu_moments_map(x.mean, x.var)
        var = (e2 - mu * mu).clamp_min(0)
        self.mu, self.pos, self.s = mu, pos, s
        self.c, self.k = relu_series_maps(x.mean, s)
        T = _series_lag_sums(x.corr, self.c)
        # the lags where the series is slow: the bivariate integral, on the channels that need it
        self.pairs = {}  # lag: (channels, E[ReLU ReLU], P(both > 0)) over the valid pairs
        for dh, dw in self._half_lags(H, W):
            rho = _at_lag(x.corr, dh, dw)
            if dh == 0 and dw == 0:
                idx, e, p = torch.arange(C), e2, pos
            else:
                idx = torch.nonzero(rho.abs() > _SERIES_RHO).flatten()
                if not len(idx):
                    continue
                (m1, m2), (s1, s2) = _valid(x.mean[idx], dh, dw), _valid(s[idx], dh, dw)
                e, p = bivariate_relu(m1, s1, m2, s2, rho[idx][:, None, None].expand_as(m1))
            self.pairs[(dh, dw)] = (idx, e, p)
            u1, u2 = _valid(mu[idx], dh, dw)
            t = (e - u1 * u2).sum((1, 2))
            T[idx, H - 1 + dh, W - 1 + dw] = t
            T[idx, H - 1 - dh, W - 1 - dw] = t
        if x.parts is not None:  # b + ReLU(y): the skewed sum's own moments; the correlations as above
            b, y = x.parts
            mu, e2, pos, both = relu_of_sum_map(b.mean, b.var, y.mean, y.var)
            sd_gauss, var = var.sqrt(), (e2 - mu * mu).clamp_min(0)
            T = _ratio(T, xcorr(sd_gauss, sd_gauss)) * xcorr(var.sqrt(), var.sqrt())
            self.mu, self.pos = mu, pos
            p_y = relu_moments_map(y.mean, y.var)[2]
            self.stream_gate = torch.where(
                pos * p_y > 0, both / (pos * p_y).clamp_min(1e-300), torch.ones_like(pos)
            )
        return _field_from_sums(mu, var, T)

    def backward(self, g: Field | list[Field]) -> Field:
        """The gradient at the input from the output's (or from its parts, each through the gate on its
        own: a part that knows the gate jointly brings ``pre_relu``). After an add b + ReLU(y) the
        result carries ``stream_gate`` (see :class:`Field`): E[g_y²] = E[g_z²] P(y > 0 | z > 0),
        z = b + ReLU(y), by the skewed sum's quadrature, where independent gates give E[g_z²] P(y > 0)."""
        gs = g if isinstance(g, list) else [g]
        out = functools.reduce(add_grads, [self._backward(p) for p in gs])
        if self.stream_gate is not None:
            out = replace(out, stream_gate=self.stream_gate)
        return out

    def _backward(self, g: Field) -> Field:
        if g.pre_relu is not None:  # the step after knew the gradient through this ReLU
            return g.pre_relu
        if g.stream_gate is not None:  # through the ReLU after an add, whose gate is not independent
            out = self._backward(replace(g, stream_gate=None))
            var = out.var * g.stream_gate
            return _field_from_sums(out.mean, var, out.corr * xcorr(var.sqrt(), var.sqrt()), out.yy)
        x, (H, W) = self.x, g.shape[1:]
        sg = g.var.clamp_min(0).sqrt()
        var = g.var * self.pos
        # Cov(g_p, g_q) P(x_p > 0, x_q > 0) and Cov(g_p, g_q) E[ReLU(x_p) ReLU(x_q)], by the series
        T = g.corr * (xcorr(sg * self.pos, sg * self.pos) + _series_lag_sums(x.corr, self.k, sg))
        YY = g.corr * (xcorr(sg * self.mu, sg * self.mu) + _series_lag_sums(x.corr, self.c, sg))
        for (dh, dw), (idx, e, p) in self.pairs.items():
            a, b = _valid(sg[idx], dh, dw)
            cg = a * b * _at_lag(g.corr, dh, dw)[idx, None, None]
            t, yy = (cg * p).sum((1, 2)), (cg * e).sum((1, 2))
            for sgn in (1, -1):
                T[idx, H - 1 + sgn * dh, W - 1 + sgn * dw] = t
                YY[idx, H - 1 + sgn * dh, W - 1 + sgn * dw] = yy
        return _field_from_sums(torch.zeros_like(var), var, T, yy=YY.sum((1, 2)))


# ---------------------------------------------------------------------------------------------------
# Max pool: Clark's recursion
# ---------------------------------------------------------------------------------------------------


def clark_max(mu1, v1, mu2, v2, c):
    """(E, Var, Φ(α), Φ(−α)) of max(x1, x2), jointly normal with Cov c (Clark 1961, exact for two)."""
    a = (v1 + v2 - 2 * c).clamp_min(0).sqrt().clamp_min(1e-150)
    alpha = (mu1 - mu2) / a
    p, q, d = _cdf(alpha), _cdf(-alpha), _pdf(alpha)
    m = mu1 * p + mu2 * q + a * d
    e2 = (v1 + mu1 * mu1) * p + (v2 + mu2 * mu2) * q + (mu1 + mu2) * a * d
    return m, (e2 - m * m).clamp_min(0), p, q


@functools.lru_cache(maxsize=8)
def _base_draws(samples: int, dim: int, seed: int, blocks: int = 32) -> torch.Tensor:
    """(blocks, dim, samples) float32 standard normal draws from a fixed seed, each block antithetic
    (z, −z) and whitened: its sample mean is exactly 0 and its sample covariance exactly I, so a
    window's taps have exactly their predicted mean and covariance. Window i uses block i mod ``blocks``
    (the blocks' errors in a nonlinear statistic such as the max average out over the windows)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn((blocks, samples // 2, dim), generator=g, dtype=_DT)
    z = torch.cat([z, -z], 1)
    L = torch.linalg.cholesky(z.transpose(1, 2) @ z / z.shape[1])
    return torch.linalg.solve_triangular(L, z.transpose(1, 2), upper=False).float().contiguous()


def _draw_windows(mu: torch.Tensor, S: torch.Tensor, base: torch.Tensor, stats) -> list[torch.Tensor]:
    """Per window the mean over draws x ~ N(mu, S) of each statistic ``stats(x, mu)`` returns.

    mu (w, d), S (w, d, d) float64; ``base`` from :func:`_base_draws`, window i uses block i mod blocks;
    ``stats`` maps float32 draws (n, d, samples) (float32: their own sampling error is far above the
    rounding) and the windows' means (n, d) to (n, …) tensors, each a mean over the samples.
    """
    lam, vec = torch.linalg.eigh(S)
    L = (vec * lam.clamp_min(0).sqrt()[:, None, :]).float()  # S = L Lᵀ, also where S is singular
    mu_f = mu.float()
    chunks = []
    for i in range(0, len(mu), 256):
        j = torch.arange(i, min(i + 256, len(mu)))
        x = torch.baddbmm(mu_f[j, :, None], L[j], base[j % base.shape[0]])  # (n, d, samples)
        chunks.append([r.to(_DT) for r in stats(x, mu[j])])
    return [torch.cat(t) for t in zip(*chunks)]


def _first_tap(mu: torch.Tensor) -> torch.Tensor:
    """(n,) the first tap of each window (n, d) that is not padding: torch's pick among equal taps."""
    return (mu > _PAD / 2).to(torch.int8).argmax(-1)


_PAD = -1e30  # the mean of a padded tap (variance 0): it never wins, as torch pads a max pool with −∞


def _wins(x: torch.Tensor, top: torch.Tensor, first: torch.Tensor | None):
    """The tap (w, samples) that wins each draw ``x`` (w, n, samples), as torch's max pool picks it (the
    first maximum), and the tap through which the gradient reaches the pre-activation (n: none).

    ``first`` None: the max of x itself, the two are one. ``first`` (w,) the first tap that is not
    padding, and x the pre-activations of ReLU outputs: the pool sees ReLU(x), so where the top is ≤ 0
    every tap is 0 and torch picks ``first``; the pre-activation gets a gradient only where top > 0."""
    n = x.shape[1]
    last = torch.arange(n, 0, -1, dtype=x.dtype)[:, None]  # n … 1: the first maximum scores highest
    arg = n - (x - top[:, None]).ge_(0).mul_(last).amax(1).long()  # (w, samples)
    if first is None:
        return arg, arg
    pos = top > 0
    return torch.where(pos, arg, first[:, None].expand_as(arg)), torch.where(pos, arg, n)


def _counts(idx: torch.Tensor, bins: int) -> torch.Tensor:
    """(w, bins): the share of the samples of each row of ``idx`` (w, samples) in each bin."""
    out = torch.zeros((idx.shape[0], bins), dtype=_DT)
    return out.scatter_add_(1, idx, torch.ones_like(idx, dtype=_DT)) / idx.shape[1]


class MaxPool:
    """k×k max pool, stride s, padding p (padded taps never win), no dilation, of the Gaussian field.

    Each window's max: its mean, variance and each tap's probability of winning w_j, either by
    ``method="mc"`` (the default): ``samples`` draws of the window's taps from the predicted statistics
    (mean map, variance map, stencil: one n×n covariance per window), from a fixed seed (the prediction
    never sees the data; :func:`_base_draws`), neighbouring windows drawn together (``samples / 4``
    draws of 2n taps: their covariance and each pair of taps' probability of winning jointly); or by
    ``method="clark"``: Clark's (1961) recursion over the taps in raster order
    (exact for two taps; for four independent N(0, 1) it gives Var 0.470 where the exact value is 0.4917).
    Between windows, Cov(M_A, M_B) = Σ_{j,l} w_Aj w_Bl Cov(x_j, x_l): Cov(max(x), y) = Σ_j P(j wins)
    Cov(x_j, y) holds exactly for jointly Gaussian x, y (Stein's lemma); applied on both sides it is the
    first order in the windows' cross-covariance.

    A pool of a ReLU's output (``forward(x, pre=...)``, ``pre`` the ReLU's Gaussian input): max and ReLU
    commute, max ReLU(y_j) = ReLU(max y_j), so the draws are of y and the max is rectified after (the
    output is not the max of Gaussians of the ReLU output's moments). Stein's lemma then has
    ∂ReLU(max y)/∂y_j = 1[j wins, max > 0] (w̃_j). Backward, the gradient reaches the ReLU's output at
    the tap torch picks (the first tap of an all-zero window) and its input only through w̃; the latter
    is the gradient's ``pre_relu`` (for the ReLU's backward: the two are not independent).

    Windows that overlap (k > s): an input position winning two windows gets the sum of their
    gradients, E[g²] += 2 P(wins both) Cov(g_P, g_P'), from the jointly drawn neighbours.
    """

    def __init__(
        self, kernel, stride, padding=(0, 0), method: str = "mc", samples: int = 2048, seed: int = 0
    ) -> None:
        if method not in ("mc", "clark"):
            raise ValueError(f"method must be 'mc' or 'clark', got {method!r}")
        if any(2 * p > k for p, k in zip(padding, kernel)):
            raise ValueError(f"padding must be at most half the kernel, got {padding} for {kernel}")
        self.k, self.s, self.p = kernel, stride, padding
        self.method, self.samples, self.seed = method, samples, seed

    def _padded(self, x: Field):
        """The mean map padded with :data:`_PAD` and the sd map with 0: (C, H + 2p, W + 2p) each."""
        (ph, pw), s = self.p, x.var.clamp_min(0).sqrt()
        return F.pad(x.mean, (pw, pw, ph, ph), value=_PAD), F.pad(s, (pw, pw, ph, ph))

    def _taps(self, f: torch.Tensor, Ho, Wo):
        (kh, kw), (sh, sw) = self.k, self.s
        return [
            f[:, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw]
            for a in range(kh)
            for b in range(kw)
        ]

    def neighbours(self, Ho: int, Wo: int) -> list[tuple[int, int]]:
        """The window lags Δ (one of ±Δ) drawn jointly: every window that overlaps, and at least the
        8 nearest."""
        (kh, kw), (sh, sw) = self.k, self.s
        rh, rw = max(1, -(-(kh - 1) // sh)), max(1, -(-(kw - 1) // sw))
        return [
            (dh, dw)
            for dh in range(0, min(rh, Ho - 1) + 1)
            for dw in range(-min(rw, Wo - 1), min(rw, Wo - 1) + 1)
            if dh > 0 or dw > 0
        ]

    def _monte_carlo(self, m, cov, rect: bool):
        """Per window (mean, Var, [P(tap j wins)], [w̃_j]) from draws of N(m, cov); m (n, ...), cov
        (n, n, ...); ``rect``: the max is rectified (see the class)."""
        n, shape = len(m), m[0].shape
        mu = torch.stack(m).reshape(n, -1).T  # (windows, n)
        S = (
            torch.stack([torch.stack(row) for row in cov]).reshape(n, n, -1).permute(2, 0, 1)
        )  # (windows, n, n)

        def stats(x, mus):
            top = x.amax(1)
            w, wt = _wins(x, top, _first_tap(mus) if rect else None)
            out = (top.clamp_min(0) if rect else top).to(_DT)
            return out.mean(1), (out * out).mean(1), _counts(w, n), _counts(wt, n + 1)[:, :n]

        mean, e2, w, wt = _draw_windows(mu, S, _base_draws(self.samples, n, self.seed).float(), stats)
        var = (e2 - mean * mean).clamp_min(0)
        return (
            mean.reshape(shape),
            var.reshape(shape),
            list(w.T.reshape(n, *shape)),
            list(wt.T.reshape(n, *shape)),
        )

    def _joint(self, mp, sp, corr, dh: int, dw: int, Ho: int, Wo: int, rect: bool):
        """Windows P and P + Δ drawn together: (Σ_P Cov(M_P, M_{P+Δ}) (C,), J and J̃ (n, n, C, h, w): the
        probability that tap j wins P and tap l wins P + Δ, as torch picks them and through the
        pre-activation, :func:`_wins`) over the valid P; ``mp``, ``sp`` the padded mean and sd maps
        (:meth:`_padded`), ``corr`` the input's stencil."""
        (kh, kw), (sh, sw) = self.k, self.s
        offs = [(a, b) for a in range(kh) for b in range(kw)]
        n = len(offs)
        P = [(a, b, 0, 0) for a, b in offs] + [(a + sh * dh, b + sw * dw, dh, dw) for a, b in offs]
        m, sd = self._taps(mp, Ho, Wo), self._taps(sp, Ho, Wo)

        def view(t, j):  # tap j of window P (j < n) or of window P + Δ
            ph, pw = (max(0, -dh), max(0, -dw)) if j < n else (max(0, dh), max(0, dw))
            h, w = Ho - abs(dh), Wo - abs(dw)
            return t[j % n][:, ph : ph + h, pw : pw + w]

        mu = torch.stack([view(m, j) for j in range(2 * n)], -1)  # (C, h, w, 2n)
        sds = torch.stack([view(sd, j) for j in range(2 * n)], -1)
        rho = torch.stack(
            [
                torch.stack([_at_lag(corr, P[l][0] - P[j][0], P[l][1] - P[j][1]) for l in range(2 * n)], -1)
                for j in range(2 * n)
            ],
            -2,
        )  # (C, 2n, 2n)
        S = sds[..., :, None] * sds[..., None, :] * rho[:, None, None]
        shape = mu.shape[:3]

        def stats(xs, mus):
            (xa, xb) = xs[:, :n], xs[:, n:]
            ma, mb = xa.amax(1), xb.amax(1)
            wa, wta = _wins(xa, ma, _first_tap(mus[:, :n]) if rect else None)
            wb, wtb = _wins(xb, mb, _first_tap(mus[:, n:]) if rect else None)
            if rect:
                ma, mb = ma.clamp_min(0), mb.clamp_min(0)
            ma, mb = ma.to(_DT), mb.to(_DT)
            J = _counts(wa * n + wb, n * n).reshape(-1, n, n)  # tap j wins P and tap l wins P + Δ
            Jt = _counts(wta * (n + 1) + wtb, (n + 1) ** 2).reshape(-1, n + 1, n + 1)[:, :n, :n]
            return (ma * mb).mean(1), ma.mean(1), mb.mean(1), J, Jt

        base = _base_draws(self.samples // 4, 2 * n, self.seed + 1).float()
        ab, a, b, J, Jt = _draw_windows(mu.reshape(-1, 2 * n), S.reshape(-1, 2 * n, 2 * n), base, stats)
        cov = (ab - a * b).reshape(shape).sum((1, 2))
        J, Jt = (t.reshape(*shape, n, n).permute(3, 4, 0, 1, 2) for t in (J, Jt))
        return cov, J, Jt

    def forward(self, x: Field, pre: Field | None = None) -> Field:
        """The pool of ``x``; ``pre``: x = ReLU(pre) elementwise, the pool then draws pre (see the class)."""
        rect = pre is not None
        if rect and self.method != "mc":
            raise NotImplementedError("max pool of a ReLU's output: method 'mc' only")
        src = pre if rect else x
        self.x, self.rect = x, rect
        (kh, kw), (sh, sw), (ph, pw) = self.k, self.s, self.p
        C, H, W = x.shape
        Ho, Wo = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
        mp, sp = self._padded(src)  # (C, H + 2p, W + 2p): padded taps never win, their sd is 0
        m, sd = self._taps(mp, Ho, Wo), self._taps(sp, Ho, Wo)
        offs = [(a, b) for a in range(kh) for b in range(kw)]
        n = len(offs)

        def cov(j, l):
            (a1, b1), (a2, b2) = offs[j], offs[l]
            return sd[j] * sd[l] * _at_lag(src.corr, a2 - a1, b2 - b1)[:, None, None]

        if self.method == "mc":
            mu, var, w, wt = self._monte_carlo(m, [[cov(j, l) for l in range(n)] for j in range(n)], rect)
        else:
            mu, var = m[0], sd[0] ** 2
            w = [torch.ones_like(mu)] + [torch.zeros_like(mu) for _ in range(n - 1)]
            for l in range(1, n):
                c = sum(w[j] * cov(j, l) for j in range(l))
                mu, var, p, q = clark_max(mu, var, m[l], sd[l] ** 2, c)
                w = [wj * p for wj in w[:l]] + [q] + w[l + 1 :]
            wt = w
        self.w, self.wt, self.offs, self.out_hw = w, wt, offs, (Ho, Wo)
        # T_out(Δ) = Σ_{j,l} ρ(sΔ + l − j) Σ_P U_j(P) U_l(P + Δ),  U_j = w̃_j √v(tap j)
        U = [wt[j] * sd[j] for j in range(n)]
        T = torch.zeros((C, 2 * Ho - 1, 2 * Wo - 1), dtype=_DT)
        for j in range(n):
            for l in range(n):
                (a1, b1), (a2, b2) = offs[j], offs[l]
                rho = _rho_strided(src.corr, (H, W), (Ho, Wo), self.s, a2 - a1, b2 - b1)
                T += rho * xcorr(U[j], U[l])
        self.joint, self.joint_t = {}, {}
        if self.method == "mc":  # the neighbouring windows drawn jointly: their covariance, joint wins
            for dh, dw in self.neighbours(Ho, Wo):
                cov_ab, J, Jt = self._joint(mp, sp, src.corr, dh, dw, Ho, Wo, rect)
                self.joint[(dh, dw)], self.joint_t[(dh, dw)] = J, Jt
                T[:, Ho - 1 + dh, Wo - 1 + dw] = cov_ab
                T[:, Ho - 1 - dh, Wo - 1 - dw] = cov_ab
        T[:, Ho - 1, Wo - 1] = var.sum((1, 2))
        return _field_from_sums(mu, var, T)

    def backward(self, g: Field) -> Field:
        out = self._grad(g, self.w, self.joint)
        if self.rect:  # the gradient at the ReLU's input, through w̃ (see the class)
            out = replace(out, pre_relu=self._grad(g, self.wt, self.joint_t))
        return out

    def _grad(self, g: Field, w: list, joint: dict) -> Field:
        x, (sh, sw), (ph, pw) = self.x, self.s, self.p
        C, H, W = x.shape
        Ho, Wo = self.out_hw
        sg = g.var.clamp_min(0).sqrt()
        var = torch.zeros((C, H + 2 * ph, W + 2 * pw), dtype=_DT)  # padded: its rim gets w = 0
        for wj, (a, b) in zip(w, self.offs):
            var[:, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw] += wj * g.var
        # overlapping windows: tap j of P is tap l of P + Δ; both won: 2 P(both) Cov(g_P, g_{P+Δ})
        for (dh, dw), J in joint.items():
            a, b = _valid(sg, dh, dw)
            cg = a * b * _at_lag(g.corr, dh, dw)[:, None, None]  # (C, h, w) over the valid P
            h0, w0 = max(0, -dh), max(0, -dw)
            for j, (a1, b1) in enumerate(self.offs):
                for l, (a2, b2) in enumerate(self.offs):
                    if (a1, b1) == (a2 + sh * dh, b2 + sw * dw):
                        r0, c0 = a1 + sh * h0, b1 + sw * w0
                        rows = slice(r0, r0 + sh * (cg.shape[1] - 1) + 1, sh)
                        cols = slice(c0, c0 + sw * (cg.shape[2] - 1) + 1, sw)
                        var[:, rows, cols] += 2 * J[j, l] * cg
        var = var[:, ph : ph + H, pw : pw + W]
        # the lags below are differences of input positions: the padding shifts both taps alike
        # Σ over window pairs P ≠ P' of w_Pj w_P'l Cov(g_P, g_P'), at input lag sΔ + l − j
        kk = max(self.k)
        big = torch.zeros((C, 2 * H - 1 + 2 * kk, 2 * W - 1 + 2 * kk), dtype=_DT)
        U = [wj * sg for wj in w]
        mask = torch.ones((2 * Ho - 1, 2 * Wo - 1), dtype=_DT)
        mask[Ho - 1, Wo - 1] = 0.0
        for dh, dw in joint:  # these window pairs from their joint wins, below
            mask[Ho - 1 + dh, Wo - 1 + dw] = mask[Ho - 1 - dh, Wo - 1 - dw] = 0.0
        for j, (a1, b1) in enumerate(self.offs):
            for l, (a2, b2) in enumerate(self.offs):
                vals = xcorr(U[j], U[l]) * g.corr * mask
                for (dh, dw), J in joint.items():  # Σ_P P(j wins P, l wins P+Δ) sg(P) sg(P+Δ) ρ_g(Δ)
                    a, b = _valid(sg, dh, dw)
                    t = (J[j, l] * a * b).sum((1, 2)) * _at_lag(g.corr, dh, dw)
                    vals[:, Ho - 1 + dh, Wo - 1 + dw] += t
                    # the pair (P+Δ, P) at lag −Δ: tap l of the later window first: J[l, j] there
                    t2 = (J[l, j] * a * b).sum((1, 2)) * _at_lag(g.corr, dh, dw)
                    vals[:, Ho - 1 - dh, Wo - 1 - dw] += t2
                h0 = H - 1 + kk - sh * (Ho - 1) + (a2 - a1)
                w0 = W - 1 + kk - sw * (Wo - 1) + (b2 - b1)
                big[:, h0 : h0 + sh * (2 * Ho - 2) + 1 : sh, w0 : w0 + sw * (2 * Wo - 2) + 1 : sw] += vals
        T = big[:, kk : kk + 2 * H - 1, kk : kk + 2 * W - 1].clone()
        T[:, H - 1, W - 1] = var.sum((1, 2))
        return _field_from_sums(torch.zeros_like(var), var, T)


# ---------------------------------------------------------------------------------------------------
# GroupNorm
# ---------------------------------------------------------------------------------------------------


class GroupNorm:
    """GroupNorm(G, C) at the predicted statistics; the divisor is one per group (its expectation)."""

    def __init__(self, groups: int, weight, bias, eps: float) -> None:
        self.G = groups
        self.gamma = None if weight is None else weight.detach().to("cpu", _DT)
        self.beta = None if bias is None else bias.detach().to("cpu", _DT)
        self.eps = eps

    def _group(self, t: torch.Tensor) -> torch.Tensor:  # (C, ...) -> (G, C/G, ...)
        return t.reshape(self.G, -1, *t.shape[1:])

    def forward(self, x: Field) -> Field:
        """x − µ_g, the sample's own group mean: Cov(x_p − µ_g, x_q − µ_g) = Cov(p, q) − c_p − c_q + V,
        c_p = Cov(x_p, µ_g) = (1/n) √v_p Σ_e ρ(e) √v_{p+e},  V = Var(µ_g) = (1/n²) Σ_c Σ_e T_c(e);
        over the pairs at lag e, c_p + c_q is taken as its mean 2 b_c (b_c = Σ_e T_c(e) / (n·HW))."""
        self.x = x
        C, H, W = x.shape
        n = C // self.G * H * W
        T = x.lag_sums()
        V = self._group(T).sum((1, 2, 3)) / n**2  # (G,) Var of the sample's group mean
        Vc = V.repeat_interleave(C // self.G)[:, None, None]  # (C, 1, 1)
        s = x.var.clamp_min(0).sqrt()
        # Σ_e ρ(e) s(p+e) = (ρ ⋆ s)(p): a correlation of s with the lag kernel, by FFT
        size = (3 * H - 2, 3 * W - 2)
        conv = torch.fft.irfft2(
            torch.fft.rfft2(s, s=size) * torch.fft.rfft2(torch.flip(x.corr, (-2, -1)), s=size), s=size
        )[:, H - 1 : 2 * H - 1, W - 1 : 2 * W - 1]
        c = s * conv / n  # (C, H, W) Cov(x_p, µ_g)
        var = (x.var - 2 * c + Vc).clamp_min(0)
        b = T.sum((1, 2))[:, None, None] / (n * H * W)  # (C, 1, 1)
        N = xcorr(torch.ones((1, H, W), dtype=_DT), torch.ones((1, H, W), dtype=_DT))
        Tc = T - N * (2 * b - Vc)
        m = self._group(x.mean)
        mu = m.mean((1, 2, 3))  # (G,)
        sigma2 = self._group(var + x.mean**2).mean((1, 2, 3)) - mu * mu + self.eps
        self.sigma2 = sigma2
        # the sample's own σ_b² fluctuates: E[1/σ_b²] ≈ (1 + Var(σ_b²)/σ̄⁴)/σ̄², with (Gaussian)
        # Var(σ_b²) = (2 Σ_{p,q} Cov² + 4 Σ_{p,q} m̃_p m̃_q Cov) / n², m̃ = m − µ̄ (the backward's divisor)
        sv = var.sqrt()
        mt = x.mean - mu.repeat_interleave(C // self.G)[:, None, None]
        cov2 = (Tc / xcorr(sv, sv).clamp_min(1e-300)).clamp(-1, 1) ** 2 * xcorr(var, var)
        mcov = (Tc / xcorr(sv, sv).clamp_min(1e-300)).clamp(-1, 1) * xcorr(mt * sv, mt * sv)
        var_s2 = self._group(2 * cov2 + 4 * mcov).sum((1, 2, 3)) / n**2
        self.jensen = 1 + var_s2 / sigma2**2
        s2 = sigma2.repeat_interleave(C // self.G)[:, None, None]
        xhat_m = (x.mean - mu.repeat_interleave(C // self.G)[:, None, None]) / s2.sqrt()
        Tc[:, H - 1, W - 1] = var.sum((1, 2))
        self.xhat = _field_from_sums(xhat_m, var / s2, Tc / s2)
        gam = torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma
        bet = torch.zeros(C, dtype=_DT) if self.beta is None else self.beta
        return Field(
            gam[:, None, None] * self.xhat.mean + bet[:, None, None],
            gam[:, None, None] ** 2 * self.xhat.var,
            self.xhat.corr,
        )

    def backward(self, g: Field) -> Field:
        C, H, W = g.shape
        n = C // self.G * H * W
        gam = torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma
        g2 = (gam**2)[:, None, None]
        Tg = g.lag_sums() * g2  # of g_x̂ = γ g_y
        e_m2 = self._group(Tg).sum((1, 2, 3)) / n**2  # E[mean(g_x̂)²]
        beta0 = self.beta is None or bool((self.beta == 0).all())
        if g.yy is not None and beta0:  # g_x̂ x̂ = g_y · y (β = 0): from the ReLU after the norm
            e_t2 = self._group(g.yy).sum(1) / n**2
        else:  # g independent of x̂: Σ_{p,q} Cov(g_p, g_q) E[x̂_p x̂_q]
            xh = self.xhat
            s, sg = xh.var.clamp_min(0).sqrt(), (g.var * g2).clamp_min(0).sqrt()
            X = xh.corr * xcorr(sg * s, sg * s) + xcorr(sg * xh.mean, sg * xh.mean)
            e_t2 = self._group((g.corr * X).sum((1, 2))).sum(1) / n**2
        e_g2 = self._group(g.var * g2).mean((1, 2, 3))
        f = ((e_g2 - e_m2 - e_t2) / e_g2.clamp_min(1e-300)).clamp_min(0)  # the projection's share kept
        var = (g.var * g2).reshape(self.G, -1, H, W) * (f * self.jensen / self.sigma2)[:, None, None, None]
        var = var.reshape(C, H, W)
        # the lags: T − N(e) E[m²] − E[t²] Σ_p E[x̂_p x̂_{p+e}], over σ²
        xh = self.xhat
        s = xh.var.clamp_min(0).sqrt()
        X = xh.corr * xcorr(s, s) + xcorr(xh.mean, xh.mean)  # (C, 2H−1, 2W−1)
        N = xcorr(torch.ones((1, H, W), dtype=_DT), torch.ones((1, H, W), dtype=_DT))
        rep = C // self.G
        em2, et2, s2 = (
            t.repeat_interleave(rep)[:, None, None] for t in (e_m2, e_t2, self.sigma2 / self.jensen)
        )
        T = (Tg - N * em2 - X * et2) / s2
        T[:, H - 1, W - 1] = var.sum((1, 2))
        return _field_from_sums(torch.zeros_like(var), var, T)


# ---------------------------------------------------------------------------------------------------
# BatchNorm
# ---------------------------------------------------------------------------------------------------


class BatchNorm:
    """BatchNorm over the batch and the positions, per channel: y = a_c x + b_c, one affine per channel.

    Training (``running_mean``/``running_var`` None: the batch's own statistics), at their expectation:
        µ_c = mean_p m(c, p),   σ_c² = mean_p (v(c, p) + m(c, p)²) − µ_c² + eps
    (the within-channel variance: the positions' variance plus the spread of the position-mean map);
    eval: µ_c, σ_c² + eps the running ones. a_c = γ_c/σ_c, b_c = β_c − a_c µ_c; the mean map becomes
    a m + b, the variance map a² v, the stencil is kept. Back: g_x = a_c g_y. In training the exact
    backward also subtracts the gradient's mean over the batch and positions and its projection on x̂;
    both are O(1/B) of E[g²] (B·H·W values per channel, the samples' gradients independent) and dropped,
    as the batch's own fluctuation of µ_c and σ_c is (the prediction does not know B).
    """

    def __init__(self, weight, bias, eps: float, running_mean=None, running_var=None) -> None:
        def t(v):
            return None if v is None else v.detach().to("cpu", _DT)

        self.gamma, self.beta, self.eps = t(weight), t(bias), eps
        self.rm, self.rv = t(running_mean), t(running_var)

    def forward(self, x: Field) -> Field:
        C = x.shape[0]
        if self.rv is None:
            mu = x.mean.mean((1, 2))  # (C,)
            sigma2 = (x.var + x.mean**2).mean((1, 2)) - mu * mu + self.eps
        else:
            mu, sigma2 = self.rm, self.rv + self.eps
        a = (torch.ones(C, dtype=_DT) if self.gamma is None else self.gamma) / sigma2.clamp_min(1e-300).sqrt()
        b = (torch.zeros(C, dtype=_DT) if self.beta is None else self.beta) - a * mu
        self.a = a[:, None, None]  # (C, 1, 1)
        return Field(self.a * x.mean + b[:, None, None], self.a**2 * x.var, x.corr)

    def backward(self, g: Field) -> Field:
        return Field(torch.zeros_like(g.var), self.a**2 * g.var, g.corr)


# ---------------------------------------------------------------------------------------------------
# Linear, add
# ---------------------------------------------------------------------------------------------------


class Linear:
    """y = W x + b on features (F, 1, 1): independent features (their cross-covariance is not carried)."""

    def __init__(self, weight, bias) -> None:
        self.W = weight.detach().to("cpu", _DT)
        self.b = None if bias is None else bias.detach().to("cpu", _DT)

    def forward(self, x: Field) -> Field:
        if x.shape[1:] != (1, 1):
            raise NotImplementedError("Linear of a map with positions: flatten after a global pool only")
        m = self.W @ x.mean[:, 0, 0] + (0 if self.b is None else self.b)
        v = (self.W**2) @ x.var[:, 0, 0]
        return Field(m[:, None, None], v[:, None, None], torch.ones((len(m), 1, 1), dtype=_DT))

    def backward(self, g: Field) -> Field:
        v = (self.W**2).T @ g.var[:, 0, 0]
        return Field(
            torch.zeros_like(v)[:, None, None], v[:, None, None], torch.ones((len(v), 1, 1), dtype=_DT)
        )


def add(a: Field, b: Field) -> Field:
    """a + b, the two independent: means, variances and lag sums add."""
    return _field_from_sums(a.mean + b.mean, a.var + b.var, a.lag_sums() + b.lag_sums())


def add_grads(a: Field, b: Field) -> Field:
    """Two gradients of one tensor, independent: variances, lag sums and ``yy`` add (``yy`` is kept
    only where both have it)."""
    yy = None if a.yy is None or b.yy is None else a.yy + b.yy
    return _field_from_sums(torch.zeros_like(a.var), a.var + b.var, a.lag_sums() + b.lag_sums(), yy)


def unit_noise(channels: int) -> Field:
    """The backward seed: ∂L/∂logits ~ N(0, 1), independent (a (F, 1, 1) field)."""
    return Field(
        torch.zeros((channels, 1, 1), dtype=_DT),
        torch.ones((channels, 1, 1), dtype=_DT),
        torch.ones((channels, 1, 1), dtype=_DT),
    )


def with_yy(f: Field, yy) -> Field:
    return replace(f, yy=yy)


def measure_fields(model: torch.nn.Module, x: torch.Tensor, names=None) -> dict[str, Field]:
    """The measured :class:`Field` of every named module's (B, C, H, W) or (B, F) output on ``x``
    (forward hooks, removed after; the measurement side, never the prediction's)."""
    out: dict[str, Field] = {}
    handles = []
    for n, m in model.named_modules():
        if n and (names is None or n in names):

            def hook(mod, args, y, n=n):
                if isinstance(y, torch.Tensor) and y.dim() in (2, 4) and n not in out:
                    out[n] = measure_field(y)

            handles.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(x)
    finally:
        for h in handles:
            h.remove()
    return out
