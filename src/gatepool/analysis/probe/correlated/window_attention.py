"""Softmax attention within windows of a map (Swin's ``shifted_window_attention``, torchvision's): the
map padded at its bottom and right to whole windows, optionally rolled back by a cyclic shift, each window
attending within itself, the shifted ones' tokens of different regions masked apart (−100); or within any
cells that are a product of a partition of the rows and one of the columns (MaxViT's grid: the positions
a window's offset apart, ``RelativePositionalMultiHeadAttention`` on its partition's tokens, timm's
``AttentionCl``); or queried by a second input, one window's map of queries for every window (GCViT's
global query: :class:`GlobalQueryWindowAttention`).

cells     the windows partition the padded map's positions into cells, rectangles of the (unrolled)
          map: along a side of n = k w, rows [0, w), [w, 2w) … without a shift; with a shift s, [0, s),
          [s, s + w) … [n − w + s, n) (the rolled last window's two regions, masked apart); a cell of
          T_c positions, the padding's among them (x = 0 there: q, k, v their biases). A grid of step g:
          the rows ≡ r mod g, the columns likewise (a cell of every g-th position). Each position's
          token, its index in its cell (the bias's coordinate)
mixing    per cell, the token attention of :mod:`attention` (its near-uniform model): A_ij = (1 + ε_ij)/T_c,
          E[ε_ij²] = κ_i = e^{s_i²} − 1 for query i, s_i² = c² Σ_a E[q_ia²] Var_c(k_a) + Var_j B_ij (the
          scores' scale c, 1/√d unless given; the relative position bias B, a constant, spread over the
          query's keys); E[ε_ij ε_i'j] = κ_c from the cell's mean query (B's shared part left out);
          Σ_j ε_ij = 0
forward   o = M v + noise, M the cell average: E[o] = M E[v]; per channel Cov_o = M Cov_v Mᵀ + N,
          N_ii' = [c(i) = c(i')] V_c (κ_i δ_ii' + κ_c (1 − δ_ii'))/(T_c − 1),
          V_c = mean_{j∈c} E[v_j²] − E[v̄_c²] (the cell's token variance); then the real positions (the
          padding cropped) through the projection
backward  ∂L/∂v = Aᵀ G: Mᵀ Cov_G M + N', N'_jj' = [c(j) = c(j')] (δ_jj' − (1 − δ_jj')/(T_c − 1)) ·
          (Σ_i κ_i E[G_i²] + κ_c Σ_{i≠i'} E[G_i G_i'])/T_c²; ∂L/∂q and ∂L/∂k as :mod:`attention`'s,
          within each cell: Cov(∂q_ia, ∂q_i'a) = c² Var_c(k_a)/T_c Σ_b V_cb E[G_ib G_i'b], none between
          cells; ∂k of each key independent, E = c²/T_c² Σ_{i,i'∈c} E[q_ia q_i'a] Σ_b V_cb E[G_ib G_i'b];
          the three paths independent, the padding's gradient dropped

Exact per position in the field's model (Cov(x_i, x_j) = √(v_i v_j) ρ(j − i)) without any (P, P) matrix:
the cells are products, so every sum over pairs is one over cells. Within a cell, by lag (the lags at
which a row or column class has a pair: |e| < w along each axis for windows, the multiples of g for a
grid: (2w − 1)² maps of products); between cells, Σ_{i∈c, j∈c'} of the covariance (the cells' means'
covariance, the gradient's cell sums) by FFTs of each cell's √v with ρ; an output's lag sums
T(e) = Σ_{c,c'} K_cc' N_cc'(e) + (its own terms at e = 0), N_cc'(e) = n_rows(a, a', e_h) n_cols(b, b', e_w)
the pairs at lag e between cell c = (a, b) and c' = (a', b'). Memory of (D, cells²) and (D, H, W): Swin-T's
56 × 56 stage (3136 positions, 81 cells) in megabytes.
"""

from __future__ import annotations

import copy

import torch

from gatepool.analysis.probe.correlated.add import add_grads
from gatepool.analysis.probe.correlated.attention import check_plain, kappa, lean, per_head, projections
from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.tokens import OnMap


def _bounds(n: int, w: int, s: int) -> torch.Tensor:
    """(n,): each row's interval along a side of n = k w, shift s (intervals [0, s), [s, s + w) …)."""
    starts = [0] + list(range(s, n, w)) if s else list(range(0, n, w))
    return torch.bucketize(torch.arange(n), torch.tensor(starts[1:], dtype=torch.long), right=True)


def _local(n: int, w: int, s: int) -> torch.Tensor:
    """(n,): each row's index inside its window of the rolled map (the bias table's coordinate)."""
    return ((torch.arange(n) - s) % n) % w


def _lag_pairs(label: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """(k, k, 2n − 1): #{p ∈ class a : p + e ∈ class a'} over the first ``n`` rows (the real map's) of the
    rows' classes ``label``, the lags e from −(n − 1)."""
    one = torch.nn.functional.one_hot(label[:n], k).T.to(_DT)  # (k, n)
    out = torch.zeros((k, k, 2 * n - 1), dtype=_DT)
    for e in range(-(n - 1), n):
        out[:, :, n - 1 + e] = one[:, max(0, -e) : n - max(0, e)] @ one[:, max(0, e) : n + min(0, e)].T
    return out


def _own_lags(pairs: torch.Tensor) -> list[int]:
    """The lags e of :func:`_lag_pairs`'s ``pairs`` (k, k, 2n − 1) at which some class has a pair."""
    n = (pairs.shape[-1] + 1) // 2
    return [e for e in range(1 - n, n) if bool(pairs[:, :, n - 1 + e].diagonal().any())]


def _classes(rows: torch.Tensor) -> torch.Tensor | None:
    """(n,) the class of each of n rows (each a vector of cell labels) where rows of one class are equal
    and rows of two classes share no label; None where they do (the cells are not a product)."""
    _, label = torch.unique(rows, dim=0, return_inverse=True)
    pairs = torch.unique(torch.stack((rows.flatten(), label[:, None].expand_as(rows).flatten())), dim=1)
    return label if len(torch.unique(pairs[0])) == pairs.shape[1] else None  # each label in one class


class _Cells:
    """The cells of a (H, W) map padded to (Hp, Wp): a product of a partition of the rows (classes a) and
    one of the columns (classes b), cell a·n_b + b; each position's index among its cell's tokens
    (``local``: the position bias's coordinate). Windows, shifted or not (Swin's), are intervals of each
    side; a grid (MaxViT's) the residues of each side modulo its step."""

    def __init__(self, H: int, W: int, window, shift) -> None:
        """Windows of ``window`` of the map padded at its bottom and right to whole windows, rolled by
        ``shift``."""
        (wh, ww), (sh, sw) = window, shift
        Hp, Wp = H + (-H) % wh, W + (-W) % ww
        sh, sw = (sh if wh < Hp else 0), (sw if ww < Wp else 0)  # a window over the whole side: no shift
        self.shift = (sh, sw)  # as applied (the timm chain reads it)
        local = _local(Hp, wh, sh)[:, None] * ww + _local(Wp, ww, sw)[None, :]
        self._set(H, W, _bounds(Hp, wh, sh), _bounds(Wp, ww, sw), local)

    @classmethod
    def of(cls, H: int, W: int, cell: torch.Tensor, token: torch.Tensor) -> _Cells:
        """The cells given by a label per position, ``cell`` (H·W,), and each position's index among its
        cell's tokens, ``token`` (H·W,); NotImplementedError where they are not a product of a partition
        of the rows and one of the columns."""
        cell = cell.reshape(H, W)
        ra, cb = _classes(cell), _classes(cell.T)
        if ra is None or cb is None or len(torch.unique(cell)) != (int(ra.max()) + 1) * (int(cb.max()) + 1):
            raise NotImplementedError("attention within cells that are not a product of a partition of "
                                      "the rows and one of the columns")  # fmt: skip
        self = cls.__new__(cls)
        self._set(H, W, ra, cb, token.reshape(H, W))
        return self

    def _set(self, H: int, W: int, ra: torch.Tensor, cb: torch.Tensor, local: torch.Tensor) -> None:
        """From the rows' classes ``ra`` (Hp,) and the columns' ``cb`` (Wp,) of the padded map."""
        self.H, self.W, self.Hp, self.Wp = H, W, len(ra), len(cb)
        self.na, self.nb = int(ra.max()) + 1, int(cb.max()) + 1
        self.n = self.na * self.nb
        self.ra, self.cb, self.local = ra, cb, local
        self.id = ra[:, None] * self.nb + cb[None, :]  # (Hp, Wp)
        sides = torch.bincount(ra, minlength=self.na)[:, None] * torch.bincount(cb, minlength=self.nb)
        self.T = sides.flatten().to(_DT)  # (n,): positions a cell, the padding's counted
        self.nr, self.nc = _lag_pairs(ra, self.na, H), _lag_pairs(cb, self.nb, W)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """(D, Hp, Wp) → (D, n): the sum over each cell."""
        out = torch.zeros((t.shape[0], self.n), dtype=_DT)
        return out.index_add_(1, self.id.flatten(), t.reshape(t.shape[0], -1))

    def at(self, t: torch.Tensor) -> torch.Tensor:
        """(D, n) → (D, Hp, Wp): each position its cell's value."""
        return t[:, self.id]

    def pad(self, t: torch.Tensor, value=0.0) -> torch.Tensor:
        """(D, H, W) → (D, Hp, Wp), ``value`` (a number or (D,)) on the padding."""
        out = torch.zeros((t.shape[0], self.Hp, self.Wp), dtype=_DT)
        out += torch.as_tensor(value, dtype=_DT).reshape(-1, 1, 1)
        out[:, : self.H, : self.W] = t
        return out

    def lags(self):
        """The lags e whose pairs (i, i + e) on the map fall in one cell (|e| < w each axis for windows):
        (e, the slices of i and of i + e over the padded map, the cell of i where i + e is in the same
        cell, else −1)."""
        Hp, Wp = self.Hp, self.Wp
        for eh in _own_lags(self.nr):
            for ew in _own_lags(self.nc):
                i = (slice(max(0, -eh), Hp - max(0, eh)), slice(max(0, -ew), Wp - max(0, ew)))
                j = (slice(max(0, eh), Hp + min(0, eh)), slice(max(0, ew), Wp + min(0, ew)))
                same = torch.where(self.id[i] == self.id[j], self.id[i], -1)
                yield (eh, ew), i, j, same

    def sum_pairs(self, t: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
        """(D, h, w) products of pairs at one lag → (D, n): summed over the pairs within one cell."""
        keep = same.flatten() >= 0
        out = torch.zeros((t.shape[0], self.n + 1), dtype=_DT)
        out.index_add_(1, torch.where(keep, same.flatten(), self.n), t.reshape(t.shape[0], -1))
        return out[:, : self.n]

    def within(self, s: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        """(D, n): Σ_{i, j ∈ c} √(v_i v_j) ρ(j − i) of a field's √v on the padded map (0 on the padding)
        and its correlation at the real map's lags, (D, 2H − 1, 2W − 1)."""
        out = torch.zeros((s.shape[0], self.n), dtype=_DT)
        for (eh, ew), i, j, same in self.lags():
            r = rho[:, self.H - 1 + eh, self.W - 1 + ew, None, None]
            out += self.sum_pairs(s[(slice(None), *i)] * s[(slice(None), *j)] * r, same)
        return out

    def between(self, s: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        """(D, n, n): Σ_{i∈c, j∈c'} √(v_i v_j) ρ(j − i) of √v (D, H, W) and ρ (D, 2H − 1, 2W − 1) on the real
        map: per cell c, y(j) = Σ_{i∈c} √v_i ρ(j − i) by FFTs of 2H − 1 × 2W − 1 (ρ laid out circularly:
        the lags of the map's pairs fall on distinct entries), then Σ_{j∈c'} √v_j y(j)."""
        D, H, W = s.shape
        size = (2 * H - 1, 2 * W - 1)
        spectrum = torch.fft.rfft2(torch.roll(rho, (-(H - 1), -(W - 1)), (1, 2)), s=size)[:, None]
        cell = self.id[:H, :W].flatten()
        ids = sorted(set(cell.tolist()))
        out = torch.zeros((D, self.n, self.n), dtype=_DT)
        for k in range(0, len(ids), 8):  # a few cells at a time: (D, 8, 2H − 1, W) spectra
            some = torch.tensor(ids[k : k + 8])
            u = s.reshape(D, 1, -1) * (cell[None, :] == some[:, None]).to(_DT)  # (D, k, H·W)
            y = torch.fft.irfft2(torch.fft.rfft2(u.reshape(D, -1, H, W), s=size) * spectrum, s=size)
            z = (s[:, None] * y[..., :H, :W]).reshape(D, len(some), -1)
            out[:, some] = torch.zeros((D, len(some), self.n), dtype=_DT).index_add_(2, cell, z)
        return out

    def spread(self, K: torch.Tensor) -> torch.Tensor:
        """(D, n, n) → (D, 2H − 1, 2W − 1): Σ_{c,c'} K_cc' N_cc'(e) over the real positions, each pair
        (i ∈ c, j = i + e ∈ c') given its cells' K."""
        na = self.na
        K5 = K.reshape(K.shape[0], na, self.nb, na, self.nb)
        t = torch.einsum("dabxy,axh->dbyh", K5, self.nr)
        return torch.einsum("dbyh,byw->dhw", t, self.nc)


def _lags_padded(corr: torch.Tensor, Hp: int, Wp: int) -> torch.Tensor:
    """(D, 2H − 1, 2W − 1) → (D, 2Hp − 1, 2Wp − 1): the lags of the larger map, 0 beyond the smaller's."""
    D, h, w = corr.shape
    out = torch.zeros((D, 2 * Hp - 1, 2 * Wp - 1), dtype=_DT)
    out[:, Hp - 1 - h // 2 : Hp + h // 2, Wp - 1 - w // 2 : Wp + w // 2] = corr
    return out


class WindowAttention:
    """Multi-head attention within the (shifted) windows of a (C, H, W) field: the fused (3C, C) qkv and
    (C, C) projection weights, the relative position bias (1 or none, heads, T, T) over a window's (or a
    cell's) T tokens, the scores scaled by ``scale`` (1/√d unless given). ``window=None``: cells the walk
    gives it (:meth:`within`, a partition of the map's regrouped positions: MaxViT's windows and grid),
    its input's ``token_dims`` dims before the channels' its tokens."""

    def __init__(self, qkv_weight, qkv_bias, proj_weight, proj_bias, bias, window, heads: int,
                 shift=(0, 0), scale: float | None = None, token_dims: int = 1) -> None:  # fmt: skip
        self.q, self.k, self.v, self.proj = projections(qkv_weight, qkv_bias, proj_weight, proj_bias, heads)
        self.h, self.d = heads, proj_weight.shape[0] // heads
        self.c2 = 1 / self.d if scale is None else scale**2  # the scores' scale, squared
        self.window, self.shift = (None if window is None else tuple(window)), tuple(shift)
        self.partition = None  # (cell, token) of each position, where the walk gives the cells
        self.token_mix = None  # (D, D): the queries' gradient's Σ_b over a head weighted (the subclass's)
        self.token_dims = token_dims
        self.returns_windows = False  # its module returns the padded map's windows (the walk's chain sets it)
        T = None if bias is None else bias.shape[-1]  # a window's (or a cell's) tokens
        self.bias = None if bias is None else bias.detach().to("cpu", _DT).reshape(heads, T, T)

    def within(self, cell: torch.Tensor, token: torch.Tensor) -> WindowAttention:
        """This attention within the cells ``cell`` (H·W,) of the map, ``token`` (H·W,) each position's index
        among its cell's tokens (the bias's): a copy."""
        out = copy.copy(self)
        out.partition = cell, token
        return out

    def _cells(self, H: int, W: int) -> _Cells:
        if self.partition is not None:
            return _Cells.of(H, W, *self.partition)
        if self.window is None:
            raise NotImplementedError("a window attention without windows of its own, not on a partition's "
                                      "tokens: no cells")  # fmt: skip
        return _Cells(H, W, self.window, self.shift)

    def _bias_spread(self, c: _Cells) -> torch.Tensor | float:
        """(D, Hp, Wp): Var_j B_ij over each query's keys (its cell), at its head's channels."""
        if self.bias is None:
            return 0.0
        out = torch.zeros((self.h, c.Hp * c.Wp), dtype=_DT)
        cell, local = c.id.flatten(), c.local.flatten()
        for k in range(c.n):
            at = (cell == k).nonzero()[:, 0]
            ix = local[at]
            B = self.bias[:, ix][:, :, ix]  # (heads, T_c, T_c)
            out[:, at] = ((B**2).mean(2) - B.mean(2) ** 2).clamp_min(0)
        return out.reshape(self.h, c.Hp, c.Wp).repeat_interleave(self.d, 0)

    def _padded(self, conv, x: Field, c: _Cells):
        """A projection of x on the padded map: its field, means (D, Hp, Wp) (its bias on the padding),
        √v (0 there) and ρ at the real map's lags."""
        f = conv.forward(x)
        m = c.pad(f.mean, 0.0 if conv.b is None else conv.b)
        return f, m, c.pad(f.var.clamp_min(0).sqrt()), f.corr

    def _token_var(self, c: _Cells, m: torch.Tensor, s: torch.Tensor, within: torch.Tensor) -> torch.Tensor:
        """(D, n): mean over a cell of E[x²] − E[x̄_c²]."""
        e2 = c.sum(s**2 + m**2) / c.T
        return (e2 - (c.sum(m) / c.T) ** 2 - within / c.T**2).clamp_min(0)

    def forward(self, x: Field) -> Field:
        D, H, W = x.shape
        self.c = c = self._cells(H, W)
        return self._attend(x, *self._padded(self.q, x, c)[1:])

    def _attend(self, x: Field, mq: torch.Tensor, sq: torch.Tensor, rq: torch.Tensor) -> Field:
        """The output from x's keys and values and the queries' means and √v (D, Hp, Wp) on the padded map
        and their correlation ρ (D, 2H − 1, 2W − 1)."""
        c, (H, W) = self.c, x.shape[1:]
        Tc = c.T
        _, mk, sk, rk = self._padded(self.k, x, c)
        fv, mv, sv, rv = self._padded(self.v, x, c)
        self.kt = self._token_var(c, mk, sk, c.within(sk, rk))
        Sv = c.between(fv.var.clamp_min(0).sqrt(), rv)  # (D, n, n)
        self.vt = self._token_var(c, mv, sv, torch.diagonal(Sv, dim1=1, dim2=2))
        eq2 = sq**2 + mq**2  # (D, Hp, Wp)
        eqbar2 = (c.sum(mq) / Tc) ** 2 + c.within(sq, rq) / Tc**2  # (D, n)
        s2 = per_head(eq2 * c.at(self.kt), self.h) * self.c2 + self._bias_spread(c)
        self.kappa = kappa(s2, c.at(Tc[None])[0])  # (D, Hp, Wp)
        self.lean = lean(s2, c.at(Tc[None])[0])
        mean_kappa = c.sum(self.kappa) / Tc
        self.kappa_c = torch.minimum(kappa(per_head(eqbar2 * self.kt, self.h) * self.c2, Tc), mean_kappa)
        self.mq, self.sq, self.rq = mq, sq, rq
        C = Sv / (Tc[:, None] * Tc[None, :])  # Cov(v̄_c, v̄_c')
        noise = self.vt / (Tc - 1).clamp_min(1)  # (D, n)
        cut = (slice(None), slice(0, H), slice(0, W))
        own = c.at(noise) * (self.kappa - c.at(self.kappa_c))  # a position's own, beyond its cell's
        T = c.spread(C + torch.diag_embed(noise * self.kappa_c))
        T[:, H - 1, W - 1] += own[cut].sum((1, 2))
        # every position of the padded map, the padding's too (the windows' tokens a module returns)
        cells = torch.diagonal(C, dim1=1, dim2=2) + noise * self.kappa_c
        self.padded = c.at(c.sum(mv) / Tc), c.at(cells) + own
        o = _field_from_sums(self.padded[0][cut], self.padded[1][cut], T)
        return self.proj.forward(self._linear_in_queries(o))

    def _linear_in_queries(self, o: Field) -> Field:
        """The heads' output before the projection plus its part linear in the queries: none here (the
        keys' and values' shared covariance, of order T/D of the mixing's noise, left out where the
        queries are x's own; :class:`GlobalQueryWindowAttention` adds it)."""
        return o

    def as_module(self, y: Field | None, g: Field | None) -> tuple[Field | None, Field | None]:
        """The module's own output for its row where it is the padded map's windows (timm's DaViT and
        TinyViT, Swin at a side that is not whole windows): the padding's queries' outputs too (through the
        projection, a 1×1 conv: per position exact) and a zero gradient there; ``y`` and ``g`` the real
        map's (returned as they are where the map is whole windows, or the module crops them itself:
        torchvision's ``ShiftedWindowAttention``, Twins' ``LocallyGroupedAttn``)."""
        c = self.c
        if y is None or not self.returns_windows or (c.Hp, c.Wp) == (c.H, c.W):
            return y, g
        mean, var = self.padded
        W = self.proj.weight[:, :, 0, 0]
        b = 0.0 if self.proj.b is None else self.proj.b[:, None, None]
        out = Field(torch.einsum("oc,chw->ohw", W, mean) + b, torch.einsum("oc,chw->ohw", W**2, var),
                    _lags_padded(y.corr, c.Hp, c.Wp))  # fmt: skip
        grad = None if g is None else Field(c.pad(g.mean), c.pad(g.var), _lags_padded(g.corr, c.Hp, c.Wp))
        return out, grad

    def backward(self, g: Field) -> Field:
        (vq, Tq), gk, gv = self._grads(g)
        gq = _field_from_sums(torch.zeros_like(vq), vq, Tq)
        q, k, v = (conv.backward(f) for conv, f in ((self.q, gq), (self.k, gk), (self.v, gv)))
        return add_grads(add_grads(q, k), v)

    def _grads(self, g: Field):
        """The gradients at the queries (their variance (D, H, W) and lag sums, the pairs within a cell),
        the keys and the values (fields) from the output's ``g``."""
        c, Tc = self.c, self.c.T
        H, W = c.H, c.W
        G = self.proj.backward(g)
        D = G.shape[0]
        sG = G.var.clamp_min(0).sqrt()
        GG = c.between(sG, G.corr)  # (D, n, n): Σ_{i∈c, j∈c'} E[G_i G_j] (the padding's outputs are cut)
        gd = c.pad(G.var.clamp_min(0))  # E[G_i²] (D, Hp, Wp)
        Gd, Gk = c.sum(gd), c.sum(self.kappa * gd)
        noise = (Gk + self.kappa_c * (torch.diagonal(GG, dim1=1, dim2=2) - Gd)) / Tc**2  # (D, n)
        off = -noise / (Tc - 1).clamp_min(1)
        cut = (slice(None), slice(0, H), slice(0, W))
        T = c.spread(GG / (Tc[:, None] * Tc[None, :]) + torch.diag_embed(off))
        T[:, H - 1, W - 1] += c.at(noise - off)[cut].sum((1, 2))
        var = c.at(torch.diagonal(GG, dim1=1, dim2=2) / Tc**2 + noise)[cut]
        zero = torch.zeros((D, H, W), dtype=_DT)
        gv = _field_from_sums(zero, var, T)
        # ∂q: within a cell, Cov(∂q_ia, ∂q_i'a) = c² Var_c(k_a)/T_c Σ_b V_cb E[G_ib G_i'b] (b in a's head)
        # ∂k: E = c²/T_c² Σ_{i,i'∈c} E[q_ia q_i'a] Σ_b V_cb E[G_ib G_i'b]
        alpha = self.kt * self.c2 / Tc  # (D, n)
        sGp = c.pad(sG)
        Tq = torch.zeros((D, 2 * H - 1, 2 * W - 1), dtype=_DT)
        vk = torch.zeros((D, c.n), dtype=_DT)
        every = slice(None)
        for (eh, ew), i, j, same in c.lags():
            KG = sGp[(every, *i)] * sGp[(every, *j)] * G.corr[:, H - 1 + eh, W - 1 + ew, None, None]
            where = same.clamp_min(0)
            Z = per_head(self.vt[:, where] * KG, self.h)  # Σ_b V_cb E[G_ib G_(i+e)b], (D, h, w)
            Zq = Z if self.token_mix is None else self._mixed(self.vt[:, where] * KG)
            Tq[:, H - 1 + eh, W - 1 + ew] = c.sum_pairs(Zq * alpha[:, where], same).sum(1)
            rq = self.rq[:, H - 1 + eh, W - 1 + ew, None, None]
            Q2 = self.sq[(every, *i)] * self.sq[(every, *j)] * rq
            Q2 += self.mq[(every, *i)] * self.mq[(every, *j)]
            vk += c.sum_pairs(Q2 * Z, same)
        VG = c.at(self.vt)[cut] * G.var.clamp_min(0)
        vq = c.at(alpha)[cut] * (per_head(VG, self.h) if self.token_mix is None else self._mixed(VG))
        vk = c.at(vk * self.c2 / Tc**2)[cut]
        Tk = torch.zeros((D, 2 * H - 1, 2 * W - 1), dtype=_DT)
        Tk[:, H - 1, W - 1] = vk.sum((1, 2))
        return (vq, Tq), _field_from_sums(zero, vk, Tk), gv


def _token_pairs(n: int, w: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per lag e from −(n − 1) along a side of n = k w in windows of w, each (w,) over the tokens a: how
    many positions i ≡ a (mod w) have i + e on the side, the token of i + e, and its offset from a."""
    a = torch.arange(w)
    out = []
    for e in range(1 - n, n):
        count = torch.tensor([sum(0 <= r + e < n for r in range(t, n, w)) for t in range(w)])
        partner = (a + e) % w
        out.append((count, partner, partner - a))
    return out


class GlobalQueryWindowAttention(WindowAttention):
    """A window attention whose queries are a second input (GCViT's global query): a (D, h, w) map of one
    window's h·w tokens (row by row), every window of the sample's its queries, unprojected; the keys and
    values x's own, by a fused (2D, D) projection.

    shared    near uniform, o_ib − (M v)_ib ≈ (c/T) Σ_j (q_i · (k_j − k̄)) (v_jb − v̄_b) = c Σ_a q_ia Ŝ_ab,
              Ŝ the window's sample covariance of keys and values; its mean μ_ab = (W_k Σ W_vᵀ)_ab (Σ the
              expected sample covariance of x's channels within a window: the variance less the window
              mean's, and the means' spread about the window's; a and b of one head) is the same in every
              window (μ the windows' average), so o has a part linear in the queries, c Σ_a μ_ab q_ia,
              correlated across the windows as their tokens' queries are one (μ times the weights' lean
              ℓ(s², T) at the head's mean over its positions, as the plain rule's); the rest, Ŝ − μ, is the
              mixing's noise. Of order T/D of that noise in one window; with queries shared by many
              windows it is most of the queries' gradient where G is one over the map (a global pool's)
    forward   as :class:`WindowAttention`'s, the queries' means, variances and correlations at each
              position those of its token on the query map (the correlations within a window: the lags
              of its pairs are the query map's), plus the linear part (its pairs across windows: at
              tokens t(i), t(i + e), lag t(i + e) − t(i) on the query map)
    backward  the keys' and values' to x (as :class:`WindowAttention`'s: the two paths independent,
              their cross term through Cov(k_j, v_j), coherent over the queries' mean, left out); the
              queries' summed over the windows. The noise's per token the variances of its positions (no
              covariance between cells), the lag sums those within the windows, which are the query map's
              own, Var(Ŝ_ab) with the window's tokens correlated: tr(K_a V_b)/T² of the keys' and values'
              centred covariance matrices over the T tokens, where the base rule's Var_c(k_a) V_cb/T is
              tr K_a tr V_b/T³ (:meth:`_token_factors`), and its Cov(k_a, v_b)² part, μ_ab²/T, within
              each window; the linear part's, c Σ_b μ_ab G_ib, whose sum over the windows is
              c² Σ_b μ_ab² Σ_{p∈t, p'∈t'} E[G_pb G_p'b] between tokens t, t' (G's channels independent,
              as the state has them)
    """

    arity = 2  # the walk's inputs: the map's tokens, then the queries

    def __init__(self, kv_weight, kv_bias, proj_weight, proj_bias, bias, heads: int, token_dims: int = 1
                 ) -> None:  # fmt: skip
        D = proj_weight.shape[0]
        kv_weight = kv_weight.detach()
        qkv_weight = torch.cat((torch.zeros_like(kv_weight[:D]), kv_weight))  # no queries of x: unused
        qkv_bias = None if kv_bias is None else torch.cat((torch.zeros_like(kv_bias[:D]), kv_bias.detach()))
        super().__init__(qkv_weight, qkv_bias, proj_weight, proj_bias, bias, None, heads,
                         token_dims=token_dims)  # fmt: skip
        self.q = None

    def forward(self, xs: list[Field]) -> Field:
        x, queries = xs
        D, H, W = x.shape
        self.c = c = self._cells(H, W)
        self.query_shape = h, w = queries.shape[1:]
        if queries.shape[0] != D or not bool((c.T == h * w).all()):
            raise NotImplementedError(f"queries of {tuple(queries.shape)} for windows of {int(c.T.max())} "
                                      f"tokens of {D} channels")  # fmt: skip
        self.mu, self.queries = self._shared_covariance(x), queries
        self.token_mix = self._token_factors(x)
        mean, sd = (t.reshape(D, h * w)[:, c.local] for t in (queries.mean, queries.var.clamp_min(0).sqrt()))
        return self._attend(x, mean, sd, _lags_padded(queries.corr, H, W))  # each position its token's

    def _linear_in_queries(self, o: Field) -> Field:
        """o + c μᵀ q, each position's queries its token's (q independent of x: no cross term)."""
        q, (D, H, W), (h, w) = self.queries, o.shape, self.query_shape
        mu = self._leaning()
        L2 = self.c2 * mu.T**2  # (D_b, D_a): the linear part's weights, squared
        tokens = self.c.local[:H, :W]
        at = lambda t: t.reshape(D, -1)[:, tokens]  # noqa: E731 - (D, h, w) → (D, H, W): each position its token's
        mean = o.mean + torch.einsum("ba,ahw->bhw", self.c2**0.5 * mu.T, at(q.mean))
        var = o.var + torch.einsum("ba,ahw->bhw", L2, at(q.var))
        sq = q.var.clamp_min(0).sqrt()
        T = o.corr * xcorr(o.var.clamp_min(0).sqrt(), o.var.clamp_min(0).sqrt())  # o's lag sums
        rows, cols = _token_pairs(H, h), _token_pairs(W, w)
        for eh, (nr, ar, dh) in enumerate(rows, 1 - H):  # pairs (i, i + e) at tokens t and t', so many
            for ew, (nc, br, dw) in enumerate(cols, 1 - W):
                rho = q.corr[:, h - 1 + dh[:, None], w - 1 + dw[None, :]]
                pairs = sq * sq[:, ar][:, :, br] * rho * (nr[:, None] * nc[None, :])  # (D, h, w)
                T[:, H - 1 + eh, W - 1 + ew] += L2 @ pairs.sum((1, 2))
        return _field_from_sums(mean, var, T)

    def _leaning(self) -> torch.Tensor:
        """μ's rows times the weights' lean ℓ(s², T) (:func:`softmax_spread.lean`), each head's over its
        positions: the linear part saturates as the weights concentrate."""
        return self.mu * self.lean.mean((1, 2))[:, None]

    def _shared_covariance(self, x: Field) -> torch.Tensor:
        """(D, D): μ_ab = E[Ŝ_ab], the keys' and values' sample covariance in a window (a and b of one head;
        0 across heads), averaged over the windows."""
        c, D = self.c, x.shape[0]
        s = c.pad(x.var.clamp_min(0).sqrt())
        var = (c.sum(s**2) / c.T - c.within(s, x.corr) / c.T**2).mean(1)  # (D,)
        m = c.pad(x.mean)
        dm = (m - c.at(c.sum(m) / c.T)).reshape(D, -1)  # each position's mean less its window's
        sigma = torch.diag(var) + dm @ dm.T / dm.shape[1]
        Wk, Wv = self.k.weight[:, :, 0, 0], self.v.weight[:, :, 0, 0]
        head = torch.arange(D) // self.d
        return (Wk @ sigma @ Wv.T) * (head[:, None] == head[None, :])

    def _mixed(self, t: torch.Tensor) -> torch.Tensor:
        """(D, ...) → (D, ...): Σ_b f_ab t_b over the head of a (:meth:`_token_factors`)."""
        return torch.einsum("ab,b...->a...", self.token_mix, t)

    def _token_factors(self, x: Field) -> torch.Tensor:
        """(D, D): f_ab = T tr(K_a V_b) / (tr K_a tr V_b), K_a and V_b the keys' and values' correlation
        matrices over a window's T tokens (the fields' ρ at the tokens' lags: the variance taken the
        same over a window), centred (P ρ P, P = I − 1/T): the base rule's Var(Ŝ_ab) times f_ab is
        tr(K_a V_b)/T² (independent tokens: f = T/(T − 1)); a and b of one head, else 0."""
        (D, H, W), (h, w) = x.shape, self.query_shape
        at = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")).reshape(2, -1)
        dh, dw = at[0][None, :] - at[0][:, None], at[1][None, :] - at[1][:, None]
        K, V = (conv.forward(x).corr[:, H - 1 + dh, W - 1 + dw] for conv in (self.k, self.v))  # (D, T, T)
        K, V = (R - R.mean(1, True) - R.mean(2, True) + R.mean((1, 2), True) for R in (K, V))
        trace = lambda R: torch.diagonal(R, dim1=1, dim2=2).sum(1)  # noqa: E731
        f = h * w * torch.einsum("aij,bij->ab", K, V) / (trace(K)[:, None] * trace(V)[None, :])
        head = torch.arange(D) // self.d
        return f * (head[:, None] == head[None, :])

    def _within_windows(self, s: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        """(D, hw·hw): Σ over the windows of Σ_{p at token t, p' at t'} √(v_p v_p') ρ(p' − p), p and p' in one
        window (:meth:`_Cells.between` by token takes the pairs across the windows too)."""
        c, D, T = self.c, s.shape[0], self.query_shape[0] * self.query_shape[1]
        sp, token = c.pad(s), c.local
        out = torch.zeros((D, T * T), dtype=_DT)
        for (eh, ew), i, j, same in c.lags():
            r = rho[:, c.H - 1 + eh, c.W - 1 + ew, None, None]
            pairs = (token[i] * T + token[j])[same >= 0]
            out.index_add_(1, pairs, (sp[(slice(None), *i)] * sp[(slice(None), *j)] * r)[:, same >= 0])
        return out

    def backward(self, g: Field) -> list[Field]:
        (vq, Tq), gk, gv = self._grads(g)
        D, H, W = vq.shape
        h, w = self.query_shape
        var = torch.zeros((D, h * w), dtype=_DT)
        var.index_add_(1, self.c.local[:H, :W].flatten(), vq.reshape(D, -1))  # over the windows
        T = Tq[:, H - h : H + h - 1, W - w : W + w - 1].clone()  # the lags within a window
        # the part the windows share: Σ_b μ_ab² K_b(t, t'), K_b of G's positions grouped by token
        G = self.proj.backward(g)
        tokens = _Cells.of(H, W, self.c.local[:H, :W].flatten(), torch.zeros(H * W, dtype=torch.long))
        sG = G.var.clamp_min(0).sqrt()
        K = tokens.between(sG, G.corr).reshape(D, -1) + self._within_windows(sG, G.corr) / (h * w)
        shared = (self.c2 * self._leaning() ** 2 @ K).reshape(D, h, w, h, w)  # by a
        var += torch.diagonal(shared.reshape(D, h * w, h * w), dim1=1, dim2=2)
        for eh in range(1 - h, h):
            for ew in range(1 - w, w):
                i, j = slice(max(0, -eh), h - max(0, eh)), slice(max(0, -ew), w - max(0, ew))
                k, l = slice(max(0, eh), h + min(0, eh)), slice(max(0, ew), w + min(0, ew))
                T[:, h - 1 + eh, w - 1 + ew] += torch.einsum("dabab->d", shared[:, i, j, k, l])
        q = _field_from_sums(torch.zeros((D, h, w), dtype=_DT), var.reshape(D, h, w), T)
        return [add_grads(self.k.backward(gk), self.v.backward(gv)), q]


@register_named_rule("torchvision.models.swin_transformer.shifted_window_attention")
def shifted_window_attention_rule(
    input, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads, shift_size,
    attention_dropout=0.0, dropout=0.0, qkv_bias=None, proj_bias=None, logit_scale=None, training=True,
) -> WindowAttention:  # fmt: skip
    """torchvision's ``shifted_window_attention`` (Swin): its arguments as the call passes them."""
    if logit_scale is not None:
        raise NotImplementedError("Swin V2's cosine attention (logit_scale): scores of spread τ²/d, far "
                                  "from uniform at init (τ = 10), beyond the near-uniform model")  # fmt: skip
    if training and (attention_dropout or dropout):
        raise NotImplementedError("window attention with dropout")
    return WindowAttention(qkv_weight, qkv_bias, proj_weight, proj_bias, relative_position_bias,
                           window_size, num_heads, shift_size)  # fmt: skip


@register_named_rule("timm.models.twins.LocallyGroupedAttn")
def locally_grouped_attention_rule(m) -> OnMap:
    """timm's Twins ``LocallyGroupedAttn``: the tokens' map padded at its bottom and right to whole windows
    of ``ws`` × ``ws``, attention within each, no shift and no position bias, cropped, proj; called with
    the map's size (:class:`OnMap`)."""
    dim, heads = m.qkv.in_features, m.num_heads
    check_plain(m, dim)
    ws = (m.ws, m.ws)
    return OnMap(WindowAttention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, None, ws, heads))


@register_named_rule("timm.models.swin_transformer.WindowAttention")
def swin_window_attention_rule(m) -> WindowAttention:
    """timm's Swin ``WindowAttention``: its fused qkv and proj, the relative position bias of its table;
    called on the windows' tokens of a channels-last map, which the walk reads as the map itself (the
    partition, the roll and the mask: the shift, set there)."""
    dim, heads = m.qkv.in_features, m.num_heads
    if m.qkv.out_features != 3 * dim or m.proj.in_features != dim:
        raise NotImplementedError("Swin WindowAttention whose heads are not the embedding's width")
    check_plain(m, dim)
    with torch.no_grad():
        bias = m._get_rel_pos_bias()
    return WindowAttention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, bias, m.window_size, heads)


@register_named_rule("timm.models.davit.WindowAttention")
def davit_window_attention_rule(m) -> WindowAttention:
    """timm's DaViT ``WindowAttention``: its fused qkv and proj, no position bias, no shift; called on the
    windows' tokens of a channels-last map, which the walk reads as the map itself."""
    dim, heads = m.qkv.in_features, m.num_heads
    if m.qkv.out_features != 3 * dim or m.proj.in_features != dim:
        raise NotImplementedError("DaViT WindowAttention whose heads are not the embedding's width")
    if abs(m.scale - (dim // heads) ** -0.5) > 1e-12:
        raise NotImplementedError("DaViT WindowAttention with its own scale")
    return WindowAttention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, None, m.window_size, heads)


@register_named_rule("torchvision.models.maxvit.RelativePositionalMultiHeadAttention")
def maxvit_attention_rule(m) -> WindowAttention:
    """torchvision's MaxViT ``RelativePositionalMultiHeadAttention`` of (B, G, P, D) tokens: its fused
    to_qkv and merge, the relative position bias of its table, the scores scaled by 1/√D (the width's, not
    a head's); within the cells the walk reads off its input's layout (the block's windows, or its grid:
    the tokens a window's offset across the windows)."""
    with torch.no_grad():
        bias = m.get_relative_positional_bias()
    return WindowAttention(m.to_qkv.weight, m.to_qkv.bias, m.merge.weight, m.merge.bias, bias, None,
                           m.n_heads, scale=m.scale_factor)  # fmt: skip


@register_named_rule("timm.models.maxxvit.AttentionCl")
def maxxvit_attention_rule(m) -> WindowAttention:
    """timm's MaxViT ``AttentionCl`` of (N, h, w, C) tokens (a window, or a cell of the grid, of h × w):
    its fused qkv (ordered head by head, q, k and v within each, where ``head_first``) and proj, the
    relative position bias of its ``rel_pos`` (``get_bias``, over the h·w tokens row by row); within the
    cells the walk reads off its input's layout."""
    dim, heads, d = m.qkv.in_features, m.num_heads, m.dim_head
    if m.qkv.out_features != 3 * dim or m.proj.in_features != dim or heads * d != dim:
        raise NotImplementedError("MaxViT AttentionCl whose heads are not the embedding's width")
    check_plain(m, dim)
    w, b = m.qkv.weight, m.qkv.bias
    if m.head_first:  # (head, q/k/v, d) → (q/k/v, head, d), the order of torch's fused qkv
        order = torch.arange(3 * dim).reshape(heads, 3, d).transpose(0, 1).flatten()
        w, b = w[order], (None if b is None else b[order])
    with torch.no_grad():
        bias = None if m.rel_pos is None else m.rel_pos.get_bias()
    return WindowAttention(w, b, m.proj.weight, m.proj.bias, bias, None, heads, token_dims=2)


@register_named_rule("timm.models.gcvit.WindowAttentionGlobal")
def gcvit_window_attention_rule(m) -> WindowAttention:
    """timm's GCViT ``WindowAttentionGlobal`` of (N, T, C) window tokens, called with the stage's global
    query map too: its local blocks' fused qkv (that map not read), its global blocks' fused kv and the
    queries that map's (:class:`GlobalQueryWindowAttention`); the relative position bias of its
    ``rel_pos``, the proj; within the cells the walk reads off its input's layout."""
    dim, heads = m.proj.in_features, m.num_heads
    check_plain(m, dim)
    with torch.no_grad():
        bias = m.rel_pos.get_bias()
    if m.qkv.out_features != (2 if m.use_global else 3) * dim:
        raise NotImplementedError("GCViT WindowAttentionGlobal whose heads are not the embedding's width")
    if m.use_global:
        return GlobalQueryWindowAttention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, bias, heads)
    step = WindowAttention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, bias, None, heads)
    step.arity = 1  # the global queries passed beside its input: not read
    return step
