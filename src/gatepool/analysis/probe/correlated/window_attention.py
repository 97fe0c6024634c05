"""Softmax attention within windows of a map (Swin's ``shifted_window_attention``, torchvision's): the
map padded at its bottom and right to whole windows, optionally rolled back by a cyclic shift, each window
attending within itself, the shifted ones' tokens of different regions masked apart (−100).

cells     the windows partition the padded map's positions into cells, rectangles of the (unrolled)
          map: along a side of n = k w, rows [0, w), [w, 2w) … without a shift; with a shift s, [0, s),
          [s, s + w) … [n − w + s, n) (the rolled last window's two regions, masked apart); a cell of
          T_c positions, the padding's among them (x = 0 there: q, k, v their biases)
mixing    per cell, the token attention of :mod:`attention` (its near-uniform model): A_ij = (1 + ε_ij)/T_c,
          E[ε_ij²] = κ_i = e^{s_i²} − 1 for query i, s_i² = (1/d) Σ_a E[q_ia²] Var_c(k_a) + Var_j B_ij (the
          relative position bias B, a constant, spread over the query's keys); E[ε_ij ε_i'j] = κ_c from
          the cell's mean query (B's shared part left out); Σ_j ε_ij = 0
forward   o = M v + noise, M the cell average: E[o] = M E[v]; per channel Cov_o = M Cov_v Mᵀ + N,
          N_ii' = [c(i) = c(i')] V_c (κ_i δ_ii' + κ_c (1 − δ_ii'))/(T_c − 1),
          V_c = mean_{j∈c} E[v_j²] − E[v̄_c²] (the cell's token variance); then the real positions (the
          padding cropped) through the projection
backward  ∂L/∂v = Aᵀ G: Mᵀ Cov_G M + N', N'_jj' = [c(j) = c(j')] (δ_jj' − (1 − δ_jj')/(T_c − 1)) ·
          (Σ_i κ_i E[G_i²] + κ_c Σ_{i≠i'} E[G_i G_i'])/T_c²; ∂L/∂q and ∂L/∂k as :mod:`attention`'s,
          within each cell: Cov(∂q_ia, ∂q_i'a) = Var_c(k_a)/(d T_c) Σ_b V_cb E[G_ib G_i'b], none between
          cells; ∂k of each key independent, E = 1/(d T_c²) Σ_{i,i'∈c} E[q_ia q_i'a] Σ_b V_cb E[G_ib G_i'b];
          the three paths independent, the padding's gradient dropped

Exact per position through the whole (H·W)² covariance of each channel (as :mod:`adaptive`): the padded map
at most 1024 positions (Swin-T at 64 × 64: 21 × 21).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.adaptive import _MAX_POSITIONS, covariance, from_covariance
from gatepool.analysis.probe.correlated.add import add_grads
from gatepool.analysis.probe.correlated.attention import check_plain, kappa, per_head, projections
from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.registry import register_named_rule
from gatepool.analysis.probe.correlated.tokens import OnMap


def _intervals(n: int, w: int, s: int) -> torch.Tensor:
    """(n,): the interval along a side of n = k w that each row falls in (0, 1, …), shift s."""
    starts = [0] + list(range(s, n, w)) if s else list(range(0, n, w))
    return torch.bucketize(torch.arange(n), torch.tensor(starts[1:]), right=True)


def _local(n: int, w: int, s: int) -> torch.Tensor:
    """(n,): each row's index inside its window of the rolled map (the bias table's coordinate)."""
    return ((torch.arange(n) - s) % n) % w


class WindowAttention:
    """Multi-head attention within the (shifted) windows of a (C, H, W) field: the fused (3C, C) qkv and
    (C, C) projection weights, the relative position bias (1 or none, heads, w_h w_w, w_h w_w)."""

    def __init__(self, qkv_weight, qkv_bias, proj_weight, proj_bias, bias, window, heads: int,
                 shift=(0, 0)) -> None:  # fmt: skip
        self.q, self.k, self.v, self.proj = projections(qkv_weight, qkv_bias, proj_weight, proj_bias, heads)
        self.h, self.d = heads, proj_weight.shape[0] // heads
        self.window, self.shift = tuple(window), tuple(shift)
        n = self.window[0] * self.window[1]
        self.bias = None if bias is None else bias.detach().to("cpu", _DT).reshape(heads, n, n)

    def _cells(self, Hp: int, Wp: int) -> None:
        (wh, ww), (sh, sw) = self.window, self.shift
        sh, sw = (sh if wh < Hp else 0), (sw if ww < Wp else 0)  # a window over the whole side: no shift
        rows, cols = _intervals(Hp, wh, sh), _intervals(Wp, ww, sw)
        self.cell = (rows[:, None] * (int(cols.max()) + 1) + cols[None, :]).flatten()  # (P,)
        self.E = torch.nn.functional.one_hot(self.cell).to(_DT)  # (P, n)
        self.Tc = self.E.sum(0)  # (n,)
        self.same = self.cell[:, None] == self.cell[None, :]  # (P, P)
        if self.bias is not None:
            loc = (_local(Hp, wh, sh)[:, None] * ww + _local(Wp, ww, sw)[None, :]).flatten()
            B = self.bias[:, loc][:, :, loc] * self.same  # (heads, P, P): B_ij within a cell
            Tq = self.Tc[self.cell]
            bvar = (B**2).sum(2) / Tq - (B.sum(2) / Tq) ** 2  # Var_j B_ij over the query's keys
            self.bvar = bvar.clamp_min(0).repeat_interleave(self.d, 0)  # (D, P)
        else:
            self.bvar = 0.0

    def _cell_sums(self, K: torch.Tensor) -> torch.Tensor:
        """(D, n, n): Σ_{i∈c, j∈c'} K_ij of a (D, P, P) matrix."""
        return self.E.T @ K @ self.E

    def _token_var(self, m: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
        """(D, n): mean over a cell of E[x²] − E[x̄_c²], of means m (D, P) and covariance K (D, P, P)."""
        Tc = self.Tc
        e2 = (torch.diagonal(K, dim1=1, dim2=2) + m**2) @ self.E / Tc
        within = torch.diagonal(self._cell_sums(K), dim1=1, dim2=2) / Tc**2  # Var x̄_c
        return (e2 - (m @ self.E / Tc) ** 2 - within).clamp_min(0)

    def _padded(self, conv: Conv, x: Field) -> tuple[torch.Tensor, torch.Tensor]:
        """A projection of x on the padded map: means (D, P) (its bias on the padding) and covariance."""
        f = conv.forward(x)
        D, P, r = f.shape[0], len(self.cell), self.real
        m = torch.zeros((D, P), dtype=_DT) if conv.b is None else conv.b[:, None].repeat(1, P)
        m[:, r] = f.mean.reshape(D, -1)
        K = torch.zeros((D, P, P), dtype=_DT)
        K[:, r[:, None], r[None, :]] = covariance(f)
        return m, K

    def forward(self, x: Field) -> Field:
        D, H, W = x.shape
        wh, ww = self.window
        Hp, Wp = H + (-H) % wh, W + (-W) % ww
        if Hp * Wp > _MAX_POSITIONS:
            raise NotImplementedError(f"window attention on a {Hp}×{Wp} padded map: at most "
                                      f"{_MAX_POSITIONS} positions")  # fmt: skip
        self._cells(Hp, Wp)
        real = (torch.arange(Hp)[:, None] < H) & (torch.arange(Wp)[None, :] < W)
        self.real = r = real.flatten().nonzero()[:, 0]
        cell, Tc, E = self.cell, self.Tc, self.E
        (mq, Kq), (mk, Kk), (mv, Kv) = (self._padded(conv, x) for conv in (self.q, self.k, self.v))
        self.kt, self.vt = self._token_var(mk, Kk), self._token_var(mv, Kv)  # (D, n)
        eq2 = torch.diagonal(Kq, dim1=1, dim2=2) + mq**2  # (D, P)
        eqbar2 = (mq @ E / Tc) ** 2 + torch.diagonal(self._cell_sums(Kq), dim1=1, dim2=2) / Tc**2  # (D, n)
        self.kappa = kappa(per_head(eq2 * self.kt[:, cell], self.h) / self.d + self.bvar, Tc[cell])  # (D, P)
        mean_kappa = self.kappa @ E / Tc
        self.kappa_c = torch.minimum(kappa(per_head(eqbar2 * self.kt, self.h) / self.d, Tc), mean_kappa)
        self.Q2 = Kq + mq[:, :, None] * mq[:, None, :]  # E[q_i q_i'] (D, P, P)
        C = self._cell_sums(Kv) / (Tc[:, None] * Tc[None, :])  # Cov(v̄_c, v̄_c')
        noise = self.vt / (Tc - 1).clamp_min(1)  # (D, n)
        K = C[:, cell][:, :, cell] + self.same * (noise * self.kappa_c)[:, cell][:, :, None]
        idx = torch.arange(len(cell))
        K[:, idx, idx] += noise[:, cell] * (self.kappa - self.kappa_c[:, cell])
        o = from_covariance((mv @ E / Tc)[:, cell][:, r].reshape(D, H, W), K[:, r][:, :, r])
        return self.proj.forward(o)

    def backward(self, g: Field) -> Field:
        cell, Tc, E, r = self.cell, self.Tc, self.E, self.real
        G = self.proj.backward(g)
        D, P = G.shape[0], len(cell)
        KG = torch.zeros((D, P, P), dtype=_DT)
        KG[:, r[:, None], r[None, :]] = covariance(G)  # the padding's outputs are cut: no gradient
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
        q, k, v = (conv.backward(from_covariance(zero, K[:, r][:, :, r]))  # the padding's dropped
                   for conv, K in ((self.q, Kq), (self.k, Kk), (self.v, Kv)))  # fmt: skip
        return add_grads(add_grads(q, k), v)


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
