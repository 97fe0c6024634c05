"""Softmax self-attention over tokens (``nn.MultiheadAttention(x, x, x)``, batch first: a ViT encoder's)
on a (D, 1, T) field of T tokens, a first model at init: the mixing weights near uniform.

q, k, v = the in-projections of x (per token: 1×1 convs, :class:`Conv`); per head of d channels the
scores s_ij = q_i · k_j / √d, A = softmax_j s, o_i = Σ_j A_ij v_j, then the out-projection.

spread    over the keys j of one query the scores vary by s² = (1/d) Σ_a E[q_a²] Var_tok(k_a)
          (Var_tok: the sample's own variance over its tokens, E over samples); the part every query
          shares (the token mean of q) by s_c² = (1/d) Σ_a E[q̄_a²] Var_tok(k_a). The weights
          A_ij = (1 + ε_ij)/T, E[ε_ij²] = κ(s², T) the spread of a softmax of T independent normal
          scores (:mod:`softmax_spread`: e^{s²} − 1 as T → ∞, smaller at finite T, at most T − 1),
          E[ε_ij ε_i'j] = κ_c = min(κ(s_c², T), κ) (i ≠ i'), Σ_j ε_ij = 0 (so −κ/(T − 1) between two
          keys of one query), ε independent of v
forward   per value channel, V = Σ_{j,j'} E[v_j v_j'] (all the tokens' second moments), V₀ = Σ_j E[v_j²]:
          E[o_i²] = ((1 − κ/(T−1)) V + κ T/(T−1) V₀)/T²,  E[o_i o_i'] the same with κ_c, E[o] = v̄'s mean:
          between the token covariance average (κ = 0: every output the tokens' mean) and v's variance
          (κ's first-order part s² times ν where neighbouring keys move together: :meth:`_keys_together`);
          plus the weights' lean towards the keys whose values move with the scores: to first order
          A_ij ≈ (1 + s_ij − s̄_i)/S, o_ib ⊃ c Σ_a C_ba q_ia (C below), a 1×1 conv of the queries,
          independent of the rest; at a finite S it saturates as the weights concentrate, times
          ℓ(s², S) (:func:`softmax_spread.lean`: 0.88 at s² = 3, 0.48 at s² = 20 for 49 keys)
backward  ∂L/∂v_j = Σ_i A_ij G_i: the forward's sums with the queries' and keys' roles swapped;
          ∂L/∂q_i = (1/√d) Σ_j A_ij (G_i·(v_j − o_i)) k_j:
              E = Σ_b Var_tok(k_a) Var_tok(v_b) n_ab/(dT) E[G_ib G_i'b] (the tokens' own spread; n_ab =
              Σ_e ρ_ka(e) ρ_vb(e) (T − |e|)/T, the keys that move together) plus the part
              every token shares, v and k being maps of the same x: Σ_j (v_jb − v̄_b) k_ja/T → the
              tokens' covariance C_ba = Cov_tok(v_b, k_a) = (W_v Σ_x W_kᵀ)_ba (Σ_x the channels' covariance
              over the tokens: each channel's own spread, the mean map's across channels), so
              ∂L/∂q_ia ⊃ (ℓ/√d) Σ_b C_ba G_ib: E = (ℓ²/d) Σ_b C_ba² E[G_ib G_i'b] (a class token whose
              gradient is the head's, over T ≫ d tokens: T/d times the first);
          ∂L/∂k_j = (1/√d) Σ_i A_ij (G_i·(v_j − o_i)) q_i:
              E = 1/(dT²) Σ_{i,i'} (1 + κ, or κ_c for i ≠ i') Σ_b Var_tok(v_b) E[G_ib G_i'b] E[q_ia q_i'a],
              the weighted gradient
              Z_i = Σ_b Var_tok(v_b) E[G_ib²] and its correlation one for the head's channels (a class
              token's query, unlike the others', counts where the gradient is); the keys' uncorrelated;
          the three paths into x through the in-projections, independent
keys      from x's own tokens, or from y = R(x), S tokens a fixed step makes of x (PVT's spatial
          reduction: the tokens' map, a strided conv, a LayerNorm): the sums over keys j run over y's S
          tokens and A_ij = (1 + ε_ij)/S; the keys' and values' gradient goes back through R to x; the
          queries from x's tokens or a step of them (CaiT's class attention: the class token alone)
widths    queries and keys of d_k channels a head, values of d_v, the scores scaled by c (1/√d_k unless
          given, EfficientFormer's): each 1/d above is c²
channels  where the keys' tokens carry their channels' correlations (``Field.chan``, ``chan_dc``), Σ_x
          in C is the tokens' covariance within a sample, S₀/T − D/T² (S₀ the lag-0 covariance summed over
          the tokens, D the sums'), not each channel's own spread; and the heads' outputs get theirs from
          o_i ≈ W_v x̄ + W_t x_i + n_i (:meth:`Attention._channels`)
per head  the weights' statistics (``Attention.weights``): the mean weight m = 1/S, the fluctuation
          δ = A − m's S² E[δ_ij²] = κ and S² E[δ_ij δ_i'j] = κ_c, and the heads' gradients reaching each
          head's scores P_q = I, P = diag(1 + κ); a rule that mixes the heads (talking heads) gives its own
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.add import add, add_grads
from gatepool.analysis.probe.correlated.channels import _cov, _normalized, _sums
from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.field import Field, _field_from_sums, xcorr
from gatepool.analysis.probe.correlated.registry import register_correlated_rule, register_named_rule
from gatepool.analysis.probe.correlated.resample import PositionMap
from gatepool.analysis.probe.correlated.softmax_spread import kappa, lean


def _token_var(f: Field) -> torch.Tensor:
    """(D,) E over samples of a sample's variance over its tokens: mean E[x²] − E[x̄²]."""
    T = f.shape[-1]
    mbar = f.mean.mean((1, 2))
    return ((f.var + f.mean**2).mean((1, 2)) - mbar**2 - f.lag_sums().sum((1, 2)) / T**2).clamp_min(0)


def _channel_covariances(f: Field) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(S₀, D) (C, C): Σ_p Cov(x_a(p), x_b(p)) and Σ_{p,q} Cov(x_a(p), x_b(q)), from the field's channel
    correlations (``chan``, ``chan_dc``: :mod:`channels`); None where either is unknown."""
    if f.chan is None or f.chan_dc is None:
        return None
    return _cov(f.chan, f.var.flatten(1).sum(1)), _cov(f.chan_dc, _sums(f))


def _within(corr: torch.Tensor, f: Field) -> torch.Tensor:
    """(D, 2T − 1): the tokens' correlation at each lag within a sample, their share in the sample's
    mean taken out: (ρ(e) − r̄)/(1 − r̄), r̄ = Var(x̄)/v̄ (the lag sums over T² v̄)."""
    T = f.shape[-1]
    v = f.var.mean((1, 2)).clamp_min(1e-300)
    r = (f.lag_sums().sum((1, 2)) / (T * T * v)).clamp(0, 1 - 1e-6)[:, None]
    return (corr - r) / (1 - r)


def _stationary(mean: torch.Tensor, var: torch.Tensor, cov: torch.Tensor, T: int) -> Field:
    """A (D, 1, T) field of one mean, variance and covariance at every lag ≠ 0, per channel."""
    D = len(var)
    corr = (cov / var.clamp_min(1e-300)).clamp(-1, 1)[:, None, None].expand(D, 1, 2 * T - 1).clone()
    corr[:, 0, T - 1] = 1.0
    mean, var = (t[:, None, None].expand(D, 1, T).clone() for t in (mean, var))
    return Field(mean, var, corr)


def projections(in_weight, in_bias, out_weight, out_bias, num_heads: int) -> tuple[Conv, Conv, Conv, Conv]:
    """The query, key and value projections of a fused (3D, D) in-projection and the (D, D) out-projection,
    as 1×1 convs; ``num_heads`` must divide D."""
    D = out_weight.shape[0]
    if num_heads < 1 or D % num_heads or in_weight.shape != (3 * D, D):
        raise ValueError(f"num_heads must divide the embedding's {D} channels, got {num_heads}")
    b = [None] * 3 if in_bias is None else in_bias.detach().chunk(3)
    w = [*in_weight.detach().chunk(3), out_weight.detach()]
    return tuple(Conv(wi[:, :, None, None], bi, (1, 1), (0, 0)) for wi, bi in zip(w, [*b, out_bias]))


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(h·d, ...) → (h, ...): the sum over each head's d channels."""
    return t.reshape(heads, -1, *t.shape[1:]).sum(1)


def per_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(D, ...) → (D, ...): at each channel, the sum over its head's D/heads channels."""
    return _heads(t, heads).repeat_interleave(t.shape[0] // heads, 0)


def check_plain(m: nn.Module, dim: int) -> None:
    """A timm attention module the rule takes as it is: its scale 1/√(dim/num_heads), no dropout."""
    if abs(m.scale - (dim // m.num_heads) ** -0.5) > 1e-12 or m.attn_drop.p or m.proj_drop.p:
        raise NotImplementedError(f"{type(m).__name__} with its own scale or dropout")


class Attention:
    """``nn.MultiheadAttention``'s self-attention from its in- and out-projections and head count.

    :meth:`of` builds it from four 1×1 convs instead: queries and keys of h·d_k channels, values of h·d_v
    (head i its i-th d_k, d_v channels), the scores scaled by ``scale`` (1/√d_k unless given), the
    projection reading the heads' outputs in the values' order. ``kv``: a step from x to the keys' and
    values' tokens, ``queries`` to the queries' (None: x's own tokens)."""

    def __init__(
        self, in_weight, in_bias, out_weight, out_bias, num_heads: int, kv=None, queries=None
    ) -> None:
        q, k, v, out = projections(in_weight, in_bias, out_weight, out_bias, num_heads)
        self._set(q, k, v, out, num_heads, None, kv, queries)

    @classmethod
    def of(
        cls, q: Conv, k: Conv, v: Conv, out: Conv, num_heads: int, scale: float | None = None, kv=None,
        queries=None,
    ) -> Attention:  # fmt: skip
        self = cls.__new__(cls)
        self._set(q, k, v, out, num_heads, scale, kv, queries)
        return self

    def _set(self, q: Conv, k: Conv, v: Conv, out: Conv, heads: int, scale, kv, queries) -> None:
        Dk, Dv = q.W.shape[0], v.W.shape[0]
        if heads < 1 or Dk % heads or Dv % heads or k.W.shape[0] != Dk or out.W.shape[1] != Dv:
            raise ValueError(f"num_heads must divide the {Dk} query and key and {Dv} value channels, "
                             f"the projection read the values: got {heads}")  # fmt: skip
        self.q, self.k, self.v, self.out, self.h = q, k, v, out, heads
        self.dk, self.dv = Dk // heads, Dv // heads
        self.s2 = self.dk**-1.0 if scale is None else float(scale) ** 2  # the scores' scale, squared
        self.kv, self.queries = kv, queries

    def weights(self, s2: torch.Tensor, s2c: torch.Tensor, S: int):
        """The mixing weights' statistics per head from the scores' spread ``s2`` and shared part ``s2c``
        (heads,): the mean weight m, K = S² E[δ_ij²] and K_c = S² E[δ_ij δ_i'j] of its fluctuation δ
        about m, and how the heads' gradients reach each head's scores, P_q (the queries') and P, P_c
        (the keys': one query's, two queries') as (heads, heads) matrices: m = 1/S, K = κ, K_c = κ_c,
        P_q = I, P = diag(1 + κ), P_c = diag(1 + κ_c)."""
        k = kappa(s2, S)
        kc = torch.minimum(kappa(s2c, S), k)
        m = torch.full_like(k, 1.0 / S)
        return m, k, kc, torch.eye(self.h, dtype=k.dtype), torch.diag(1 + k), torch.diag(1 + kc)

    def _query_map(self, x: Field, fk: Field, fv: Field) -> torch.Tensor:
        """(D_k, D_v): E[∂q_ia ∂q_i'a] = Σ_b M_ab E[G_ib G_i'b],
        M_ab = P_q(a, b) c² (ℓ² C_ba² + Var_tok(k_a) Var_tok(v_b) n_ab/T), c the scores' scale, ℓ the lean
        (P_q(a, b): how much of b's head's gradient reaches a's head's scores, 1 within a head and 0
        across but where heads talk), C_ba = Cov_tok(v_b, k_a) = (W_v Σ_x W_kᵀ)_ba (Σ_x: each channel's
        spread over the tokens beyond its mean map's, the mean map's across channels) and
        n_ab = Σ_e ρ_ka(e) ρ_vb(e) (T − |e|)/T the pairs of keys that move together."""
        T = x.shape[-1]  # the keys'
        m = x.mean.flatten(1)
        mc = m - m.mean(1, keepdim=True)
        known = _channel_covariances(x)
        if known is None:  # the channels uncorrelated: each one's own spread
            sigma = torch.diag((_token_var(x) - (mc**2).mean(1)).clamp_min(0))
        else:  # the tokens' covariance within a sample, S₀/T − D/T²
            sigma = known[0] / T - known[1] / T**2
        sigma = sigma + mc @ mc.T / T
        C = self.v.W[:, :, 0, 0] @ sigma @ self.k.W[:, :, 0, 0].T  # (b, a)
        self.C = C
        w = (T - torch.arange(-(T - 1), T).abs()).to(x.var.dtype) / T
        n = torch.einsum("ae,be->ab", fk.corr[:, 0] * w, fv.corr[:, 0])
        rk, rv = (_within(f.corr[:, 0], f) for f in (fk, fv))  # the forward's noise reads it within a sample
        self.n = torch.einsum("ae,be->ab", rk * w, rv)
        tilt = C.T * self.lean.repeat_interleave(self.dk)[:, None]
        M = self.s2 * (tilt**2 + self.kt[:, None] * self.vt[None, :] * n / T)
        a, b = torch.arange(M.shape[0]) // self.dk, torch.arange(M.shape[1]) // self.dv
        return M * self.Pq[a[:, None], b[None, :]]

    def forward(self, x: Field) -> Field:
        return self.out.forward(self.mixed(x))

    def _keys_together(self, eq2: torch.Tensor) -> torch.Tensor:
        """ν (heads,): the mixing noise's gain where the keys move together. To first order the noise is
        c Σ_a q_ia (Ĉ_ab − C_ab), Ĉ the sample's token covariance of keys and values, whose variance over
        tokens correlated along the sequence is Var_tok(k_a) Var_tok(v_b) n_ab/S (n_ab = Σ_e ρ̃_ka(e) ρ̃_vb(e)
        (S − |e|)/S, ρ̃ the correlation within a sample (:func:`_within`), 1 for independent tokens); κ
        takes n = 1, so its first-order part s² is scaled by n_ab averaged over the head's pairs, each a
        query channel a by its share of the scores' spread, E[q_a²] Var_tok(k_a), and a value channel b by
        its spread over the tokens, Var_tok(v_b)."""
        w = (eq2 * self.kt)[:, None] * self.vt[None, :]  # (D_k, D_v)
        a, b = torch.arange(len(w)) // self.dk, torch.arange(w.shape[1]) // self.dv
        w = w * (a[:, None] == b[None, :])
        return _heads((w * self.n).sum(0), self.h) / _heads(w.sum(0), self.h).clamp_min(1e-300)

    def first_order(self, t: torch.Tensor) -> torch.Tensor:
        """(heads,): K of each head's weights to first order in its scores' spreads ``t`` (heads,): t itself
        (a rule whose heads mix mixes it)."""
        return t

    def mixed(self, x: Field) -> Field:
        """The heads' outputs Σ_j A_ij v_j (D_v, 1, T), before the out-projection."""
        D, H, _ = x.shape
        y = x if self.kv is None else self.kv.forward(x)  # (D, 1, S): the keys' and values' tokens
        xq = x if self.queries is None else self.queries.forward(x)  # (D, 1, T): the queries'
        T, S = xq.shape[-1], y.shape[-1]
        if H != 1 or y.shape[1] != 1 or S < 2:
            raise ValueError(f"x must be a (D, 1, T) field, its keys (D, 1, S ≥ 2), got {x.shape}, {y.shape}")
        fq, fk, fv = self.q.forward(xq), self.k.forward(y), self.v.forward(y)
        self.fq, self.T, self.S = fq, T, S
        self.kt, self.vt = _token_var(fk), _token_var(fv)
        eq2 = (fq.var + fq.mean**2).mean((1, 2))
        eqbar2 = fq.mean.mean((1, 2)) ** 2 + fq.lag_sums().sum((1, 2)) / T**2
        s2, s2c = (_heads(t * self.kt, self.h) * self.s2 for t in (eq2, eqbar2))  # (h,): per head
        m, K, Kc, self.Pq, self.P, self.Pc = self.weights(s2, s2c, S)
        self.lean = lean(s2, S)  # (h,)
        self.m, self.K, self.Kc = (t.repeat_interleave(self.dv) for t in (m, K, Kc))  # per value channel
        self.Mq = self._query_map(y, fk, fv)
        V0 = (fv.var + fv.mean**2).sum((1, 2))
        V = fv.lag_sums().sum((1, 2)) + fv.mean.sum((1, 2)) ** 2
        mean = self.m * fv.mean.sum((1, 2))
        # the noise's gain: κ, its first-order part s² times ν where neighbouring keys move together
        nu = self._keys_together(eq2)
        self.gain, self.gain_c = (k + self.first_order(t * (nu - 1)).repeat_interleave(self.dv)
                                  for k, t in ((self.K, s2), (self.Kc, s2c)))  # fmt: skip

        def second(k):  # E[o_i o_i'] = m² V + k (S V₀ − V)/((S − 1) S²)
            return self.m**2 * V + k * (S * V0 - V) / ((S - 1) * S**2)

        o = _stationary(mean, second(self.gain) - mean**2, second(self.gain_c) - mean**2, T)
        tilt = self._tilt()
        out = add(o, tilt.forward(fq))
        out.chan, out.chan_dc = self._channels(x, xq, y, fv, tilt)
        return out

    def _channels(self, x: Field, xq: Field, y: Field, fv: Field, tilt: Conv) -> tuple:
        """(R, Q) of the heads' outputs o_i ≈ W_v x̄ + W_t x_i + n_i (the keys' tokens' mean, the lean
        W_t = (its 1×1 conv) W_q of the query's token, the mixing noise within each head), where the keys'
        tokens' channel correlations are known and the queries are x's own tokens or a selection of them
        (None otherwise: keys from a step of x, queries of other tokens):

            Cov₀(o) = W_v X W_vᵀ + W_t Cov₀(x) W_tᵀ + W_v X W_tᵀ + W_t X W_vᵀ + N,   X = D_y/S²
            D(o)    = T² W_v X W_vᵀ + W_t D_q W_tᵀ + T² (W_v X W_tᵀ + W_t X W_vᵀ) + T N + T(T − 1) N_c

        (Cov(x̄, x_i) taken as X, exact for x's own tokens; D_q the queries' sums, T² X for a selection),
        N_bb' = g (S V₀ − V)/((S − 1) S²) within a head (V₀ = Σ_j E[v_j v_jᵀ], V = E[(Σ_j v_j)(Σ_j v_j)ᵀ], g
        the noise's gain of :meth:`mixed`), 0 across heads; N_c with its g_c. ``xq``: the queries' tokens,
        ``tilt``: the lean's 1×1 conv of the queries."""
        known = _channel_covariances(y)
        by_position = self.queries is None or isinstance(self.queries, PositionMap)
        if known is None or x.chan is None or self.kv is not None or not by_position:
            return None, None
        S0, D = known
        S, T = self.S, self.T
        Wv = self.v.W[:, :, 0, 0]
        Wt = tilt.W[:, :, 0, 0] @ self.q.W[:, :, 0, 0]  # (Dv, D): the lean of x's token
        X = D / S**2
        cov_q = _cov(x.chan, xq.var.flatten(1).mean(1))  # a token's, pooled: x's correlation at its tokens
        Dq = D if self.queries is None else T**2 * X
        mv = fv.mean.flatten(1)
        V0 = Wv @ S0 @ Wv.T + mv @ mv.T
        V = Wv @ D @ Wv.T + mv.sum(1, keepdim=True) @ mv.sum(1, keepdim=True).T
        head = torch.arange(len(Wv)) // self.dv
        within = head[:, None] == head[None, :]

        def noise(k):  # per value channel, the same within a head
            return k[:, None] * (S * V0 - V) / ((S - 1) * S**2) * within

        mean_part, cross, n = Wv @ X @ Wv.T, Wv @ X @ Wt.T, noise(self.gain)
        cov0 = mean_part + Wt @ cov_q @ Wt.T + cross + cross.T + n
        sums = T**2 * (mean_part + cross + cross.T) + Wt @ Dq @ Wt.T + T * (n + (T - 1) * noise(self.gain_c))
        return _normalized(cov0), _normalized(sums)

    def tilt_heads(self) -> torch.Tensor:
        """(heads, heads): how much of head f's scores moves head h's weights to first order (I)."""
        return torch.eye(self.h, dtype=torch.float64)

    def _tilt(self) -> Conv:
        """The weights' lean towards the keys whose values move with the scores: A_ij ≈ (1 + s_ij − s̄_i)/S
        gives o_ib ⊃ c Σ_a q_ia Cov_tok(k_a, v_b) = c Σ_a C_ba q_ia to first order, times ℓ(s², S) for its
        saturation, a 1×1 conv of the queries (each head's values from its own queries' channels, or as
        ``tilt_heads`` mixes them)."""
        a, b = torch.arange(self.C.shape[1]) // self.dk, torch.arange(self.C.shape[0]) // self.dv
        W = self.s2**0.5 * self.C * self.lean[a][None, :] * self.tilt_heads()[b[:, None], a[None, :]]
        return Conv(W[:, :, None, None], None, (1, 1), (0, 0))

    def _mix(self, P: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """(h, ...) per head → (D_k, ...): Σ_h P[f, h] t_h at each head f's query and key channels."""
        return torch.einsum("fh,h...->f...", P, t).repeat_interleave(self.dk, 0)

    def backward(self, g: Field) -> Field:
        return self.into_x(*self.grads(self.out.backward(g)))

    def grads(self, G: Field) -> tuple[Field, Field, Field]:
        """The gradients at the queries, the keys and the values from ``G`` (D_v, 1, T) at the heads'
        outputs."""
        T, S = self.T, self.S
        TG = G.lag_sums()
        Gd, Gall = G.var.sum((1, 2)), TG.sum((1, 2))
        m2, K, Kc = self.m**2, self.K / S**2, self.Kc / S**2
        gv = _stationary(torch.zeros_like(Gd), (m2 + K) * Gd + (m2 + Kc) * (Gall - Gd),
                         (m2 - K / (S - 1)) * Gd + (m2 - Kc / (S - 1)) * (Gall - Gd), S)  # fmt: skip
        var, sums = (torch.einsum("ab,bhw->ahw", self.Mq, t) for t in (G.var, TG))
        gq = _field_from_sums(torch.zeros_like(var), var, sums)
        # Σ_b Var_tok(v_b) E[G_ib²] over each head's values (h, 1, T), and its lag sums
        Z, ZT = (_heads(self.vt[:, None, None] * t, self.h) for t in (G.var, TG))
        fq, sq = self.fq, self.fq.var.clamp_min(0).sqrt()

        # i = i' (E[A_ij²] in P): Σ_i z_i E[q_i²], Z mixed by P
        own = (self._mix(self.P, Z).clamp_min(0) * (fq.var + fq.mean**2)).sum((1, 2))
        # i ≠ i' (E[A_ij A_i'j] in P_c): Σ_{i ≠ i'} √z_i √z_i' ρ_z E[q_i q_i'], Z mixed by P_c
        z, zt = self._mix(self.Pc, Z), self._mix(self.Pc, ZT)
        rho = _field_from_sums(torch.zeros_like(z), z, zt).corr  # the weighted gradients' correlation
        sz = z.clamp_min(0).sqrt()
        both = rho * (fq.corr * xcorr(sz * sq, sz * sq) + xcorr(sz * fq.mean, sz * fq.mean))
        vk = (own + both.sum((1, 2)) - both[:, 0, T - 1]) * self.s2 / S**2
        return gq, _stationary(torch.zeros_like(vk), vk, torch.zeros_like(vk), S), gv

    def into_x(self, gq: Field, gk: Field, gv: Field) -> Field:
        """x's gradient from the queries', the keys' and the values' (independent), back through the
        projections and the steps to the queries' and the keys' tokens."""
        gy = add_grads(self.k.backward(gk), self.v.backward(gv))
        gx = self.q.backward(gq)
        gx = gx if self.queries is None else self.queries.backward(gx)
        return add_grads(gx, gy if self.kv is None else self.kv.backward(gy))


@register_correlated_rule(nn.MultiheadAttention)
def attention_rule(m: nn.MultiheadAttention) -> Attention:
    if not m._qkv_same_embed_dim or not m.batch_first or m.bias_k is not None or m.dropout:
        raise NotImplementedError("attention rule: batch first, one embedding size, no bias_kv, no dropout")
    return Attention(m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, m.num_heads)


@register_named_rule("timm.layers.attention.Attention")
def timm_attention_rule(m: nn.Module) -> Attention:
    """timm's ``Attention`` (ViT, DeiT, CaiT's blocks): its fused qkv Linear and proj, the softmax
    attention of ``nn.MultiheadAttention`` between them."""
    plain = all(isinstance(getattr(m, a, None), nn.Identity) for a in ("q_norm", "k_norm", "norm"))
    drops = [getattr(m, a, None) for a in ("attn_drop", "proj_drop")]
    if not plain or getattr(m, "gate", None) is not None or any(d is None or d.p for d in drops):
        raise NotImplementedError("timm Attention: no q/k or scale norm, no gate, no dropout")
    if getattr(m, "attn_dim", m.proj.in_features) != m.qkv.in_features:
        raise NotImplementedError("timm Attention whose heads are not the embedding's width")
    return Attention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, m.num_heads)


@register_named_rule("timm.models.beit.Attention")
def beit_attention_rule(m: nn.Module) -> Attention:
    """timm's Beit ``Attention``: ``F.linear`` of its qkv weight with the bias (q_bias, 0, v_bias), the
    softmax attention, proj; the attention rule's where its relative position bias adds nothing (None,
    or the zeros it starts from) and the scale is 1/√head_dim."""
    table = getattr(m, "relative_position_bias_table", None)
    if table is not None and bool(table.detach().any()):
        raise NotImplementedError("Beit Attention with a relative position bias that is not zero")
    dim, heads = m.qkv.in_features, m.num_heads
    if m.qkv.out_features != 3 * dim or abs(m.scale - (dim // heads) ** -0.5) > 1e-12 or m.attn_drop.p:
        raise NotImplementedError("Beit Attention of heads other than the width, its own scale or dropout")
    if m.proj_drop.p:
        raise NotImplementedError("Beit Attention with dropout")
    bias = None if m.q_bias is None else torch.cat((m.q_bias, m.k_bias, m.v_bias))
    return Attention(m.qkv.weight, bias, m.proj.weight, m.proj.bias, heads)


@register_named_rule("timm.models.efficientformer.Attention")
def efficientformer_attention_rule(m: nn.Module) -> Attention:
    """timm's EfficientFormer ``Attention`` (its last stage's ``MetaBlock1d``): one qkv Linear whose
    output is, head by head, the head's key_dim queries, key_dim keys and val_dim values
    (``reshape(B, N, heads, −1)`` then a split); the scores scaled by key_dim^−½ plus a relative position
    bias (zeros at init: nothing added); the projection of the heads' values, head by head."""
    if bool(m.attention_biases.detach().any()):
        raise NotImplementedError("EfficientFormer Attention with a position bias that is not zero")
    h, dk, dv = m.num_heads, m.key_dim, m.val_dim
    D = m.qkv.in_features
    w = m.qkv.weight.detach().reshape(h, 2 * dk + dv, D)
    b = None if m.qkv.bias is None else m.qkv.bias.detach().reshape(h, 2 * dk + dv)
    parts = ((0, dk), (dk, 2 * dk), (2 * dk, 2 * dk + dv))
    q, k, v = (
        Conv(w[:, lo:hi].reshape(-1, D, 1, 1), None if b is None else b[:, lo:hi].flatten(), (1, 1), (0, 0))
        for lo, hi in parts
    )
    proj = Conv(m.proj.weight.detach()[:, :, None, None], m.proj.bias, (1, 1), (0, 0))
    return Attention.of(q, k, v, proj, h, m.scale)
