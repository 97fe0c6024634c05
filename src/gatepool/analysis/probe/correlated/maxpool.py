"""Max pool of correlated Gaussian taps: window draws, Clark's recursion.

max pool  per window the max of its correlated Gaussian taps (padded taps never win): mean, variance
          and w_j = P(tap j wins) from 2048 draws of the window (its n×n covariance from the stencil,
          a fixed seed), or by Clark's (1961) recursion (``method="clark"``); between windows
          Cov(M_A, M_B) = Σ w_Aj w_Bl Cov(x_j, x_l) (Stein: exact for a max and one Gaussian, first
          order for two), neighbouring windows drawn jointly. Of a ReLU's output: the draws are of
          its input, the max rectified (max ReLU = ReLU max). The max is not normal (a long right
          tail; of rectified taps a mass near 0): its law per position, the draws' quantiles as
          atoms (``Field.law``), goes on to the norm and the ReLU after it, and so does the
          neighbouring windows' joint law (their draws' ranks, ``Field.copula``, :mod:`copula`).
          Back: v_g,in(q) = Σ_P w_P(q) v_g(P) + 2 P(q wins P and P') Cov(g_P, g_P') for overlapping
          windows; winners of windows that are not neighbours independent of each other
          The channels' correlation by the same first order (:func:`channels.max_channels`)
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.channels import max_channels
from gatepool.analysis.probe.correlated.copula import Copula, Counter
from gatepool.analysis.probe.correlated.field import (
    _DT,
    Deferred,
    Field,
    _at_lag,
    _field_from_sums,
    _rho_strided,
    _valid,
    lags_of,
    spectra,
)
from gatepool.analysis.probe.correlated.law import (
    bins,
    latent_corr,
    levels,
    on_levels,
    quantile_law,
    reshaped,
)
from gatepool.analysis.probe.correlated.normal import Law, _cdf, _pdf
from gatepool.analysis.probe.correlated.registry import pair, register_correlated_rule


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


def _draw_windows(mu: torch.Tensor, sd: torch.Tensor, R: torch.Tensor, base: torch.Tensor, groups, stats,
                  law=None):  # fmt: skip
    """Per window the mean over draws x ~ N(mu, D R D), D = diag(sd), of each statistic of the draws'
    maxima over groups of taps that ``stats`` returns; with ``law`` (d, w, K) float32, the taps' laws
    as quantile tables (:func:`law.on_levels`), x = Q(Φ(L z)) instead, R the copula's latent correlation:
    a draw's bin is found once a channel for the windows that share its block, Q a gather.

    mu, sd (w, d) float64, the windows channel by channel (w / C each); R (C, d, d) the taps'
    correlation, one per channel (the stencil is stationary: only the envelope sd differs between a
    channel's windows). x = mu + sd ∘ (L z), L Lᵀ = R from R's eigendecomposition (negative eigenvalues,
    where the stencil's R is not positive semi-definite, dropped), z from ``base``
    (:func:`_base_draws`): window i uses block i mod blocks. ``groups``: [(a, b)] the taps a … b − 1 of
    one window; ``stats`` maps [(top, last)] per group (the max over the group's taps of each draw,
    float32 (n, samples) (float32: its own sampling error is far above the rounding), and b − a less
    the first tap that reaches it, counted from a, as float32) and the windows' means (n, d) to (n, …)
    tensors, each a mean over the samples. The draws are made tap by tap, never all at once.
    """
    C, blocks = R.shape[0], base.shape[0]
    per = len(mu) // C
    lam, vec = torch.linalg.eigh(R)
    L = (vec * lam.clamp_min(0).sqrt()[:, None, :]).float()  # (C, d, d)
    mu_f, sd_f = mu.float(), sd.float()
    chunks = []
    for c in range(C):
        # the channel's correlated draws (min(per, blocks), d, samples), window i's in row
        # (i − c·per) mod blocks: block i mod blocks (only the blocks its windows use)
        Z = L[c] @ base[(c * per + torch.arange(min(per, blocks))) % blocks]
        B = None if law is None else bins(Z, law.shape[-1])  # each draw's bin in the laws' tables
        i, end = c * per, (c + 1) * per
        while i < end:
            t = min(8 * blocks, end - i)
            t = t - t % blocks if t > blocks else t  # whole blocks, then the rest
            q, r = (t // blocks, blocks) if t % blocks == 0 else (1, t)
            Zt, Bt = (Z, B) if t % blocks == 0 else (Z[:t], None if B is None else B[:t])  # (r, d, samples)

            def draw(j, i=i, t=t, q=q, r=r, Zt=Zt, Bt=Bt):  # tap j of the chunk's windows: (t, samples)
                if law is not None:
                    return law[j, i : i + t].gather(-1, Bt[:, j].expand(q, -1, -1).reshape(t, -1))
                m, s = mu_f[i : i + t, j].reshape(q, r, 1), sd_f[i : i + t, j].reshape(q, r, 1)
                return torch.mul(Zt[:, j], s).add_(m).reshape(t, -1)  # (a broadcast addcmul is 3× slower)

            found = []
            for a, b in groups:  # the max, then its first tap: b − max_j (x_j ≥ top)·(b − j)
                xs = [draw(j) for j in range(a, b)]
                top = xs[0].clone()
                for x in xs[1:]:
                    torch.maximum(top, x, out=top)
                last = torch.zeros_like(top)
                for j, x in enumerate(xs):
                    torch.maximum(last, x.ge_(top).mul_(b - a - j), out=last)  # x ≥ top: 1.0, else 0.0
                found.append((top, last))
            chunks.append([v.to(_DT) for v in stats(found, mu[i : i + t])])
            i += t
    return [torch.cat(v) for v in zip(*chunks)]


def _first_tap(mu: torch.Tensor) -> torch.Tensor:
    """(n,) the first tap of each window (n, d) that is not padding: torch's pick among equal taps."""
    return (mu > _PAD / 2).to(torch.int8).argmax(-1)


_COPULA_DRAWS = 128  # the draws of a pair of windows that its joint law is counted from (:mod:`copula`)
_PAD = -1e30  # the mean of a padded tap (variance 0): it never wins, as torch pads a max pool with −∞


def _wins(top: torch.Tensor, last: torch.Tensor, first: torch.Tensor | None, n: int):
    """The tap (w, samples) that wins each draw as torch's max pool picks it, from the draws' max ``top``
    and ``last`` = n − its first tap (w, samples), and the tap through which the gradient reaches the
    pre-activation (n: none); both float32 (small integers: exact), as :func:`_counts` takes them.

    ``first`` None: the max of the draws themselves, the two are one. ``first`` (w,) the first tap that
    is not padding, and the draws the pre-activations of ReLU outputs: the pool sees ReLU(x), so where
    the top is ≤ 0 every tap is 0 and torch picks ``first``; the pre-activation gets a gradient only
    where top > 0. (Arithmetic with the 0/1 float ``pos``: a where on a mask is far slower on the CPU.)"""
    arg = n - last
    if first is None:
        return arg, arg
    pos = top.clamp_min(0).sign_()  # 1 where top > 0, else 0
    f = first[:, None].to(top.dtype)
    return f + pos * (arg - f), n - last * pos


def _counts(idx: torch.Tensor, bins: int) -> torch.Tensor:
    """(w, bins): the share of the samples of each row of ``idx`` (w, samples) in each bin; ``idx``
    float32 holding integers (exact below 2²⁴) or an integer tensor."""
    w = idx.shape[0]
    flat = (idx + bins * torch.arange(w, dtype=idx.dtype)[:, None]).long().flatten()
    return torch.bincount(flat, minlength=w * bins).reshape(w, bins).to(_DT) / idx.shape[1]


def _tap_xcorrs(U: torch.Tensor) -> torch.Tensor:
    """(n, n, C, 2Ho−1, 2Wo−1): :func:`xcorr` (U_j, U_l) for every pair of the maps U (n, C, Ho, Wo)."""
    FU, FR = spectra(U)
    return lags_of(FR[:, None] * FU[None], *U.shape[-2:])


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

    ``ceil_mode`` (torch's): the last window may run past the map's far edge (it starts inside the
    map or its near padding); its taps out there are padding, which never wins.
    """

    def __init__(
        self, kernel, stride, padding=(0, 0), method: str = "mc", samples: int = 2048, seed: int = 0,
        ceil_mode: bool = False,
    ) -> None:
        if method not in ("mc", "clark"):
            raise ValueError(f"method must be 'mc' or 'clark', got {method!r}")
        if any(2 * p > k for p, k in zip(padding, kernel)):
            raise ValueError(f"padding must be at most half the kernel, got {padding} for {kernel}")
        self.k, self.s, self.p = kernel, stride, padding
        self.method, self.samples, self.seed, self.ceil_mode = method, samples, seed, ceil_mode

    def _out(self, H: int, W: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The output's (Ho, Wo) as torch sizes it, and (eh, ew): how far its last windows reach past
        the far edges' padding (ceil mode only; else 0)."""
        out, extra = [], []
        for n, k, s, p in zip((H, W), self.k, self.s, self.p):
            o = (n + 2 * p - k + (s - 1 if self.ceil_mode else 0)) // s + 1
            if self.ceil_mode and (o - 1) * s >= n + p:  # the last window must start inside
                o -= 1
            out.append(o)
            extra.append(max(0, (o - 1) * s + k - (n + 2 * p)))
        return tuple(out), tuple(extra)

    def _padded(self, x: Field):
        """The mean map padded with :data:`_PAD` and the sd map with 0: (C, H + 2p + e, W + 2p + e) each
        (e the far edges' extra of ceil mode, :meth:`_out`)."""
        (ph, pw), s = self.p, x.var.clamp_min(0).sqrt()
        _, (eh, ew) = self._out(*x.shape[1:])
        pad = (pw, pw + ew, ph, ph + eh)
        return F.pad(x.mean, pad, value=_PAD), F.pad(s, pad)

    def _padded_law(self, x: Field):
        """The law's quantile table (:func:`law.on_levels`) padded with :data:`_PAD`: (C, H', W', K)
        float32, as :meth:`_padded`; None without a law."""
        if x.law is None:
            return None
        (ph, pw) = self.p
        _, (eh, ew) = self._out(*x.shape[1:])
        pad = (0, 0, pw, pw + ew, ph, ph + eh)
        return F.pad(on_levels(x.law), pad, value=_PAD).float()

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

    def _monte_carlo(self, m, sd, R, rect: bool, law=None):
        """Per window (mean, Var, [P(tap j wins)], [w̃_j], the max's law: its draws' quantiles, made when
        first read, :class:`field.Deferred`) from draws of N(m, D R D); m, sd (n, C, …) the taps' means
        and sds, R (C, n, n) their correlation; ``rect``: the max is rectified (see the class); ``law``:
        the taps' quantile tables [(C, …, K)] (n of them), drawn by the copula of latent correlation R
        instead."""
        n, shape = len(m), m[0].shape
        mu = torch.stack(m).reshape(n, -1).T  # (windows, n)
        sds = torch.stack(sd).reshape(n, -1).T
        if law is not None:
            law = torch.stack(law).flatten(1, -2)  # (n, windows, K)
        base = _base_draws(self.samples, n, self.seed)

        def stats(found, mus):
            ((top, last),) = found
            w, wt = _wins(top, last, _first_tap(mus) if rect else None, n)
            out = top.clamp_min(0) if rect else top
            e1, e2 = out.mean(1, dtype=_DT), (out * out).mean(1, dtype=_DT)  # float64 sums
            return e1, e2, _counts(w, n), _counts(wt, n + 1)[:, :n]

        def atoms(found, mus):  # the same draws again, for the max's law
            ((top, _),) = found
            return (quantile_law(top.clamp_min(0) if rect else top).x,)

        def out_law() -> Law:
            (x,) = _draw_windows(mu, sds, R, base, [(0, n)], atoms, law)
            x = x.reshape(*shape, -1)
            return Law(x, levels(x.shape[-1]).diff().expand_as(x).contiguous())

        mean, e2, w, wt = _draw_windows(mu, sds, R, base, [(0, n)], stats, law)
        var = (e2 - mean * mean).clamp_min(0)
        return (
            mean.reshape(shape),
            var.reshape(shape),
            list(w.T.reshape(n, *shape)),
            list(wt.T.reshape(n, *shape)),
            out_law,
        )

    def _pairs(self, mp, sp, corr, dh: int, dw: int, Ho: int, Wo: int, law):
        """Windows P and P + Δ drawn together over the valid P: (shape (C, h, w) of the valid P, the draws'
        count S, draw(stats): :func:`_draw_windows` of the 2n taps with ``stats``); ``mp``, ``sp`` the padded
        mean and sd maps (:meth:`_padded`), ``corr`` the input's stencil (the copula's latent one with
        ``law``, the padded law :meth:`_padded_law`)."""
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
        if law is not None:
            lt = self._taps(law, Ho, Wo)
            law = torch.stack([view(lt, j) for j in range(2 * n)]).reshape(2 * n, -1, law.shape[-1])
        rho = torch.stack(
            [
                torch.stack([_at_lag(corr, P[l][0] - P[j][0], P[l][1] - P[j][1]) for l in range(2 * n)], -1)
                for j in range(2 * n)
            ],
            -2,
        )  # (C, 2n, 2n)
        shape = mu.shape[:3]
        base = _base_draws(self.samples // 4, 2 * n, self.seed + 1)
        groups = [(0, n), (n, 2 * n)]

        def draw(stats):
            return _draw_windows(mu.reshape(-1, 2 * n), sds.reshape(-1, 2 * n), rho, base, groups, stats, law)

        return shape, base.shape[-1], draw

    def _joint(self, mp, sp, corr, dh: int, dw: int, Ho: int, Wo: int, rect: bool, law=None):
        """Windows P and P + Δ drawn together (:meth:`_pairs`): Σ_P Cov(M_P, M_{P+Δ}) (C,), and J and J̃
        (n, n, C, h, w), the probability that tap j wins P and tap l wins P + Δ, as torch picks them and
        through the pre-activation (:func:`_wins`)."""
        n = self.k[0] * self.k[1]

        def stats(found, mus):
            (ma, last_a), (mb, last_b) = found
            wa, wta = _wins(ma, last_a, _first_tap(mus[:, :n]) if rect else None, n)
            wb, wtb = _wins(mb, last_b, _first_tap(mus[:, n:]) if rect else None, n)
            if rect:
                ma, mb = ma.clamp_min(0), mb.clamp_min(0)
            J = _counts(wa * n + wb, n * n).reshape(-1, n, n)  # tap j wins P and tap l wins P + Δ
            Jt = _counts(wta * (n + 1) + wtb, (n + 1) ** 2).reshape(-1, n + 1, n + 1)[:, :n, :n]
            return (ma * mb).mean(1, dtype=_DT), ma.mean(1, dtype=_DT), mb.mean(1, dtype=_DT), J, Jt

        shape, _, draw = self._pairs(mp, sp, corr, dh, dw, Ho, Wo, law)
        ab, a, b, J, Jt = draw(stats)
        cov = (ab - a * b).reshape(shape).sum((1, 2))
        J, Jt = (t.reshape(*shape, n, n).permute(3, 4, 0, 1, 2) for t in (J, Jt))
        return cov, J, Jt

    def _copula(self, mp, sp, corr, Ho: int, Wo: int, law) -> Copula:
        """The neighbouring windows' joint law (:class:`copula.Copula`): each pair's draws of
        :meth:`_pairs` again, the unrectified maxima's ranks counted (:class:`copula.Counter`)."""
        tables, edges = {}, None
        for dh, dw in self.neighbours(Ho, Wo):
            shape, samples, draw = self._pairs(mp, sp, corr, dh, dw, Ho, Wo, law)
            every = max(1, samples // _COPULA_DRAWS)  # the ranks of every few draws: the sorts' cost
            counter = Counter(shape[0], shape[1] * shape[2], len(range(0, samples, every)), self.seed)

            def count(found, mus, counter=counter, every=every):
                (ma, _), (mb, _) = found
                counter.add(ma[:, ::every], mb[:, ::every])
                return ()

            draw(count)
            tables[(dh, dw)], edges = counter.table(), counter.u
        return Copula(edges, tables)

    def forward(self, x: Field, pre: Field | None = None) -> Field:
        """The pool of ``x``; ``pre``: x = ReLU(pre) elementwise, the pool then draws pre (see the class)."""
        rect = pre is not None
        if rect and self.method != "mc":
            raise NotImplementedError("max pool of a ReLU's output: method 'mc' only")
        src = pre if rect else x
        self.x, self.rect = x, rect
        kh, kw = self.k
        C, H, W = x.shape
        (Ho, Wo), _ = self._out(H, W)
        mp, sp = self._padded(src)  # (C, H + 2p, W + 2p): padded taps never win, their sd is 0
        m, sd = self._taps(mp, Ho, Wo), self._taps(sp, Ho, Wo)
        law = self._padded_law(src) if self.method == "mc" else None
        # with a law, the draws' correlation is the copula's latent one (law.py)
        rz = src.corr if law is None else latent_corr(src.law, src.corr)
        offs = [(a, b) for a in range(kh) for b in range(kw)]
        n = len(offs)

        def cov(j, l):
            (a1, b1), (a2, b2) = offs[j], offs[l]
            return sd[j] * sd[l] * _at_lag(src.corr, a2 - a1, b2 - b1)[:, None, None]

        if self.method == "mc":
            R = torch.stack(
                [
                    torch.stack([_at_lag(rz, a2 - a1, b2 - b1) for a2, b2 in offs], -1)
                    for a1, b1 in offs
                ],
                -2,
            )  # (C, n, n): the taps' correlation
            taps_law = None if law is None else self._taps(law, Ho, Wo)
            mu, var, w, wt, max_law = self._monte_carlo(m, sd, R, rect, taps_law)
        else:
            mu, var = m[0], sd[0] ** 2
            w = [torch.ones_like(mu)] + [torch.zeros_like(mu) for _ in range(n - 1)]
            for l in range(1, n):
                c = sum(w[j] * cov(j, l) for j in range(l))
                mu, var, p, q = clark_max(mu, var, m[l], sd[l] ** 2, c)
                w = [wj * p for wj in w[:l]] + [q] + w[l + 1 :]
            wt, max_law = w, None
        self.w, self.wt, self.offs, self.out_hw = w, wt, offs, (Ho, Wo)
        # T_out(Δ) = Σ_{j,l} ρ(sΔ + l − j) Σ_P U_j(P) U_l(P + Δ),  U_j = w̃_j √v(tap j)
        # the pair (l, j) is (j, l) at −Δ: the pairs l ≥ j (j = l halved), then T = V(Δ) + V(−Δ)
        U = torch.stack([wt[j] * sd[j] for j in range(n)])  # (n, C, Ho, Wo): Stein's first order
        X = _tap_xcorrs(U)  # (n, n, C, 2Ho−1, 2Wo−1)
        rho = {}
        V = torch.zeros((C, 2 * Ho - 1, 2 * Wo - 1), dtype=_DT)
        for j in range(n):
            for l in range(j, n):
                off = (offs[l][0] - offs[j][0], offs[l][1] - offs[j][1])
                if off not in rho:
                    rho[off] = _rho_strided(src.corr, (H, W), (Ho, Wo), self.s, *off)
                V += (0.5 if l == j else 1.0) * rho[off] * X[j, l]
        T = V + V.flip((-2, -1))
        self.joint, self.joint_t = {}, {}
        if self.method == "mc":  # the neighbouring windows drawn jointly: their covariance, joint wins
            for dh, dw in self.neighbours(Ho, Wo):
                cov_ab, J, Jt = self._joint(mp, sp, rz, dh, dw, Ho, Wo, rect, law)
                self.joint[(dh, dw)], self.joint_t[(dh, dw)] = J, Jt
                T[:, Ho - 1 + dh, Wo - 1 + dw] = cov_ab
                T[:, Ho - 1 - dh, Wo - 1 - dw] = cov_ab
        T[:, Ho - 1, Wo - 1] = var.sum((1, 2))
        out = _field_from_sums(mu, var, T)
        out.chan, out.chan_dc = max_channels(x, src, U, self.k, out)
        if max_law is None:
            return out
        # the max's law (the bins' spread given back) and the pairs' joint law, each drawn where read
        out_law = Deferred(lambda: reshaped(max_law(), mu, var))
        copula = Deferred(lambda: self._copula(mp, sp, rz, Ho, Wo, law)) if self.joint else None
        return replace(out, law=out_law, copula=copula)

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
        _, (eh, ew) = self._out(H, W)
        var = torch.zeros((C, H + 2 * ph + eh, W + 2 * pw + ew), dtype=_DT)  # padded: its rim gets w = 0
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
        kk = max(self.k) + max(self.s)  # a margin for the taps in the padding (w = 0 there)
        big = torch.zeros((C, 2 * H - 1 + 2 * kk, 2 * W - 1 + 2 * kk), dtype=_DT)
        mask = torch.ones((2 * Ho - 1, 2 * Wo - 1), dtype=_DT)
        mask[Ho - 1, Wo - 1] = 0.0
        for dh, dw in joint:  # these window pairs from their joint wins, below
            mask[Ho - 1 + dh, Wo - 1 + dw] = mask[Ho - 1 - dh, Wo - 1 - dw] = 0.0
        X = _tap_xcorrs(torch.stack([wj * sg for wj in w])) * (g.corr * mask)  # (n, n, C, …)
        for (dh, dw), J in joint.items():  # Σ_P P(j wins P, l wins P+Δ) sg(P) sg(P+Δ) ρ_g(Δ), (n, n, C)
            a, b = _valid(sg, dh, dw)
            t = (J * (a * b)).sum((-2, -1)) * _at_lag(g.corr, dh, dw)
            X[:, :, :, Ho - 1 + dh, Wo - 1 + dw] += t
            # the pair (P+Δ, P) at lag −Δ: tap l of the later window first: J[l, j] there
            X[:, :, :, Ho - 1 - dh, Wo - 1 - dw] += t.transpose(0, 1)
        for j, (a1, b1) in enumerate(self.offs):
            for l, (a2, b2) in enumerate(self.offs):
                h0 = H - 1 + kk - sh * (Ho - 1) + (a2 - a1)
                w0 = W - 1 + kk - sw * (Wo - 1) + (b2 - b1)
                big[:, h0 : h0 + sh * (2 * Ho - 2) + 1 : sh, w0 : w0 + sw * (2 * Wo - 2) + 1 : sw] += X[j, l]
        T = big[:, kk : kk + 2 * H - 1, kk : kk + 2 * W - 1].clone()
        T[:, H - 1, W - 1] = var.sum((1, 2))
        return _field_from_sums(torch.zeros_like(var), var, T)


@register_correlated_rule(nn.MaxPool2d)
def maxpool_rule(m: nn.MaxPool2d) -> MaxPool:
    if pair(m.dilation) != (1, 1):
        raise NotImplementedError("max pool rule: no dilation")
    k = pair(m.kernel_size)
    return MaxPool(k, pair(m.stride) if m.stride else k, pair(m.padding), ceil_mode=m.ceil_mode)
