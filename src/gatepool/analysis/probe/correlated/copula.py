"""The joint law of a max pool's neighbouring windows (``Field.copula``), and what it gives the ReLU after
the norm.

Neighbouring windows of a k × k pool at stride s < k share taps (a 3 × 3 pool at stride 2: a row or a
column), so their maxima are dependent in the upper tail: both are large when the shared tap is. A
Gaussian copula of the maxima's correlation (:mod:`law`) has no tail dependence, and the ReLU after the
norm (DenseNet's, of its stem pool) gets the covariance of its neighbours too low. The pool draws the
pairs (M_P, M_{P+Δ}) jointly (``MaxPool._joint``); each draw's rank among its window's S draws puts it in
one of K bins of u (edges at the rank counts 1, 2, 4, 8 from each end, else every S/32): per channel c
and neighbour lag Δ the table

    π_c(Δ)[i, j] = the share of the draws, over the channel's windows, with M_P in bin i, M_{P+Δ} in bin j

(its margins the bins' masses, exactly: each window's ranks fill every bin). An increasing map per
channel keeps it (a norm's affine map, γ > 0; a channel of γ ≤ 0 drops it); a cat stacks the channels'
tables, a channel without one all zeros. The ReLU after reads it with the marginal law
(``Field.law``, each position's quantile function Q_P): with r_P(i) the mean of ReLU(Q_P(u)) and
h_P(i) that of 1[Q_P(u) > 0] over bin i,

    E[ReLU(x_P) ReLU(x_{P+Δ})] = Σ_ij π(Δ)[i, j] r_P(i) r_{P+Δ}(j),   P(x_P > 0, x_{P+Δ} > 0) = Σ_ij π h h

(each cell's two values independent given their bins), at the pool's neighbour lags; the Gaussian
copula at the other lags.

    rank_edges   the bins' edges in ranks of S draws
    Counter      the tables from the pool's joint draws, chunk by chunk
    moved        the tables through a per-channel affine map (a norm's)
    stacked      the tables of a cat's inputs
    relu_pairs   E[ReLU ReLU] and P(both > 0) of each pair at the tables' lags
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gatepool.analysis.probe.correlated.field import _DT, _valid
from gatepool.analysis.probe.correlated.law import levels, on_levels
from gatepool.analysis.probe.correlated.normal import Law


@dataclass
class Copula:
    """``edges`` (K + 1,) the bins' edges in u; ``tables`` {lag Δ: (C, K, K)} π(Δ) (a channel without one:
    zeros), Δ one of ±Δ (the pair (P + Δ, P) is the table transposed)."""

    edges: torch.Tensor
    tables: dict


def rank_edges(samples: int) -> torch.Tensor:
    """The bins' edges in ranks of ``samples`` draws (long): every S/32, and 1, 2, 4, 8 from each end
    (the tails, where one body bin would hold the largest maxima)."""
    ends = [t for t in (1, 2, 4, 8) if t < samples]
    edges = set(range(0, samples + 1, max(1, samples // 32))) | set(ends) | {samples - t for t in ends}
    return torch.tensor(sorted(edges | {samples}), dtype=torch.long)


class Counter:
    """The tables of one lag, from the pool's joint draws (``add`` chunk by chunk, each chunk's rows
    windows of one channel, ``per`` windows a channel, in order). A draw's rank is its place among its
    window's draws; ties (draws from a law's atoms) are broken by a fixed permutation of the draws, a
    different one for each window of the pair."""

    def __init__(self, channels: int, per: int, samples: int, seed: int = 0) -> None:
        self.per, self.row = per, 0
        edges = rank_edges(samples)
        self.K = len(edges) - 1
        self.u = edges.to(_DT) / samples
        self.bin = torch.bucketize(torch.arange(samples), edges[1:-1], right=True)  # (S,) rank → bin
        g = torch.Generator().manual_seed(seed)
        self.perm = [torch.randperm(samples, generator=g) for _ in range(2)]
        self.counts = torch.zeros((channels, self.K * self.K), dtype=_DT)

    def _bins(self, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        """(t, S) the bin of each draw's rank in its row of ``x`` (t, S)."""
        order = perm[x[:, perm].argsort(dim=1, stable=True)]  # the draw at each rank
        return torch.empty_like(order).scatter_(1, order, self.bin.expand_as(order))

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """The draws (t, S) of windows P (``a``) and P + Δ (``b``), one row a pair of windows."""
        c = self.row // self.per
        code = self._bins(a, self.perm[0]) * self.K + self._bins(b, self.perm[1])
        self.counts[c] += torch.bincount(code.flatten(), minlength=self.K * self.K).to(_DT)
        self.row += a.shape[0]

    def table(self) -> torch.Tensor:
        """(C, K, K) π(Δ)."""
        t = self.counts / self.counts.sum(-1, keepdim=True).clamp_min(1)
        return t.reshape(-1, self.K, self.K)


def moved(cop: Copula | None, scale: torch.Tensor) -> Copula | None:
    """``cop`` through y = a_c x + b per channel (``scale`` a (C,)): kept where a_c > 0, dropped elsewhere."""
    if cop is None:
        return None
    keep = (scale > 0).to(_DT)[:, None, None]
    return Copula(cop.edges, {e: t * keep for e, t in cop.tables.items()})


def stacked(cops: list[Copula | None], channels: list[int]) -> Copula | None:
    """The tables of a cat of fields of ``channels`` channels each, in order (zeros where one has none);
    None where none has one or their bins differ."""
    have = [c for c in cops if c is not None]
    if not have or any(not torch.equal(c.edges, have[0].edges) for c in have):
        return None
    K = len(have[0].edges) - 1
    lags = sorted({e for c in have for e in c.tables})
    zero = [torch.zeros((n, K, K), dtype=_DT) for n in channels]
    return Copula(have[0].edges, {e: torch.cat([z if c is None or e not in c.tables else c.tables[e]
                                               for c, z in zip(cops, zero)]) for e in lags})  # fmt: skip


def _bin_means(law: Law, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, h) (C, H, W, K): the means of ReLU(Q(u)) and 1[Q(u) > 0] over each bin of ``edges`` in u, Q the
    step quantile function of ``law`` (on the bins of :func:`law.levels`: one overlap matrix for all)."""
    x = on_levels(law)
    u = levels(x.shape[-1])
    lo = torch.maximum(edges[:-1, None], u[None, :-1])
    hi = torch.minimum(edges[1:, None], u[None, 1:])
    share = (hi - lo).clamp_min(0) / edges.diff()[:, None]  # (K, atoms)
    return x.clamp_min(0) @ share.T, (x > 0).to(_DT) @ share.T


def relu_pairs(cop: Copula, law: Law):
    """[(Δ, channels, E[ReLU(x_P) ReLU(x_{P+Δ})], P(x_P > 0, x_{P+Δ} > 0))] over the valid P ((n, h, w)
    each), the channels those with a table at Δ."""
    r, h = _bin_means(law, cop.edges)
    out = []
    for (dh, dw), t in cop.tables.items():
        idx = torch.nonzero(t.sum((1, 2)) > 0.5).flatten()
        if not len(idx):
            continue
        pi = t[idx]
        pairs = []
        for f in (r[idx], h[idx]):
            a, b = _valid(f.permute(0, 3, 1, 2), dh, dw)  # (n, K, h, w)
            pairs.append(torch.einsum("nihw,nij,njhw->nhw", a, pi, b))
        out.append(((dh, dw), idx, *pairs))
    return out
