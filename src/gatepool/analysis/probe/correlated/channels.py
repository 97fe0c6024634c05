"""The channels' correlation: ``Field.chan`` at lag 0, ``Field.chan_dc`` of their sums over the map.

The state takes a tensor's channels as uncorrelated, and over random weights they are in expectation.
A given net's are not: a stem conv makes its channels of few numbers (3 × 3 × 3 = 27 for 13–32
channels), so its outputs are correlated through the weights they share (R_ab ≈ ±0.2 at GerNet-S's
stem), and the next conv's output variance per channel is wᵀ Σ w, not Σ_a w_a² Σ_aa: off by ±20% a
channel. A BatchNorm after it divides each channel by its own σ; a squeeze-and-excitation's pooled
channels (their sums over the map, correlated as the weights make them, not as their values) feed a
1 × 1 conv whose output variance is wᵀ D w.

    R_ab = Σ_p Cov(x_a(p), x_b(p)) / √(Σ_p v_a(p) · Σ_p v_b(p))          (C, C), lag 0
    Q_ab = D_ab / √(D_aa D_bb),  D_ab = Σ_{p,q} Cov(x_a(p), x_b(q))       (C, C), the sums' (D_aa exact:
                                                                           the field's lag sums)

conv      Σ_out = Σ_{j,l} W_j K(u_l − u_j) W_lᵀ over the pairs of taps, K(d) = Cov(x(p), x(p + d)) (Ci, Ci):
          its diagonal v̄_a ρ_a(d) exactly, the rest x's own cross-lags where x is made from a source
          (``Field.made``: a conv's output, or an activation or a scale of one, :func:`made_lags`), else
          R_ab s̄_a s̄_b ρ̄(d) (ρ̄ the channels' mean correlation at d), each pair of taps counted at the share
          of the output positions where both fall inside the map (the zero padding's border). Each output
          channel's variance (its map and its lag sums) is scaled by κ_o = Σ_out,oo / Σ_out,oo|diag (the
          walk's own variance is the diagonal term), and R_out = Σ_out normalized: exact from the input's
          uncorrelated components (``measure_input``, folded into the first conv). The sums: D_out =
          W̃ D W̃ᵀ, W̃ = Σ_u W(u); at a stride s over the taps' phases u mod s (each phase's taps summed, the
          input's pairs whose lag is ≡ the phases' difference; the border left out)
norm      an affine map per channel (BatchNorm, one channel a group): R, Q kept (a γ < 0 flips a sign)
pool      the mean over the whole map: its R is x's Q (exact), Q the same; an average over windows, the
          same for every channel: Q kept, R from x's cross-lags over the window where x is made from a
          source (:func:`window_channels`), else kept (the windows' cross-lags as lag 0)
gate      x · s, s a (C, 1, 1) gate independent of x: Cov = E[s_a] E[s_b] Cov(x_a, x_b) + Cov(s_a, s_b)
          (Cov(x_a, x_b) + m_a m_b) (the means pooled over the positions; for Q the sums and P m);
          stochastic depth the gate b·s of every channel, b ~ Bernoulli(q) a sample
activation  Mehler's series per pair of channels, in each channel's normalized Hermite coefficients a_n
          pooled over the positions: Cov(f(x_a), f(x_b)) = Σ_n R_abⁿ ā_n^a ā_n^b (and the Parseval
          remainder at the power after the last), normalized by the outputs' pooled variances; the sums:
          ā_1^a ā_1^b D_ab/(s̄_a s̄_b) + ā_2^a ā_2^b R_ab² Σ_e N(e) |ρ_a(e) ρ_b(e)| (the second order's
          cross-lags as R_ab² ρ_a ρ_b: the energy two channels share, positive; the rest left out)
max pool  Stein's first order in the taps, the window's lags a conv's output's at those lags from its
          source (``Field.made``), the rest at R² (:func:`max_channels`); Q the input's
cat       of branches of one source (each a conv of it, and an activation after each or none: SqueezeNet's
          Fire), the branches as one conv of their weights stacked: the cross-blocks too (``Field.made``)
slice     a slice of the channels: their block
add       the two independent: Σ = S_a R_a S_a + S_b R_b S_b (S the pooled standard deviations), D likewise

Every other rule drops R and Q (None: unknown, the channels taken as uncorrelated, the state without
them), and a rule that reads an unknown R gives none: R starts at the input's components and holds as far
as every rule on the way carries it. Known in part is worse than not at all, so an add with a term that
varies and has none gives none, and any other cat none: its pieces' blocks alone, their cross-blocks unknown
(GhostNet's cheap operation is a depthwise map of its primary conv's channels), would give the next
conv's variance per channel its within-block cross terms and not the others, an error whose spread a
BatchNorm's 1/σ² turns into a bias, norm after norm (GhostNet-050's backward 1.15–1.3× of the measurement
with the blocks kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.field import _DT, Field, _at_lag, xcorr

_WORK = 2**29  # multiply-adds of one conv's Σ_out beyond which R is dropped (a dense 3 × 3 conv of 256
# channels at stride 1: 3.4e8; of 512: 2.7e9) and the conv's variance left uncorrected
_LAG_WORK = 2**33  # multiply-adds of a conv's output channels' covariance at a max pool's lags beyond which
# the lags' are taken as the lag 0's times the channels' mean correlation (512 channels of 64 × 9: 2.0e9)
_POSITIONS = 256  # an activation's coefficients pooled over at most this many positions (a grid of them)
_TERMS = 8  # Mehler's series per pair of channels to Rⁿ, n ≤ 8, then Parseval's remainder (|R| ≤ 0.5: < 0.4%)


def _normalized(S: torch.Tensor) -> torch.Tensor:
    d = S.diagonal().clamp_min(1e-300).sqrt()
    R = (S / d[:, None] / d[None, :]).clamp(-1, 1)
    return R.fill_diagonal_(1.0)


def _pooled_var(var: torch.Tensor) -> torch.Tensor:
    return var.flatten(1).mean(1)  # (C,)


def _tap_lags(corr: torch.Tensor, kh: int, kw: int, shift=(0, 0)) -> torch.Tensor:
    """(k, k, C): ρ_c(shift + u_l − u_j) for every pair of taps (j, l) of a kh × kw kernel, 0 beyond the
    map."""
    H, W = (corr.shape[-2] + 1) // 2, (corr.shape[-1] + 1) // 2
    a, b = torch.arange(kh).repeat_interleave(kw), torch.arange(kw).repeat(kh)
    dh, dw = shift[0] + a[None] - a[:, None], shift[1] + b[None] - b[:, None]  # (k, k): shift + u_l − u_j
    inside = (dh.abs() < H) & (dw.abs() < W)
    out = corr[:, (H - 1 + dh).clamp(0, 2 * H - 2), (W - 1 + dw).clamp(0, 2 * W - 2)]  # (C, k, k)
    return (out * inside).permute(1, 2, 0)


def _sums(f) -> torch.Tensor:
    """(C,) D_aa = Σ_{p,q} Cov(x_a(p), x_a(q)): the field's lag sums, all of them."""
    return f.lag_sums().sum((1, 2)).clamp_min(0)


def _cov(R: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """The covariance of correlation R (C, C) and variances var (C,)."""
    s = var.clamp_min(0).sqrt()
    return R * s[:, None] * s[None, :]


def _residue_sums(f, stride) -> torch.Tensor:
    """(s_h, s_w, C): the field's lag sums Σ_{p,q} Cov(x_p, x_q) over the pairs whose lag q − p is ≡ r
    (mod the stride), r = (r_h, r_w): what a strided conv's sum over its output reads of each pair of
    its taps' phases."""
    sh, sw = stride
    T = f.lag_sums()  # (C, 2H−1, 2W−1)
    H, W = (T.shape[1] + 1) // 2, (T.shape[2] + 1) // 2
    eh = (torch.arange(2 * H - 1) - (H - 1)) % sh
    ew = (torch.arange(2 * W - 1) - (W - 1)) % sw
    out = torch.zeros((sh, sw, T.shape[0]), dtype=_DT)
    for rh in range(sh):
        for rw in range(sw):
            out[rh, rw] = T[:, eh == rh][:, :, ew == rw].sum((1, 2))
    return out


def _sums_through(Wt: torch.Tensor, x, stride, kw: int) -> torch.Tensor:
    """(G, og, G, og): the covariance of a conv's output sums over its map, D_out = Σ_{φ,φ'} W^φ K(φ' − φ)
    W^φ'ᵀ over the taps' phases φ = u mod s (W^φ the phase's taps summed; a stride of 1: W̃ D W̃ᵀ), K(r)
    the input sums' covariance over the pairs of lag ≡ r: its diagonal exact, the rest x's Q scaled by
    the channels' mean share of their sums at r (the output's border left out). ``Wt`` the grouped
    weight as (k, G, og, ig), its taps row-major over a kernel ``kw`` wide."""
    sh, sw = stride
    k, G, og, ig = Wt.shape
    S = _residue_sums(x, stride)  # (sh, sw, Ci)
    D = S.sum((0, 1)).clamp_min(0)  # every lag: the sums' variances (:func:`_sums`)
    share = S.sum(-1) / D.sum().clamp_min(1e-300)  # (sh, sw)
    off = _cov(x.chan_dc - torch.eye(len(D), dtype=_DT), D).reshape(G, ig, G, ig)
    taps = torch.arange(k)
    phase = (taps // kw % sh) * sw + taps % kw % sw  # each tap's phase
    phases = [(p // sw, p % sw, Wt[phase == p].sum(0)) for p in range(sh * sw)]  # (G, og, ig) each
    out = torch.zeros((G, og, G, og), dtype=_DT)
    for ah, aw, Wi in phases:
        for bh, bw, Wj in phases:
            r = ((bh - ah) % sh, (bw - aw) % sw)
            K = torch.diag(S[r]).reshape(G, ig, G, ig) + share[r] * off
            out += torch.einsum("goc,gcGp->goGp", Wi, torch.einsum("gcGd,Gpd->gcGp", K, Wj))
    return out


def conv_channels(weight: torch.Tensor, x, groups: int = 1, occupancy: torch.Tensor | None = None,
                  stride=(1, 1)):  # fmt: skip
    """(κ, R_out, Q_out) of a conv of ``weight`` (Co, Ci/groups, kh, kw) on the field ``x``, its groups
    block by block (depthwise: a group a channel); ``occupancy`` (k, k): the share of the output
    positions where both taps j and l fall inside the map (None: all; the zero padding's border). The
    channels' cross-lags are x's own where it is made from a source (:func:`made_lags`: a conv's output,
    or an activation of one) and the cost allows, else R times the channels' mean correlation at the lag.
    None where x carries no R and Q (unknown: a conv of it is not given one of its own, which would hold
    its weights' cross terms and not its input's) or where it costs more than :data:`_WORK`."""
    if x.chan is None or x.chan_dc is None:  # unknown in, unknown out
        return None
    Co, ig, kh, kw = weight.shape
    Ci, G, k = x.shape[0], groups, kh * kw
    og = Co // G
    phases = min(stride[0], kh) * min(stride[1], kw)
    if (k + phases * phases) * G * G * og * ig * (og + ig) + k * k * Co * ig > _WORK:
        return None
    v = _pooled_var(x.var)  # (Ci,)
    rho = _tap_lags(x.corr, kh, kw)  # (k, k, Ci): ρ_c(u_l − u_j)
    if occupancy is not None:
        rho = rho * occupancy[:, :, None]
    rbar = (rho * v).sum(-1) / v.sum().clamp_min(1e-300)
    Wt = weight.reshape(G, og, ig, k).permute(3, 0, 1, 2)  # (k, G, og, ig)
    Wl = torch.einsum("jlgc,lgoc->jgoc", rho.reshape(k, k, G, ig), Wt)  # Σ_l ρ_c(u_l − u_j) W_l
    blocks = torch.einsum("jgoc,jgpc,gc->gop", Wt, Wl, v.reshape(G, ig))  # (G, og, og)
    diag = torch.block_diag(*blocks)  # no input channel is shared across the groups
    off = _lagged_off(Wt, x, v, kw, occupancy) if k > 1 and made_of(x) is not None else None
    if off is None:
        M = _cov(x.chan - torch.eye(Ci, dtype=_DT), v).reshape(G, ig, G, ig)
        Wb = torch.einsum("jl,lgoc->jgoc", rbar, Wt)  # Σ_l ρ̄(u_l − u_j) W_l
        MW = torch.einsum("gcGd,jGpd->jgcGp", M, Wb)  # (k, G, ig, G, og): two steps, no (…, ig, ig) product
        off = torch.einsum("jgoc,jgcGp->goGp", Wt, MW)
    S = diag + off.reshape(Co, Co)
    S = (S + S.T) / 2
    d = diag.diagonal()
    ok = d > 1e-300
    kappa = torch.where(ok, S.diagonal() / torch.where(ok, d, torch.ones_like(d)), torch.ones_like(d))
    D_out = _sums_through(Wt, x, stride, kw).reshape(Co, Co)
    return kappa.clamp_min(0.0), _normalized(S), _normalized((D_out + D_out.T) / 2)


def _pairs_by_lag(kh: int, kw: int) -> dict:
    """{d: [(j, l)]}: the pairs of taps of a kh × kw kernel (row-major) by their lag d = u_l − u_j."""
    pairs: dict = {}
    for j in range(kh * kw):
        for l in range(kh * kw):
            pairs.setdefault((l // kw - j // kw, l % kw - j % kw), []).append((j, l))
    return pairs


def _lagged_off(Wt: torch.Tensor, x, v: torch.Tensor, kw: int, occupancy) -> torch.Tensor | None:
    """(G, og, G, og): a conv's cross-channel terms Σ_{j,l} W_j K_x(u_l − u_j) W_lᵀ from x's channels' own
    correlation at each lag between taps (:func:`made_lags`), K_x's diagonal left out; None where x has
    none or past :data:`_LAG_WORK`. ``Wt`` (k, G, og, ig) the taps, row-major over a kernel ``kw`` wide."""
    k, G, og, ig = Wt.shape
    if k * k * G * G * og * ig * (og + ig) > _LAG_WORK:
        return None
    pairs = _pairs_by_lag(k // kw, kw)
    lagged = made_lags(x, list(pairs))
    if lagged is None:
        return None
    off = torch.zeros((G, og, G, og), dtype=_DT)
    for d, jl in pairs.items():
        J, L = torch.tensor(jl).T
        occ = torch.ones(len(jl), dtype=_DT) if occupancy is None else occupancy[J, L]
        r = lagged[d] - torch.diag(lagged[d].diagonal())
        M = _cov(r, v).reshape(G, ig, G, ig)
        WM = torch.einsum("pgoc,gcGd->pgoGd", Wt[J] * occ[:, None, None, None], M)
        off += torch.einsum("pgoGd,pGqd->goGq", WM, Wt[L])
    return off


def made_lags(f, lags) -> dict | None:
    """{d: (C, C)} the correlation of ``f``'s channels at lag d, Σ_p Cov(f_a(p), f_b(p + d)) over
    √(Σ_p v_a Σ_p v_b), where f is made from a source (``Field.made``): a conv's output's
    (:func:`made_lag_corr`), an activation's of one by Mehler's series per lag, Σ_n r_ab(d)ⁿ ā_n^a ā_n^b
    (the coefficients' products pooled over the positions, the rest at the power after the last, as
    :func:`series_channels`). None where it is not, or past :data:`_LAG_WORK`."""
    m = made_of(f)
    if m is None:
        return None
    r = made_lag_corr(m, lags)
    if r is None or m.coef is None:
        return r
    terms, _ = _series_terms(m.coef, f.var)
    s = _pooled_var(f.var).clamp_min(1e-300).sqrt()
    return {d: _series(r[d], terms) / s[:, None] / s[None, :] for d in lags}


def window_channels(x, kernel) -> torch.Tensor | None:
    """R of an average of ``x`` over kh × kw windows, the same in every channel: Σ_d c(d) r_ab(d) over the
    window's lags, c(d) = (kh − |d_h|)(kw − |d_w|) its pairs at d, r_ab(d) x's channels' correlation at d
    (:func:`made_lags`; each channel's own ρ_a(d) on the diagonal), normalized (the border's windows
    counted as whole ones). None where x is not made from a source."""
    kh, kw = kernel
    lags = [(dh, dw) for dh in range(1 - kh, kh) for dw in range(1 - kw, kw)]
    r = made_lags(x, lags)
    if r is None:
        return None
    S = torch.zeros_like(r[(0, 0)])
    for dh, dw in lags:
        r_d = r[(dh, dw)] - torch.diag(r[(dh, dw)].diagonal()) + torch.diag(_at_lag(x.corr, dh, dw))
        S += (kh - abs(dh)) * (kw - abs(dw)) * r_d
    return _normalized(S)


def _series_terms(coef: list[torch.Tensor], var: torch.Tensor, factorial: bool = False) -> tuple:
    """([t_1, …, t_N, t_rest], [ā_1, …]): Mehler's series' terms per pair of channels, t_n = mean_p a_n^a(p)
    a_n^b(p) over at most :data:`_POSITIONS` positions (a grid of them), t_rest that of Parseval's
    remainder √(var − Σ a_n²), and each coefficient's mean ā_n (C,); ``coef`` the maps (C, H, W) of a_n
    (``factorial``: c_n, a_n = c_n/√n!), ``var`` the function's variance map."""
    C, H, W = var.shape
    step = max(1, round((H * W / _POSITIONS) ** 0.5))
    pick = (slice(None), slice(None, None, step), slice(None, None, step))
    n_pos = var[pick][0].numel()
    kept = torch.zeros_like(var[pick])
    terms, abar = [], []
    for n, c in enumerate(coef[:_TERMS], start=1):
        a = c[pick] / math.sqrt(math.factorial(n)) if factorial else c[pick]
        A = a.reshape(C, -1)
        terms.append(A @ A.T / n_pos)
        kept += a * a
        abar.append(A.mean(1))
    rest = (var[pick] - kept).clamp_min(0).sqrt().reshape(C, -1)
    return terms + [rest @ rest.T / n_pos], abar


def _series(R: torch.Tensor, terms: list[torch.Tensor]) -> torch.Tensor:
    """Σ_n Rⁿ t_n over :func:`_series_terms`' terms (the remainder's at the power after the last)."""
    S, Rn = torch.zeros_like(R), torch.ones_like(R)
    for t in terms:
        Rn = Rn * R
        S += Rn * t
    return S


def series_channels(x, coef: list[torch.Tensor], out, factorial: bool = False) -> tuple:
    """(R, Q) of h(x) from x's by Mehler's series per pair of channels: ``coef`` the maps (C, H, W) of h's
    Hermite coefficients a_n (n = 1, 2, …; ``factorial``: c_n with Cov = Σ ρⁿ/n! c_n c_n, the ReLU's),
    ``out`` h(x)'s field (its variances and lag sums exact per channel). R's terms after the last
    carried by Parseval's remainder at the power after it; Q's by the first two (see the module)."""
    if x.chan is None or x.chan_dc is None:
        return None, None
    C, H, W = out.shape
    R = x.chan
    terms, abar = _series_terms(coef, out.var, factorial)
    S = _series(R, terms)
    S.diagonal().copy_(_pooled_var(out.var))
    # the sums: the first order through D, the second through the energy two channels share
    sx = _pooled_var(x.var).clamp_min(1e-300).sqrt()
    D = _cov(x.chan_dc, _sums(x)) / sx[:, None] / sx[None, :]
    D_out = abar[0][:, None] * abar[0][None, :] * D
    L = x.corr[0].numel()
    if len(abar) > 1 and C * C * L <= _WORK:
        ones = torch.ones((1, H, W), dtype=_DT)
        U = (x.corr.abs() * xcorr(ones, ones).sqrt()).reshape(C, -1)  # √N(e) |ρ_a(e)|
        D_out += abar[1][:, None] * abar[1][None, :] * R**2 * (U @ U.T)
    D_out.diagonal().copy_(_sums(out))
    return _normalized(S), _normalized(D_out)


def max_channels(x, src, U: torch.Tensor, kernel, out) -> tuple:
    """(R, Q) of a max pool's output ``out`` of ``x``, from its taps' field ``src`` (x itself, or the ReLU's
    input where x is its output: max ReLU = ReLU max), by Stein's lemma, the first order of the taps'
    joint normal law (the diagonal and the second order as in :func:`series_channels`):
    M_a(P) − E ≈ Σ_j w_aj(P) (src_a(P + u_j) − m), so

        S_ab = Σ_{j,l} r_ab(u_l − u_j) mean_P U_aj(P) U_bl(P) + R_ab² mean_P e_a(P) e_b(P),  S_aa = v̄_a

    ``U`` (n, C, Ho, Wo) the taps' U_j = w_j √v(tap j), w_j their wins (of a ReLU's output: where the max
    is > 0), ``kernel`` (kh, kw) the taps row-major, e_a(P)² the variance left past the first order,
    r_ab(d) the channels' correlation at lag d: a conv's output's from its source (:func:`made_lags`:
    a window's taps are neighbours, whose cross-lags a conv makes unlike its lag 0's: 0.13 off in R
    where this is 0.04), else R_ab ρ̄(d). Q, the sums': x's, as an average over windows keeps it (the
    sum of a pool's maxima moves with the sum of its input; the first order alone, normalized by the
    sums' variances, is 0.3 further off)."""
    if src.chan is None or x.chan_dc is None:
        return None, None
    n, C, Ho, Wo = U.shape
    step = max(1, round((Ho * Wo / _POSITIONS) ** 0.5))
    A = U[:, :, ::step, ::step].reshape(n, C, -1)  # (n, C, P)
    P = A.shape[-1]
    if n * n * C * C * P > _WORK:
        return None, None
    rho = _tap_lags(src.corr, *kernel)  # (n, n, C): ρ_c(u_l − u_j)
    pairs = _pairs_by_lag(*kernel)
    r = made_lags(src, list(pairs))
    if r is None:  # R_ab ρ̄(d): the channels' mean correlation at d
        v = _pooled_var(src.var)
        rbar = (rho * v).sum(-1) / v.sum().clamp_min(1e-300)  # (n, n)
        r = {d: src.chan * rbar[jl[0]] for d, jl in pairs.items()}
    G = torch.zeros((C, C), dtype=_DT)
    for d, jl in pairs.items():
        for j, l in jl:
            G += r[d] * (A[j] @ A[l].T)
    G /= P
    own = torch.einsum("jap,jla,lap->ap", A, rho, A)  # (C, P): each channel's first order, its own ρ
    var = out.var[:, ::step, ::step].reshape(C, -1)
    rest = (var - own).clamp_min(0).sqrt()
    R = src.chan
    S = G + R * R * (rest @ rest.T) / P
    S.diagonal().copy_(var.mean(1))
    return _normalized(S), x.chan_dc


@dataclass(eq=False)
class Made:
    """A field that is conv(``source``) (``weight`` (Co, Ci, kh, kw) dense, ``stride``, ``padding``), and with
    ``coef`` h of it, h pointwise: ``pre`` the conv's field, ``coef`` h's normalized Hermite coefficient
    maps a_n (C, H, W), Cov(h(y_a), h(y_b)) = Σ_n ρⁿ a_n^a a_n^b. Linear in the source: the channels'
    covariance at any lag, and across fields made from the same source, follow from the source's.
    ``var`` the described field's variance map: a rule that makes a new one leaves this record behind."""

    source: Field
    weight: torch.Tensor
    stride: tuple
    padding: tuple
    var: torch.Tensor
    coef: list | None = None
    pre: Field | None = None


def made_of(f) -> Made | None:
    """``f.made`` where it still describes ``f`` (its variance map the one it was made with), else None."""
    m = getattr(f, "made", None)
    return m if m is not None and m.var is f.var else None


def activated(x, out, coef: list[torch.Tensor], factorial: bool = False) -> Made | None:
    """``out`` = h(x) pointwise's :class:`Made`, from x's (a conv's output): h's Hermite coefficient maps
    ``coef`` (n = 1, 2, …; ``factorial``: c_n with Cov = Σ ρⁿ/n! c_n c_n, the ReLU's)."""
    m = made_of(x)
    if m is None or m.coef is not None:
        return None
    a = [c / math.sqrt(math.factorial(n)) if factorial else c for n, c in enumerate(coef[:_TERMS], 1)]
    return replace(m, coef=a, pre=x, var=out.var)


def scaled_made(x, scale: torch.Tensor, out) -> Made | None:
    """``out`` = s_c x_c's :class:`Made` from x's (a conv's output: its weights scaled; an activation's: its
    coefficients); ``scale`` (C,) or a number."""
    m = made_of(x)
    if m is None:
        return None
    s = torch.as_tensor(scale, dtype=_DT).reshape(-1).expand(x.shape[0])
    if m.coef is None:
        return replace(m, weight=m.weight * s[:, None, None, None], var=out.var)
    return replace(m, coef=[c * s[:, None, None] for c in m.coef], var=out.var)


def occupancy(hw, kernel, stride, padding) -> torch.Tensor:
    """(k, k): the share of a conv's output positions where both taps j and l fall inside the map."""
    (H, W), (kh, kw), (sh, sw), (ph, pw) = hw, kernel, stride, padding
    Ho, Wo = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    pad = F.pad(torch.ones((1, H, W), dtype=_DT), (pw, pw, ph, ph))
    masks = torch.stack([pad[0, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw]
                         for a in range(kh) for b in range(kw)]).flatten(1)  # fmt: skip
    return masks @ masks.T / masks.shape[1]


def made_lag_corr(made: Made, lags) -> dict | None:
    """{d: (Co, Co)} the correlation of a conv's output channels at output lag d, Σ_p Cov(y_a(p), y_b(p + d))
    over √(Σ_p v_a Σ_p v_b): K(d) = Σ_{j,l} W_j K_x(s·d + u_l − u_j) W_lᵀ, K_x the source's (its diagonal
    v_c ρ_c exactly, the rest R ρ̄ as :func:`conv_channels`; the border left out). None past
    :data:`_LAG_WORK`."""
    x, W = made.source, made.weight
    Co, Ci, kh, kw = W.shape
    k = kh * kw
    half = {max(d, (-d[0], -d[1])) for d in lags} | {(0, 0)}  # K(−d) = K(d)ᵀ: the lags ≥ 0 only
    if len(half) * (k * k * Co * Ci + Co * Co * Ci * k + Co * Ci * Ci * k) > _LAG_WORK:
        return None
    v = _pooled_var(x.var)
    M = _cov(x.chan - torch.eye(Ci, dtype=_DT), v)
    Wt = W.reshape(Co, Ci, k)
    WM = torch.einsum("ocj,cd->odj", Wt, M)
    K = {}
    for d in half:
        rho = _tap_lags(x.corr, kh, kw, (made.stride[0] * d[0], made.stride[1] * d[1]))  # (k, k, Ci)
        rbar = (rho * v).sum(-1) / v.sum().clamp_min(1e-300)  # (k, k)
        Wl = torch.einsum("jlc,ocl->ocj", rho * v, Wt)  # Σ_l v_c ρ_c(s·d + u_l − u_j) W_l
        Wb = torch.einsum("jl,ocl->ocj", rbar, Wt)
        K[d] = torch.einsum("ocj,pcj->op", Wt, Wl) + torch.einsum("odj,pdj->op", WM, Wb)
    s = K[(0, 0)].diagonal().clamp_min(1e-300).sqrt()
    K = {d: K[d] / s[:, None] / s[None, :] for d in K}
    return {d: K[d] if d in K else K[(-d[0], -d[1])].T for d in lags}


def stacked_made(fields) -> Made | None:
    """The :class:`Made` of the cat of ``fields`` where each is made from the same source by a conv of the
    same stride (and each by its activation after, or none): one conv of their weights stacked, each
    kernel placed where it reads (SqueezeNet's Fire: a 1 × 1 and a 3 × 3 conv of its squeeze). None else."""
    ms = [made_of(f) for f in fields]
    if len(ms) < 2 or any(m is None for m in ms):
        return None
    m0 = ms[0]
    if any(m.source is not m0.source or m.stride != m0.stride or (m.coef is None) != (m0.coef is None)
           for m in ms):  # fmt: skip
        return None
    pad = tuple(max(m.padding[i] for m in ms) for i in (0, 1))
    at = [(pad[0] - m.padding[0], pad[1] - m.padding[1]) for m in ms]
    K = tuple(max(o[i] + m.weight.shape[2 + i] for m, o in zip(ms, at)) for i in (0, 1))
    H, W = m0.source.shape[1:]
    size = ((H + 2 * pad[0] - K[0]) // m0.stride[0] + 1, (W + 2 * pad[1] - K[1]) // m0.stride[1] + 1)
    if any(tuple(f.shape[1:]) != size for f in fields):
        return None
    weight = torch.zeros((sum(m.weight.shape[0] for m in ms), m0.weight.shape[1], *K), dtype=_DT)
    row = 0
    for m, (oh, ow) in zip(ms, at):
        co, _, kh, kw = m.weight.shape
        weight[row : row + co, :, oh : oh + kh, ow : ow + kw] = m.weight
        row += co
    if m0.coef is None:
        return Made(m0.source, weight, m0.stride, pad, var=None)
    terms = min(len(m.coef) for m in ms)
    coef = [torch.cat([m.coef[n] for m in ms]) for n in range(terms)]
    pre = Field(*(torch.cat([getattr(m.pre, key) for m in ms]) for key in ("mean", "var", "corr")))
    return Made(m0.source, weight, m0.stride, pad, var=None, coef=coef, pre=pre)


def made_channels(made: Made, out) -> tuple:
    """(R, Q) of the field ``made`` describes (``out``: its variances): the conv's from its source's, then
    the activation's series (:func:`series_channels`)."""
    x = made.source
    kernel = tuple(made.weight.shape[2:])
    chan = conv_channels(made.weight, x, 1, occupancy(x.shape[1:], kernel, made.stride, made.padding),
                         made.stride)  # fmt: skip
    if chan is None:
        return None, None
    if made.coef is None:
        return chan[1], chan[2]
    return series_channels(replace(made.pre, chan=chan[1], chan_dc=chan[2]), made.coef, out)


def signed_channels(f, scale: torch.Tensor) -> dict:
    """``chan`` and ``chan_dc`` of y = a_c x_c + b_c (``scale`` a (C,) or a number), as keywords: the pairs
    of opposite signs flip."""
    out = {}
    for key in ("chan", "chan_dc"):
        R = getattr(f, key)
        if R is not None:
            sign = torch.where(torch.as_tensor(scale) < 0, -1.0, 1.0).to(_DT).expand(R.shape[0])
            R = R * sign[:, None] * sign[None, :]
        out[key] = R
    return out


def gate_channels(x, s) -> tuple:
    """(R, Q) of x · s, s a (C, 1, 1) gate independent of x (squeeze-and-excitation's):
    Cov(x_a s_a, x_b s_b) = E[s_a] E[s_b] Cov(x_a, x_b) + Cov(s_a, s_b) (Cov(x_a, x_b) + m_a m_b), the
    means m pooled over the positions; for the sums over the map their covariance D and P m."""
    if x.chan is None or x.chan_dc is None or s.chan is None:  # known in part: not at all (as an add)
        return None, None
    C = x.shape[0]
    return _gated(x, s.mean.reshape(C), _cov(s.chan, s.var.reshape(C)))


def drop_channels(x, q: float, scale: float) -> tuple:
    """(R, Q) of stochastic depth's y = x · b · scale, b ~ Bernoulli(q) a sample: a gate the same in every
    channel, E = q·scale, every pair's covariance its variance q·scale² − (q·scale)²."""
    if x.chan is None or x.chan_dc is None:
        return None, None
    C = x.shape[0]
    mean = torch.full((C,), q * scale, dtype=_DT)
    return _gated(x, mean, torch.full((C, C), q * scale * scale * (1 - q), dtype=_DT))


def _gated(x, s1: torch.Tensor, Cs: torch.Tensor) -> tuple:
    """(R, Q) of x · s from the gate's means s1 (C,) and covariance Cs (C, C), s independent of x."""
    m = x.mean.flatten(1).mean(1)
    out = []
    for Cx, M in ((_cov(x.chan, _pooled_var(x.var)), m), (_cov(x.chan_dc, _sums(x)), m * x.mean[0].numel())):
        out.append(_normalized(s1[:, None] * s1[None, :] * Cx + Cs * (Cx + M[:, None] * M[None, :])))
    return tuple(out)


def sliced_channels(f, start: int, stop: int) -> dict:
    """``chan`` and ``chan_dc`` of channels start … stop − 1 of ``f``, as keywords."""
    keys = ("chan", "chan_dc")
    return {k: None if getattr(f, k) is None else getattr(f, k)[start:stop, start:stop] for k in keys}


def add_channels(a, b) -> tuple:
    """(R, Q) of the sum of two independent fields: None unless each term that varies carries its own (a
    term's correlation unknown, the sum's known in part would give the next conv some of its cross terms
    and not the others)."""
    out = []
    for key, size in (("chan", lambda f: _pooled_var(f.var)), ("chan_dc", _sums)):
        terms = [(getattr(f, key), size(f)) for f in (a, b) if bool((size(f) > 0).any())]
        if not terms or any(R is None for R, _ in terms):
            out.append(None)
        else:
            out.append(_normalized(sum(_cov(R, v) for R, v in terms)))
    return tuple(out)
