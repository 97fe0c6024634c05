"""Cross-covariance attention (XCiT's ``XCA``, EdgeNeXt's ``CrossCovarianceAttn``) on a (C, 1, T) field of
T tokens: per head the d channels are the attention's "tokens", a channel mixing.

q, k, v = the qkv Linear of x (per token: 1×1 convs), head h its d channels of each; over a sample's T
tokens q̂_a = q_a/|q_a|, k̂_b = k_b/|k_b|, s_ab = τ_h q̂_a · k̂_b, A = softmax_b s, o_a = Σ_b A_ab v_b, then
the projection P. DaViT's ``ChannelAttention`` is the same attention without the norms: per head
A = softmax_b(τ k_a · v_b), o_a = Σ_b A_ab q_b (its (k, v, q) in the roles of (q, k, v) here, n = 1).

scores    s_ab = τ N_ab/(n_a n_b), N_ab = Σ_t q_at k_bt, n² = E|q_a|², E|k_b|² (the norms at their mean):
          μ_ab = τ E[N_ab]/(n_a n_b), E[N_ab] = m_qa · m_kb + (W_q diag(Σ_t Var x_t) W_kᵀ)_ab (x's mean map
          and its own variances, channels uncorrelated); σ²_ab = τ² Var N_ab/(n_a n_b)², q and k
          independent: Var N = Σ_tu C_q C_k + m_qᵀ C_k m_q + m_kᵀ C_q m_k (C the tokens' covariance)
weights   e_ab = e^{s_ab} log-normal, independent over b: m_ab = E[A_ab] = e^{μ_ab + σ²_ab/2}/Σ_b' (the
          same), κ_ab = e^{σ²_ab} − 1; the fluctuation δ = A − m to first order in the relative ε_b:
          δ_b = m_b (ε_b − Σ_c m_c ε_c), K_a[b, b'] = Cov(δ_ab, δ_ab') =
          m_b m_b' (δ_bb' κ_b − m_b κ_b − m_b' κ_b' + Σ_c m_c² κ_c) (Σ_b δ_ab = 0), independent of v and
          across queries a
forward   o = P m v + P δ v: the mean mixing one 1×1 conv of x, W = P blockdiag(m) W_v (exact on the
          state); the fluctuation's E[n_at n_au] = Σ_b K_a[b,b] C_vb(t, u) + Σ_bb' K_a[b,b'] m_vbt m_vb'u,
          through P as Σ_a P_ca² (zero mean, independent of the mixing)
backward  to x through Wᵀ (the mean mixing), plus the fluctuation to v: Σ_a K_a[b,b] Γ_a (Γ = Pᵀg's
          covariance); to the scores, ∂s_ab = A_ab (R_ab − Σ_b' A_ab' R_ab'), R_ab = Σ_t G_at v_bt:
          S_a = L_a Q_a L_aᵀ, L_a = diag(m_a) − m_a m_aᵀ, Q_a[b,b'] = Σ_tu Γ_a(t,u)(δ_bb' C_vb + m_vb m_vb');
          to q̂_a, τ Σ_b ∂s_ab k̂_b: τ² (Σ_b S_a[b,b] C_kb/n_b² + Σ_bb' S_a[b,b'] m̂_kb m̂_kb'ᵀ), to k̂_b,
          τ Σ_a ∂s_ab q̂_a: τ² Σ_a S_a[b,b] (C_qa + m_qa m_qaᵀ)/n_a²; through the norm ÷ n (the part along
          q̂ itself, O(1/T) of it, left in); the four paths into x independent
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.field import _DT, Field
from gatepool.analysis.probe.correlated.positions import covariance, from_covariance
from gatepool.analysis.probe.correlated.registry import register_named_rule


def _through(W: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """Σ_c W_oc² cov_c: the covariance of a channel mixing of uncorrelated channels."""
    return torch.einsum("oc,ctu->otu", W**2, cov)


class CrossCovarianceAttention:
    """Cross-covariance attention from the fused (3D, D) qkv weight and bias (q, k, v in turn, head h its
    h-th d channels of each), the (C_out, D) projection, and the per-head temperature; ``normalized``
    False: the scores of q and k as they are (n = 1)."""

    def __init__(self, qkv_weight, qkv_bias, proj_weight, proj_bias, temperature, normalized=True) -> None:
        w = qkv_weight.detach().to("cpu", _DT)
        D = w.shape[1]
        tau = torch.as_tensor(temperature).detach().to("cpu", _DT).flatten()
        if w.shape[0] != 3 * D or D % len(tau) or proj_weight.shape[1] != D:
            raise ValueError(f"qkv must be (3D, D), the heads dividing D, the projection (·, D): got "
                             f"{tuple(w.shape)}, {len(tau)} heads, {tuple(proj_weight.shape)}")  # fmt: skip
        self.Wq, self.Wk, self.Wv = w.chunk(3)
        b = torch.zeros(3 * D, dtype=_DT) if qkv_bias is None else qkv_bias.detach().to("cpu", _DT)
        self.bq, self.bk, self.bv = b.chunk(3)
        self.P = proj_weight.detach().to("cpu", _DT)
        self.bp = None if proj_bias is None else proj_bias.detach().to("cpu", _DT)
        self.h, self.d = len(tau), D // len(tau)
        self.tau = tau.repeat_interleave(self.d)  # per query channel
        self.normalized = normalized

    def _block(self, t: torch.Tensor) -> torch.Tensor:
        """(D, d) per query channel over its head's d key channels → the (D, D) block-diagonal matrix."""
        out = torch.zeros((len(t), len(t)), dtype=_DT)
        for h in range(self.h):
            s = slice(h * self.d, (h + 1) * self.d)
            out[s, s] = t[s]
        return out

    def _in_head(self, M: torch.Tensor) -> torch.Tensor:
        """(D, D) → (D, d): each query channel's row over its head's key channels."""
        return torch.cat(
            [M[h * self.d : (h + 1) * self.d, h * self.d : (h + 1) * self.d] for h in range(self.h)]
        )

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(D, ...) → (h, d, ...)."""
        return t.reshape(self.h, self.d, *t.shape[1:])

    def forward(self, x: Field) -> Field:
        C, one, T = x.shape
        if one != 1 or T < 2 or C != self.Wq.shape[1]:
            raise ValueError(f"x must be a ({self.Wq.shape[1]}, 1, T ≥ 2) field of tokens, got {x.shape}")
        Mx, Cx = x.mean[:, 0], covariance(x)
        mq, mk, mv = (
            W @ Mx + b[:, None] for W, b in ((self.Wq, self.bq), (self.Wk, self.bk), (self.Wv, self.bv))
        )
        Cq, Ck, Cv = (_through(W, Cx) for W in (self.Wq, self.Wk, self.Wv))
        nq2 = (mq**2).sum(1) + torch.diagonal(Cq, dim1=1, dim2=2).sum(1)
        nk2 = (mk**2).sum(1) + torch.diagonal(Ck, dim1=1, dim2=2).sum(1)
        if not self.normalized:
            nq2, nk2 = torch.ones_like(nq2), torch.ones_like(nk2)
        vx = torch.diagonal(Cx, dim1=1, dim2=2).sum(1)  # (C,) Σ_t Var x_ct
        N = self._in_head(mq @ mk.T + self.Wq @ torch.diag(vx) @ self.Wk.T)  # (D, d)
        cq, ck, mqh, mkh = (self._heads(t) for t in (Cq, Ck, mq, mk))
        varN = (torch.einsum("hatu,hbtu->hab", cq, ck) + torch.einsum("hat,hbtu,hau->hab", mqh, ck, mqh)
                + torch.einsum("hbt,hatu,hbu->hab", mkh, cq, mkh)).reshape(-1, self.d)  # fmt: skip
        den = nq2[:, None] * self._heads(nk2).repeat_interleave(self.d, 0)
        mu = self.tau[:, None] * N / den.sqrt()
        s2 = self.tau[:, None] ** 2 * varN / den
        self.m = torch.softmax(mu + s2 / 2, 1)  # (D, d)
        kap = torch.expm1(s2.clamp(max=30))
        mk_ = self.m * kap
        tot = (self.m * mk_).sum(1, keepdim=True)
        self.K = (
            self.m[:, :, None]
            * self.m[:, None, :]
            * (torch.diag_embed(kap) - mk_[:, :, None] - mk_[:, None, :] + tot[:, :, None])
        )  # (D, d, d)
        self.mix = self.P @ self._block(self.m)  # (C_out, D): v to the output
        self.Weff = self.mix @ self.Wv
        bias = self.mix @ self.bv + (0 if self.bp is None else self.bp)
        # the fluctuation: E[n_at n_au] per query channel a
        cv, mvh, K = self._heads(Cv), self._heads(mv), self._heads(self.K)
        n = torch.einsum("hab,hbtu->hatu", torch.diagonal(K, dim1=2, dim2=3), cv)
        n = (n + torch.einsum("hbt,habc,hcu->hatu", mvh, K, mvh)).reshape(-1, T, T)
        mean = self.Weff @ Mx + bias[:, None]
        cov = _through(self.Weff, Cx) + _through(self.P, n)
        self.keep = (Mx, mq, mk, mv, Cq, Ck, Cv, nq2, nk2)
        return from_covariance(mean[:, None], cov)

    def backward(self, g: Field) -> Field:
        Mx, mq, mk, mv, Cq, Ck, Cv, nq2, nk2 = self.keep
        D, T = self.Wq.shape[0], Cq.shape[-1]
        Cg = covariance(g)
        gam = self._heads(_through(self.P.T, Cg))  # (h, d, T, T): the heads' outputs' gradient
        # the fluctuation's to v: Σ_a K_a[b, b] Γ_a over b's head's queries
        kd = torch.diagonal(self._heads(self.K), dim1=2, dim2=3)  # (h, a, b)
        gv = torch.einsum("hab,hatu->hbtu", kd, gam).reshape(D, T, T)
        cov = _through(self.Weff.T, Cg) + _through(self.Wv.T, gv)
        # the scores' gradient: S_a = L_a Q_a L_aᵀ
        cv, mvh = self._heads(Cv), self._heads(mv)
        Q = torch.diag_embed(torch.einsum("hatu,hbtu->hab", gam, cv))
        Q = (Q + torch.einsum("hbt,hatu,hcu->habc", mvh, gam, mvh)).reshape(D, self.d, self.d)
        L = torch.diag_embed(self.m) - self.m[:, :, None] * self.m[:, None, :]
        S = self._heads(L @ Q @ L.transpose(1, 2))  # (h, d, d, d)
        sd = torch.diagonal(S, dim1=2, dim2=3)  # (h, a, b)
        t2 = self.tau**2
        # to q_a: τ² (Σ_b S_bb C_kb/n_b² + Σ_bb' S_bb' m̂_kb m̂_kb'ᵀ) / n_a²
        ck = self._heads(Ck / nk2[:, None, None])
        mkh = self._heads(mk / nk2.sqrt()[:, None])
        gq = torch.einsum("hab,hbtu->hatu", sd, ck) + torch.einsum("hbt,habc,hcu->hatu", mkh, S, mkh)
        gq = gq.reshape(D, T, T) * (t2 / nq2)[:, None, None]
        # to k_b: τ² Σ_a S_a[b, b] (C_qa + m_qa m_qaᵀ)/n_a² over b's head's queries, ÷ n_b²
        sq = self._heads((Cq + mq[:, :, None] * mq[:, None, :]) * (t2 / nq2)[:, None, None])
        gk = torch.einsum("hab,hatu->hbtu", sd, sq).reshape(D, T, T) / nk2[:, None, None]
        cov = cov + _through(self.Wq.T, gq) + _through(self.Wk.T, gk)
        return from_covariance(torch.zeros_like(Mx)[:, None], cov)


def _rule(m: nn.Module) -> CrossCovarianceAttention:
    if m.attn_drop.p or m.proj_drop.p:
        raise NotImplementedError(f"{type(m).__name__} with dropout")
    if m.qkv.out_features != 3 * m.qkv.in_features:
        raise NotImplementedError(f"{type(m).__name__} whose heads are not the embedding's width")
    return CrossCovarianceAttention(m.qkv.weight, m.qkv.bias, m.proj.weight, m.proj.bias, m.temperature)


register_named_rule("timm.models.xcit.XCA", "timm.models.edgenext.CrossCovarianceAttn")(_rule)


@register_named_rule("timm.models.davit.ChannelAttention")
def channel_attention_rule(m: nn.Module) -> CrossCovarianceAttention:
    """DaViT's ``ChannelAttention``: softmax_b(k_a · v_b/√d) mixing the queries' channels, o_a = Σ_b A_ab
    q_b; its qkv read as (k, v, q), no norms."""
    D = m.qkv.in_features
    if m.qkv.out_features != 3 * D:
        raise NotImplementedError("ChannelAttention whose heads are not the embedding's width")
    q, k, v = m.qkv.weight.chunk(3)
    b = None if m.qkv.bias is None else torch.cat([*m.qkv.bias.chunk(3)[1:], m.qkv.bias.chunk(3)[0]])
    tau = torch.full((m.num_heads,), float(m.scale))
    kvq = torch.cat([k, v, q])
    return CrossCovarianceAttention(kvq, b, m.proj.weight, m.proj.bias, tau, normalized=False)
