"""Softmax attention within cells of a map that are any partition of its positions (MobileViT's: the
tokens of each in-patch offset (i, j), the sub-lattice (i + p_h a, j + p_w b) of its patches, one
attention for each): the window attention's rule (:mod:`window_attention`) with the cells given.

cells     a label per position of the (C, H, W) map, c(p); a cell of T_c positions (T_c = 1: the token
          attends to itself alone, o = v, the weights' spread nil)
mixing    per cell, A_ij = (1 + ε_ij)/T_c as :mod:`window_attention`'s without a position bias: E[ε_ij²] =
          κ_i = e^{s_i²} − 1, s_i² = (1/d) Σ_a E[q_ia²] Var_c(k_a); E[ε_ij ε_i'j] = κ_c from the cell's mean
          query; Σ_j ε_ij = 0
forward   o = M v + noise, M the cell average: E[o] = M E[v], Cov_o = M Cov_v Mᵀ + N (N within a cell, its
          token variance · κ/(T_c − 1)), through the projection
backward  ∂L/∂v = Aᵀ G: Mᵀ Cov_G M + N' (N' within a cell, from Σ_i κ_i E[G_i²] and κ_c's pairs); ∂L/∂q
          within a cell, Cov(∂q_ia, ∂q_i'a) = Var_c(k_a)/(d T_c) Σ_b V_cb E[G_ib G_i'b]; ∂k of each key
          independent, 1/(d T_c²) Σ_{i,i'∈c} E[q_ia q_i'a] Σ_b V_cb E[G_ib G_i'b]; the three paths independent

Exact per position through the whole (H·W)² covariance of each channel (at most 1024 positions).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.adaptive import _MAX_POSITIONS
from gatepool.analysis.probe.correlated.add import add_grads
from gatepool.analysis.probe.correlated.attention import Attention, kappa, per_head
from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.positions import covariance, from_covariance


class CellAttention:
    """The softmax attention of ``att`` (an :class:`attention.Attention`: its projections and heads, the
    scores scaled by 1/√d, queries, keys and values of one width) within the cells ``cell`` (H·W,) of
    the map it reads."""

    def __init__(self, att: Attention, cell: torch.Tensor) -> None:
        if type(att) is not Attention or att.kv is not None or att.queries is not None:
            raise NotImplementedError("attention within cells: a plain self-attention only")
        if att.dk != att.dv or abs(att.s2 - 1 / att.dk) > 1e-12:
            raise NotImplementedError("attention within cells: scores scaled by 1/√d, values of their width")
        self.q, self.k, self.v, self.proj = att.q, att.k, att.v, att.out
        self.h, self.d = att.h, att.dk
        self.labels = torch.as_tensor(cell, dtype=torch.long).flatten()

    def _cells(self, H: int, W: int) -> None:
        if len(self.labels) != H * W:
            raise ValueError(f"{len(self.labels)} cell labels for a {H}×{W} map")
        self.cell = torch.unique(self.labels, return_inverse=True)[1]  # 0 … n − 1
        self.E = torch.nn.functional.one_hot(self.cell).to(_DT)  # (P, n)
        self.Tc = self.E.sum(0)
        self.same = self.cell[:, None] == self.cell[None, :]

    def _cell_sums(self, K: torch.Tensor) -> torch.Tensor:
        """(D, n, n): Σ_{i∈c, j∈c'} K_ij of a (D, P, P) matrix."""
        return self.E.T @ K @ self.E

    def _token_var(self, m: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        """(D, n): mean over a cell of E[x²] − E[x̄_c²], of means m (D, P) and covariance K (D, P, P)."""
        Tc = self.Tc
        e2 = (torch.diagonal(K, dim1=1, dim2=2) + m**2) @ self.E / Tc
        within = torch.diagonal(self._cell_sums(K), dim1=1, dim2=2) / Tc**2  # Var x̄_c
        return (e2 - (m @ self.E / Tc) ** 2 - within).clamp_min(0)

    @staticmethod
    def _projected(conv: Conv, x: Field) -> tuple[torch.Tensor, torch.Tensor]:
        """A projection of x: means (D, P) and covariance (D, P, P)."""
        f = conv.forward(x)
        return f.mean.reshape(f.shape[0], -1), covariance(f)

    def forward(self, x: Field) -> Field:
        D, H, W = x.shape
        if H * W > _MAX_POSITIONS:
            raise NotImplementedError(
                f"attention within cells of a {H}×{W} map: at most {_MAX_POSITIONS} positions"
            )
        self._cells(H, W)
        cell, Tc, E = self.cell, self.Tc, self.E
        (mq, Kq), (mk, Kk), (mv, Kv) = (self._projected(conv, x) for conv in (self.q, self.k, self.v))
        self.kt, self.vt = self._token_var(mk, Kk), self._token_var(mv, Kv)  # (D, n)
        eq2 = torch.diagonal(Kq, dim1=1, dim2=2) + mq**2  # (D, P)
        eqbar2 = (mq @ E / Tc) ** 2 + torch.diagonal(self._cell_sums(Kq), dim1=1, dim2=2) / Tc**2  # (D, n)
        self.kappa = kappa(per_head(eq2 * self.kt[:, cell], self.h) / self.d, Tc[cell])  # (D, P)
        mean_kappa = self.kappa @ E / Tc
        self.kappa_c = torch.minimum(kappa(per_head(eqbar2 * self.kt, self.h) / self.d, Tc), mean_kappa)
        self.Q2 = Kq + mq[:, :, None] * mq[:, None, :]  # E[q_i q_i'] (D, P, P)
        C = self._cell_sums(Kv) / (Tc[:, None] * Tc[None, :])  # Cov(v̄_c, v̄_c')
        noise = self.vt / (Tc - 1).clamp_min(1)  # (D, n)
        K = C[:, cell][:, :, cell] + self.same * (noise * self.kappa_c)[:, cell][:, :, None]
        idx = torch.arange(len(cell))
        K[:, idx, idx] += noise[:, cell] * (self.kappa - self.kappa_c[:, cell])
        o = from_covariance((mv @ E / Tc)[:, cell].reshape(D, H, W), K)
        return self.proj.forward(o)

    def backward(self, g: Field) -> Field:
        cell, Tc, E = self.cell, self.Tc, self.E
        G = self.proj.backward(g)
        P = len(cell)
        KG = covariance(G)  # (D, P, P)
        GG = self._cell_sums(KG)  # (D, n, n)
        gd = torch.diagonal(KG, dim1=1, dim2=2)  # E[G_i²] (D, P)
        Gd, Gk = gd @ E, (self.kappa * gd) @ E
        noise = (Gk + self.kappa_c * (torch.diagonal(GG, dim1=1, dim2=2) - Gd)) / Tc**2  # (D, n)
        off = -noise / (Tc - 1).clamp_min(1)
        Kv = GG[:, cell][:, :, cell] / (Tc[cell][:, None] * Tc[cell][None, :])
        Kv += self.same * off[:, cell][:, :, None]
        idx = torch.arange(P)
        Kv[:, idx, idx] += (noise - off)[:, cell]
        Z = per_head(self.vt[:, cell][:, :, None] * KG, self.h) * self.same  # Σ_b V_cb E[G_ib G_i'b]
        Kq = (self.kt / (self.d * Tc))[:, cell][:, :, None] * Z
        vk = ((self.Q2 * Z).sum(2) @ E) / (self.d * Tc**2)  # (D, n)
        Kk = torch.diag_embed(vk[:, cell])
        zero = torch.zeros(G.shape, dtype=_DT)
        q, k, v = (
            conv.backward(from_covariance(zero, K)) for conv, K in ((self.q, Kq), (self.k, Kk), (self.v, Kv))
        )
        return add_grads(add_grads(q, k), v)
