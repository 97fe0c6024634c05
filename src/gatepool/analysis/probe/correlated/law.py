"""The law of a field that is not Gaussian given its position, and the Gaussian copula that joins them.

A sparse image (a digit on an empty canvas) is a spike at the background and a tail of strokes at each
position; a conv of it, and the max over a pool's window, keep that shape (a long right tail), and a
normal of the right mean and variance puts the ReLU after the next norm at the wrong P(x > 0). The
state then carries ``Field.law``: per position the law as atoms (:class:`normal.Law`, sorted values,
masses summing to 1), beside the stencil ρ. The positions are joined by a Gaussian copula,

    x_p = Q_p(Φ(z_p)),   z a Gaussian field with the latent correlation ρ_z,

Q_p the law's quantile function (a step function: atom k on Φ⁻¹ of its cumulative masses). ρ_z is the
one that gives x the state's correlation (NORTA, Cario & Nelson 1997): with the Hermite coefficients
of the step function, a_n(p) = E[Q_p(Φ(z)) He_n(z)] = Σ_k (x_{k+1} − x_k) φ(t_k) He_{n−1}(t_k) (t_k the
jumps), Cov(x_p, x_q) = Σ_n a_n(p) a_n(q) ρ_zⁿ/n!; per channel, pooled over the positions,
ρ_x = Σ_n c_n ρ_zⁿ + r ρ_z^{N+1} (c_n = Σ_p a_n(p)²/n! / Σ_p v_p, r the rest, so that ρ_x(1) = 1),
inverted lag by lag. Draws of the field's taps are then Q(Φ(L u)), L Lᵀ = R_z, u standard normal.

    levels          the bins' edges in u: half even in u, half even in Φ⁻¹(u) (the tails)
    quantile_law    K atoms from samples (the input's own marginal, a max pool's draws)
    rebin           weighted atoms to K atoms (each the mean of Q over its bin: the mean kept)
    reshaped        a law moved to a new mean and variance by the affine map (a norm's)
    add_normal      the law of x + b, b ~ N(m, v) independent of x (a residual add of a Gaussian branch)
    sum_law         the same for two fields, the one with a law and the other as a normal
    hermite_steps   a_n of the step function Q_p(Φ(z)), n = 1 … order
    latent_corr     ρ_z from the law and ρ_x
    on_levels       a law's atoms on the bins of levels: a quantile table, one u-grid for all positions
    bins            the bin of Φ(z) for draws z: Q_p(Φ(z)) is then a gather from the table
    conv_law        a conv's output law per position from draws of its input's taps (the first conv)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.field import _DT, Field, _at_lag
from gatepool.analysis.probe.correlated.normal import Law, _cdf, _pdf

ATOMS = 64  # atoms of a law carried by the state
FAN_IN = 64  # a conv that sums this many inputs or more makes a normal output (no law carried)
_ORDER = 24  # Hermite terms of the copula's correlation map (then Parseval's rest)


def _icdf(u: torch.Tensor) -> torch.Tensor:
    return math.sqrt(2.0) * torch.erfinv(2 * u - 1)


def moments(law: Law) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, variance) of ``law`` per position."""
    m = (law.w * law.x).sum(-1)
    return m, (law.w * (law.x - m[..., None]) ** 2).sum(-1)


def levels(atoms: int) -> torch.Tensor:
    """The ``atoms`` + 1 edges in u ∈ [0, 1] of a law's bins: half of them evenly spaced in u (the body)
    and half evenly in z = Φ⁻¹(u) over ±4 (the tails, where one even bin would hold much of the
    variance)."""
    z = torch.linspace(-4, 4, atoms // 2, dtype=_DT)
    return torch.cat([torch.linspace(0, 1, atoms - atoms // 2 + 1, dtype=_DT), _cdf(z)]).sort().values


def rebin(x: torch.Tensor, w: torch.Tensor, atoms: int = ATOMS) -> Law:
    """The law of atoms ``x`` with masses ``w`` (..., n) as ``atoms`` atoms over the bins of
    :func:`levels`: atom k is the mean of the quantile function over its bin (u_k, u_{k+1}], from
    G(u) = ∫₀ᵘ Q (piecewise linear between the cumulative masses, so exact): the mean is kept, the
    spread within a bin dropped."""
    x, order = x.sort(-1)
    w = w.gather(-1, order)
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-300)
    cw = torch.cat([torch.zeros_like(w[..., :1]), w.cumsum(-1)], -1)  # (..., n + 1)
    cg = torch.cat([torch.zeros_like(w[..., :1]), (w * x).cumsum(-1)], -1)
    edges = levels(atoms).to(x.dtype)
    u = edges.expand(*x.shape[:-1], atoms + 1).contiguous()
    i = torch.searchsorted(cw.contiguous(), u, right=True).clamp(1, x.shape[-1])  # the atom holding u
    G = cg.gather(-1, i - 1) + x.gather(-1, i - 1) * (u - cw.gather(-1, i - 1))
    G[..., -1] = cg[..., -1]
    mass = edges[1:] - edges[:-1]
    return Law((G[..., 1:] - G[..., :-1]) / mass, mass.expand_as(G[..., 1:]).contiguous())


def quantile_law(samples: torch.Tensor, atoms: int = ATOMS) -> Law:
    """``atoms`` atoms (..., atoms) from ``samples`` (..., S), each the mean of its bin's sorted samples
    (:func:`rebin` of equal masses, in closed form): with s sorted and G(t) = Σ_{i<⌊t⌋} s_i + (t − ⌊t⌋)
    s_⌊t⌋ the sum of the first t of them, atom k = (G(S u_{k+1}) − G(S u_k)) / (S (u_{k+1} − u_k)). The
    samples sorted in their own dtype, the sums in float64."""
    S = samples.shape[-1]
    s = samples.sort(-1).values
    cs = torch.cat([torch.zeros_like(s[..., :1], dtype=_DT), s.cumsum(-1, dtype=_DT)], -1)  # (..., S + 1)
    edges = levels(atoms)
    t = edges * S
    i = t.floor().long().clamp(0, S - 1)
    G = cs[..., i] + (t - i) * s[..., i].to(_DT)  # the sum of the first t sorted samples
    mass = edges.diff()
    return Law((G[..., 1:] - G[..., :-1]) / (S * mass), mass.expand(*s.shape[:-1], atoms).contiguous())


def normal_law(mean: torch.Tensor, var: torch.Tensor, atoms: int = ATOMS) -> Law:
    """N(mean, var) per position as ``atoms`` atoms on the bins of :func:`levels`: atom k the normal's
    mean over its bin (u_k, u_{k+1}], m + s (φ(z_k) − φ(z_{k+1}))/(u_{k+1} − u_k), z = Φ⁻¹(u)."""
    u = levels(atoms)
    z = _icdf(u.clamp(1e-300, 1 - 1e-16))
    d = _pdf(z)
    d[0] = d[-1] = 0.0
    mass = u.diff()
    x = mean[..., None] + var.clamp_min(0).sqrt()[..., None] * ((d[:-1] - d[1:]) / mass)
    return Law(x, mass.expand_as(x).contiguous())


def reshaped(law: Law, mean: torch.Tensor, var: torch.Tensor) -> Law:
    """``law``'s shape at the mean and variance given (per position): the affine image of its atoms."""
    m, v = moments(law)
    scale = torch.where(v > 0, (var.clamp_min(0) / v.clamp_min(1e-300)).sqrt(), torch.zeros_like(v))
    return Law(mean[..., None] + scale[..., None] * (law.x - m[..., None]), law.w)


def add_normal(law: Law, mean: torch.Tensor, var: torch.Tensor, atoms: int = ATOMS, grid: int = 192,
               chunk: int = 1 << 22) -> Law:  # fmt: skip
    """The law of x + b, x ~ ``law``, b ~ N(mean, var) independent: the normal mixture
    F(q) = Σ_j w_j Φ((q − c_j)/s), c_j = x_j + m, smooth. Its quantiles q_k at :func:`levels` (F on a
    grid of ``grid`` values, inverted linearly), and atom k the mixture's exact mean between q_k and q_{k+1}
    (the partial expectations Σ_j w_j (c_j Φ(a_j) − s φ(a_j))) with that interval's exact mass; an interval
    without mass (b constant: the grid's quantiles meet at an atom of x) keeps its atom inside it, weight 0,
    so that the atoms stay in order."""
    shape, n = law.x.shape[:-1], law.x.shape[-1]
    c_all = (law.x + mean[..., None]).reshape(-1, n)
    w_all = law.w.reshape(-1, n)
    s_all = var.clamp_min(0).sqrt().reshape(-1, 1)
    xs, ws = [], []
    step = max(1, chunk // (grid * n))
    for i in range(0, len(c_all), step):
        c, w, s = c_all[i : i + step], w_all[i : i + step], s_all[i : i + step]
        s = s.clamp_min(1e-6 * (c.amax(-1, keepdim=True) - c.amin(-1, keepdim=True) + 1))
        lo, hi = c.amin(-1, keepdim=True) - 6 * s, c.amax(-1, keepdim=True) + 6 * s
        q = lo + (hi - lo) * torch.linspace(0, 1, grid, dtype=_DT)  # (p, grid)
        Fq = (w[:, None, :] * _cdf((q[..., None] - c[:, None, :]) / s[..., None])).sum(-1)
        Fq = torch.cummax(Fq, -1).values.contiguous()
        u = levels(atoms)[1:-1].expand(len(c), -1).contiguous()
        j = torch.searchsorted(Fq, u).clamp(1, grid - 1)
        f0, f1 = Fq.gather(-1, j - 1), Fq.gather(-1, j)
        q0, q1 = q.gather(-1, j - 1), q.gather(-1, j)
        qk = q0 + (q1 - q0) * ((u - f0) / (f1 - f0).clamp_min(1e-300))
        a = (qk[..., None] - c[:, None, :]) / s[..., None]  # (p, K − 1, n)
        cdf = (w[:, None, :] * _cdf(a)).sum(-1)
        pe = (w[:, None, :] * (c[:, None, :] * _cdf(a) - s[..., None] * _pdf(a))).sum(-1)
        total = (w * c).sum(-1, keepdim=True)
        cdf = torch.cat([torch.zeros_like(total), cdf, torch.ones_like(total)], -1)
        pe = torch.cat([torch.zeros_like(total), pe, total], -1)
        mass = (cdf[:, 1:] - cdf[:, :-1]).clamp_min(0)
        edges = torch.cat([lo, qk, hi], -1)  # an interval without mass: its atom at its middle (weight 0)
        mean_in = torch.where(mass > 0, (pe[:, 1:] - pe[:, :-1]) / mass.clamp_min(1e-300),
                              (edges[:, 1:] + edges[:, :-1]) / 2)  # fmt: skip
        xs.append(torch.minimum(torch.maximum(mean_in, edges[:, :-1]), edges[:, 1:]))
        ws.append(mass / mass.sum(-1, keepdim=True))
    return Law(torch.cat(xs).reshape(*shape, atoms), torch.cat(ws).reshape(*shape, atoms))


def sum_law(a: Field, b: Field) -> Law | None:
    """The law of a + b, independent: the first with a law as it is, the other as a normal of its
    moments (:func:`add_normal`); None where neither has a law."""
    if a.law is None:
        a, b = b, a
    if a.law is None:
        return None
    return add_normal(a.law, b.mean, b.var)


def _jumps(law: Law) -> tuple[torch.Tensor, torch.Tensor]:
    """The step function Q(Φ(z))'s jumps: their heights x_{k+1} − x_k and places t_k = Φ⁻¹(Σ_{i≤k} w_i)."""
    cw = law.w.cumsum(-1)[..., :-1].clamp(1e-15, 1 - 1e-15)
    return law.x[..., 1:] - law.x[..., :-1], _icdf(cw)


def hermite_steps(law: Law, order: int) -> list[torch.Tensor]:
    """[a_1, …, a_order]: a_n = E[Q(Φ(z)) He_n(z)] = Σ_k Δx_k φ(t_k) He_{n−1}(t_k) (per position)."""
    dx, t = _jumps(law)
    d = dx * _pdf(t)
    he_prev, he = torch.zeros_like(t), torch.ones_like(t)  # He_{-1}, He_0
    out = []
    for n in range(1, order + 1):
        out.append((d * he).sum(-1))
        he_prev, he = he, t * he - (n - 1) * he_prev
    return out


def corr_map(law: Law, order: int = _ORDER) -> torch.Tensor:
    """Per channel (C, order + 1): c_n (n = 1 … order) of ρ_x = Σ c_n ρ_zⁿ, and the rest r at ρ_z^{N+1},
    pooled over the positions by their variances; a law (C, H, W, K)."""
    _, v = moments(law)
    a = hermite_steps(law, order)
    tot = v.sum((1, 2)).clamp_min(1e-300)  # (C,)
    c = torch.stack([(an * an).sum((1, 2)) / float(math.factorial(n)) for n, an in enumerate(a, 1)], -1)
    c = c / tot[:, None]
    c = c * (1 / c.sum(-1, keepdim=True).clamp_min(1.0))  # rounding: never above 1 in all
    return torch.cat([c, (1 - c.sum(-1, keepdim=True)).clamp_min(0)], -1)


def latent_corr(law: Law, corr: torch.Tensor, grid: int = 2001) -> torch.Tensor:
    """The copula's ρ_z (C, 2H−1, 2W−1) that gives the field x ~ ``law`` its correlation ``corr``:
    ρ_x(ρ_z) (:func:`corr_map`, increasing) inverted on a grid of ρ_z, per channel."""
    c = corr_map(law)  # (C, N + 1)
    rz = torch.linspace(-1, 1, grid, dtype=_DT)
    powers = rz[:, None] ** torch.arange(1, c.shape[-1] + 1, dtype=_DT)  # (grid, N + 1)
    rx = (powers @ c.T).T.contiguous()  # (C, grid) ρ_x at each ρ_z
    rx = torch.cummax(rx, -1).values  # monotone (it is, but for rounding)
    flat = corr.reshape(corr.shape[0], -1).contiguous()
    i = torch.searchsorted(rx, flat).clamp(1, grid - 1)
    lo, hi = rx.gather(-1, i - 1), rx.gather(-1, i)
    f = ((flat - lo) / (hi - lo).clamp_min(1e-300)).clamp(0, 1)
    out = (rz[i - 1] + f * (rz[i] - rz[i - 1])).reshape(corr.shape)
    H, W = (corr.shape[-2] + 1) // 2, (corr.shape[-1] + 1) // 2
    out[:, H - 1, W - 1] = 1.0
    return out


def on_levels(law: Law) -> torch.Tensor:
    """``law``'s atoms (..., K) on the bins of :func:`levels` (its own where its masses are those bins',
    else :func:`rebin`'s): a quantile table whose rows share one u-grid, so that a draw's bin is found
    once for every position (:func:`bins`) and Q_p(Φ(z)) is a gather."""
    K = law.x.shape[-1]
    mass = levels(K).diff().to(law.w.dtype)
    if torch.allclose(law.w, mass.expand_as(law.w), rtol=0.0, atol=1e-12):
        return law.x
    return rebin(law.x, law.w, K).x


def bins(z: torch.Tensor, atoms: int) -> torch.Tensor:
    """The bin of :func:`levels` (``atoms`` bins) holding Φ(z), for draws z of any shape: atom ``bins(z)``
    of a table from :func:`on_levels` is Q(Φ(z)), the same index at every position. In closed form, the
    interior edges below Φ(z) counted on each of the two grids: k/n_u < Φ(z) for k = 1 … n_u − 1, and
    −4 + 8j/(n_z − 1) < z for j = 0 … n_z − 1 (n_u = atoms − ⌊atoms/2⌋, n_z = ⌊atoms/2⌋); a search over
    the sorted edges (``torch.bucketize``) gives the same bins and costs ten times as much."""
    nu, nz = atoms - atoms // 2, atoms // 2
    below_u = (_cdf(z) * nu).ceil_().sub_(1).clamp_(0, nu - 1)
    below_z = ((z + 4) * ((nz - 1) / 8)).ceil_().clamp_(0, nz)
    return below_u.add_(below_z).long()


def tap_corr(corr: torch.Tensor, offs: list[tuple[int, int]]) -> torch.Tensor:
    """(C, n, n): the correlation between the taps at offsets ``offs`` of a stationary stencil."""
    return torch.stack(
        [torch.stack([_at_lag(corr, a2 - a1, b2 - b1) for a2, b2 in offs], -1) for a1, b1 in offs], -2
    )


def _sqrt_psd(R: torch.Tensor) -> torch.Tensor:
    """L with L Lᵀ = R (C, n, n), R's negative eigenvalues (a stencil not quite positive) dropped."""
    lam, vec = torch.linalg.eigh(R)
    return vec * lam.clamp_min(0).sqrt()[..., None, :]


def conv_law(x: Field, conv, out: Field, samples: int = 1024, seed: int = 0, atoms: int = ATOMS,
             chunk: int = 1 << 23) -> Law | None:  # fmt: skip
    """The law of ``conv`` (a :class:`conv.Conv`) of ``x`` per output channel and position,
    (C_out, Ho, Wo, atoms), from ``samples`` draws of each output's taps from ``x``'s law and copula
    (scrambled Sobol points of a fixed seed: the same draws at every position; padded taps 0), moved to
    the mean and variance of ``out`` (the conv's output state: exact, a linear map of the input's). The
    input's channels independent, as the state has them; where the input has components
    (:func:`measure_input`), x − m = mix (z − m_z) and z's channels are drawn. None where the conv sums
    :data:`FAN_IN` inputs or more (such a sum is near normal again: a ResNet's 1 × 1 conv of its stem pool's
    64 channels, whose law in the residual add cost more than the rest of ResNet-50's prediction) or ``x``
    has no law."""
    W, stride, padding = conv.W, conv.stride, conv.padding
    src = x if x.components is None else x.components[1]
    if src.law is None or src.shape[0] * W.shape[2] * W.shape[3] >= FAN_IN:
        return None
    if x.components is not None:  # the weights W·mix on z
        W = torch.einsum("oiuv,ir->oruv", W, x.components[0])
    return reshaped(_conv_law(src, W, stride, padding, samples, seed, atoms, chunk), out.mean, out.var)


def _conv_law(x: Field, W, stride, padding, samples, seed, atoms, chunk) -> Law:
    """The law of conv(x, W) (no bias: :func:`conv_law` moves it to the output's mean) by draws."""
    Co, Ci, kh, kw = W.shape
    (sh, sw), (ph, pw) = stride, padding
    Ho, Wo = (x.shape[1] + 2 * ph - kh) // sh + 1, (x.shape[2] + 2 * pw - kw) // sw + 1
    offs = [(a, b) for a in range(kh) for b in range(kw)]
    k = len(offs)
    L = _sqrt_psd(tap_corr(latent_corr(x.law, x.corr), offs)).float()  # (Ci, k, k)
    sobol = torch.quasirandom.SobolEngine(k, scramble=True, seed=seed)
    u = _icdf(sobol.draw(samples, dtype=torch.float64).clamp(1e-7, 1 - 1e-7)).float()  # (S, k) quasi-random
    z = torch.einsum("ckj,sj->cks", L, u)  # (Ci, k, S) the taps' latent draws
    table = on_levels(x.law)
    K = table.shape[-1]
    idx = bins(z, K)  # (Ci, k, S): each draw's bin, the same at every position
    atoms_in = F.pad(table.permute(0, 3, 1, 2), (pw, pw, ph, ph)).float()  # (Ci, K, H + 2p, W + 2p): pad 0
    taps = [atoms_in[:, :, a: a + sh * (Ho - 1) + 1: sh, b: b + sw * (Wo - 1) + 1: sw].reshape(Ci, K, -1)
            for a, b in offs]  # fmt: skip
    Wf = W.flatten(2).float()  # (Co, Ci, k)
    P = Ho * Wo
    step = max(1, chunk // (samples * max(Co, Ci)))
    out = []
    for p0 in range(0, P, step):
        p1 = min(P, p0 + step)
        y = torch.zeros((Co, samples, p1 - p0))
        for j, xa in enumerate(taps):
            v = xa[:, :, p0:p1].gather(1, idx[:, j, :, None].expand(Ci, samples, p1 - p0))  # (Ci, S, p)
            y += torch.einsum("oi,isp->osp", Wf[:, :, j], v)
        out.append(quantile_law(y.transpose(1, 2), atoms))
    return Law(torch.cat([o.x for o in out], 1).reshape(Co, Ho, Wo, atoms),
               torch.cat([o.w for o in out], 1).reshape(Co, Ho, Wo, atoms))
