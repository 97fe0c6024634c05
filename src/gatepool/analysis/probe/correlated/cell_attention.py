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
backward  :mod:`window_attention`'s, within each cell; the three paths independent

Exact per position through the whole (H·W)² covariance of each channel (at most 1024 positions).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.attention import Attention
from gatepool.analysis.probe.correlated.field import _DT
from gatepool.analysis.probe.correlated.window_attention import WindowAttention


class CellAttention(WindowAttention):
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
        self.window, self.shift, self.bias = (1, 1), (0, 0), None
        self.labels = torch.as_tensor(cell, dtype=torch.long).flatten()

    def _cells(self, H: int, W: int) -> None:
        if len(self.labels) != H * W:
            raise ValueError(f"{len(self.labels)} cell labels for a {H}×{W} map")
        self.cell = torch.unique(self.labels, return_inverse=True)[1]  # 0 … n − 1
        self.E = torch.nn.functional.one_hot(self.cell).to(_DT)  # (P, n)
        self.Tc = self.E.sum(0)
        self.same = self.cell[:, None] == self.cell[None, :]
        self.bvar = 0.0
