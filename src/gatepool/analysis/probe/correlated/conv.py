"""conv (and every linear map with a kernel: avg pools, the global pool).

conv      mean  m_out = conv(m, W) + b
          var   v_out(p) = Σ_d conv(P_d, W_d)(p),  P_d(q) = √(v_q v_{q+d}) ρ(d),  W_d(u) = W(u) W(u+d)
          lags  T_out(o, Δ) = Σ_i Σ_{u,u'} W[o,i,u] W[o,i,u'] ρ_i(sΔ + u' − u) Σ_P √v(sP+u) √v(sP+sΔ+u'),
                the output pairs whose taps both land inside the map (away from the border this is
                Σ_i Σ_d A[o,i,d] T_i(sΔ + d), A[o,i,d] = Σ_u W[o,i,u] W[o,i,u+d]: the filter's
                autocorrelation)
          back  v_g,in = Σ_Δ convᵀ(Q_Δ, W(u) W(u − sΔ)), the lags the same sum over tap pairs (A(−d))
          shape κ₃,out = conv(κ₃, W³), κ₄,out = conv(κ₄, W⁴) (κ₃ = γ₁ v^{3/2}, κ₄ = γ₂ v²: the cumulants
                of a weighted sum of independent taps), where the input carries them; the taps'
                joint cumulants are left out (a depthwise conv's inputs at init: nearly independent);
                a depthwise conv's neighbouring outputs share inputs: their joint cumulants
                (``Field.joint``, :mod:`joint`)
          dependence (depthwise, where the gradient carries ``Field.dependence``: an activation after
                its norm, g_out = f'(z) G) one input x_p moves each output z_q it reaches by w_j x_p,
                t_j = w_j √v_p / √v_q in standardized units, so (Mehler) E[f'(z_q) | ξ_p] ∝ 1 + r₁ t_j ξ_p
                + r₂ t_j² He₂(ξ_p) and E[f'(z_q)² | ξ_p] ∝ 1 + β₁ t_j ξ_p + β₂ t_j² He₂(ξ_p); over the pairs
                of taps (j, l) reaching p, with C_jl = Cov(g_out at the two outputs):
                  E[g_p² | ξ_p] − E[g_p²] = Σ_j w_j² C_jj (β₁ t_j He₁ + β₂ t_j² He₂)
                      + Σ_{j≠l} w_j w_l C_jl (2 r₁ t_j He₁ + (r₁ r₁' t_j t_l + 2 r₂ t_j²) He₂)
                (G's own dependence on x_p, second order, left out). Few taps, one channel's: a
                gradient carrying a part constant over the positions (the global pool's) makes the
                pairs' sum the larger; a dense conv's output moves by O(1/fan-in): not carried
avg pool  a conv with the box filter (adaptive and global pools too: every position-mean pattern kept)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe.correlated import centred, positions
from gatepool.analysis.probe.correlated.channels import Made, conv_channels, occupancy
from gatepool.analysis.probe.correlated.coupling import pointwise_conv_coupling
from gatepool.analysis.probe.correlated.field import (
    _DT,
    Field,
    _at_lag,
    _field_from_sums,
    _rho_strided,
    _shifted,
    lags_of,
    spectra,
)
from gatepool.analysis.probe.correlated.joint import depthwise_joint
from gatepool.analysis.probe.correlated.pad import Pad
from gatepool.analysis.probe.correlated.registry import pair, register_correlated_rule, register_named_rule
from gatepool.analysis.probe.correlated.steps import Steps


def _lags(kh: int, kw: int):
    return [(dh, dw) for dh in range(-(kh - 1), kh) for dw in range(-(kw - 1), kw)]


def _shift_prod(W: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """W(u) W(u + d) over the kernel (zero where u + d falls outside): (..., kh, kw)."""
    return W * _shifted(W, dh, dw)


def autocorr(W: torch.Tensor) -> torch.Tensor:
    """A[o, i, d] = Σ_u W[o,i,u] W[o,i,u+d]: (C_out, C_in, 2kh−1, 2kw−1), centre d = 0."""
    kh, kw = W.shape[-2:]
    A = torch.zeros((*W.shape[:2], 2 * kh - 1, 2 * kw - 1), dtype=W.dtype)
    for dh, dw in _lags(kh, kw):
        A[:, :, kh - 1 + dh, kw - 1 + dw] = _shift_prod(W, dh, dw).sum((-2, -1))
    return A


class Conv:
    """A 2-D conv from its actual weights (dense over channel pairs; groups by zeros), zero padding."""

    def __init__(self, weight, bias, stride, padding, groups: int = 1) -> None:
        self.weight, self.groups = weight.detach().to("cpu", _DT), groups  # (Co, Ci/groups, kh, kw)
        co, ci_g = self.weight.shape[:2]
        self.wshape = (co, ci_g * groups, *self.weight.shape[2:])  # the dense weight's
        # depthwise (each output reads one input channel): its own weights (Co, k) and that channel,
        # so the pairs' products skip the dense form's Ci-fold zeros
        depthwise = groups > 1 and ci_g == 1
        self.src = torch.arange(co) // (co // groups) if depthwise else None
        self.Wd = self.weight.flatten(1) if depthwise else None
        self.b = None if bias is None else bias.detach().to("cpu", _DT)
        self.stride, self.padding = stride, padding

    @property
    def W(self) -> torch.Tensor:
        """The dense weight (Co, Ci, kh, kw), the groups block-diagonal: built where asked, not kept (a
        depthwise conv of 768 channels' is 0.23 GB; ConvMixer-768/32's walk holds 32 of them)."""
        if self.groups == 1:
            return self.weight
        ci_g, per = self.weight.shape[1], self.wshape[0] // self.groups
        dense = torch.zeros(self.wshape, dtype=_DT)
        for g in range(self.groups):
            dense[g * per : (g + 1) * per, g * ci_g : (g + 1) * ci_g] = self.weight[g * per : (g + 1) * per]
        return dense

    def _conv(self, f: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
        """conv2d of one map (C, H, W) with ``weight`` in the grouped form (Co, Ci/groups, kh, kw)."""
        return F.conv2d(f[None], weight, bias, self.stride, self.padding, 1, self.groups)[0]

    def _own(self, src: torch.Tensor) -> torch.Tensor:
        """(Co, kh, kw): each output channel's kernel on the one input channel ``src`` it reads."""
        return self.weight[:, 0] if self.src is not None else self.W[torch.arange(len(src)), src]

    def _taps(self, f: torch.Tensor, out_hw) -> list[torch.Tensor]:
        """f(s·P + u − p) on the output grid for every tap u (zero where it falls in the padding)."""
        (kh, kw), (sh, sw), (ph, pw), (Ho, Wo) = self.wshape[-2:], self.stride, self.padding, out_hw
        pad = F.pad(f, (pw, pw, ph, ph))
        return [
            pad[:, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw]
            for a in range(kh)
            for b in range(kw)
        ]

    def _tap_offsets(self):
        kh, kw = self.wshape[-2:]
        return [(a, b) for a in range(kh) for b in range(kw)]

    @staticmethod
    def _pair_xcorr(S: torch.Tensor, size) -> Iterator[torch.Tensor]:
        """Σ_P S_j(P) S_l(P + Δ) for every l ≥ j, one (k − j, C, 2Ho−1, 2Wo−1) tensor per j (the pairs
        l < j are these at −Δ), from the maps S (k, C, Ho, Wo); centred as :func:`xcorr`. One j at a
        time: all of them at once are k²/2 maps of lags (0.9 GB at ConvNeXt-T's first 7 × 7 depthwise conv
        on 16 × 16)."""
        FS, FR = spectra(S)
        for j in range(len(S)):
            yield lags_of(FR[j] * FS[j:], *S.shape[-2:])

    def forward(self, x: Field) -> Field:
        self.x = x
        if x.components is not None:  # x = mix z: the weights W·mix on z's uncorrelated channels
            mix, z = x.components
            folded = Conv(torch.einsum("oiuv,ir->oruv", self.W, mix), None, self.stride, self.padding)
            eye = torch.eye(z.shape[0], dtype=_DT)  # the components: uncorrelated (their sums taken so too)
            out = folded.forward(replace(z, chan=eye, chan_dc=eye))
            self.out_var = out.var
            return replace(out, mean=self._conv(x.mean, self.weight, self.b))
        mean = self._conv(x.mean, self.weight, self.b)
        (Co, _, kh, kw), (sh, sw), (ph, pw) = self.wshape, self.stride, self.padding
        H, W = x.shape[1:]
        Ho, Wo = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
        if self.src is not None and positions.cheaper(Co, kh * kw, (H, W), (Ho, Wo)):
            var, T = positions.conv_forward(self._matrix((H, W), (Ho, Wo)), self.src, x, (Ho, Wo))
        else:
            var, T = self._pairs_forward(x, (Ho, Wo))
        chan = self._channels(x)
        if chan is not None:  # the input channels' correlation: each output's variance, wᵀ Σ w
            kappa = chan[0][:, None, None]
            var, T = var * kappa, T * kappa
        self.out_var = var
        out = self._shape(x, _field_from_sums(mean, var, T))
        out.chan, out.chan_dc = (None, None) if chan is None else chan[1:]
        if chan is not None and self.groups == 1:  # its channels at other lags, its siblings (a cat)
            out.made = Made(x, self.weight, self.stride, self.padding, var=out.var)
        return out

    def _matrix(self, in_hw, out_hw) -> torch.Tensor:
        """(Co, Ho·Wo, H·W): each output channel's map of its input channel's positions (depthwise)."""
        return positions.conv_matrix(self.Wd.reshape(-1, *self.wshape[-2:]), in_hw, out_hw, self.stride,
                                     self.padding)  # fmt: skip

    def _pairs_forward(self, x: Field, out_hw) -> tuple[torch.Tensor, torch.Tensor]:
        """The output's (variance map, lag sums) over the pairs of taps (see the module docstring)."""
        (Co, _, kh, kw), (Ho, Wo) = self.wshape, out_hw
        H, W = x.shape[1:]
        s = x.var.clamp_min(0).sqrt()
        size = (2 * Ho - 1, 2 * Wo - 1)
        n, m = size[0] * size[1], Ho * Wo
        # over the pairs of taps (j, l), S_j(P) = √v(sP + u_j − p) (0 in the padding):
        #   v_out(o, P)  = Σ_i Σ_{j,l} W_j W_l ρ_i(u_l − u_j) S_j(P) S_l(P)
        #   T_out(o, Δ) = Σ_i Σ_{j,l} W_j W_l ρ_i(sΔ + u_l − u_j) Σ_P S_j(P) S_l(P + Δ)  (the output pairs
        #                 exactly: both taps inside the map)
        # the pair (l, j) is (j, l) at −Δ: the pairs l ≥ j (j = l halved), then v = 2·V, T = U(Δ) + U(−Δ);
        # per j one matrix product over (l, i) of W_j W_l with the lag sums and the products S_j S_l
        Wt = None if self.src is not None else self.W.flatten(2).transpose(1, 2)  # (Co, k, Ci)
        S = torch.stack(self._taps(s, (Ho, Wo)))  # (k, Ci, Ho, Wo)
        offs, oi = _offsets(kh, kw)
        rho = torch.stack([_rho_strided(x.corr, (H, W), (Ho, Wo), self.stride, *o) for o in offs])
        U = torch.zeros((Co, n + m), dtype=_DT)
        for j, X in enumerate(self._pair_xcorr(S, size)):  # (k − j, Ci, 2Ho−1, 2Wo−1)
            R = rho[oi[j, j:]]  # (k − j, Ci, 2Ho−1, 2Wo−1): ρ(sΔ + u_l − u_j)
            Z = S[j] * S[j:] * R[:, :, Ho - 1 : Ho, Wo - 1 : Wo]  # (k − j, Ci, Ho, Wo)
            X *= R
            X[0] *= 0.5
            Z[0] *= 0.5
            XZ = torch.cat([X.reshape(len(X), -1, n), Z.reshape(len(X), -1, m)], 2)  # (k − j, Ci, n + m)
            if self.src is not None:  # depthwise: output o's pairs read its own channel only
                U += torch.einsum("ol,lon->on", self.Wd[:, j : j + 1] * self.Wd[:, j:], XZ[:, self.src])
            else:
                ww = Wt[:, j : j + 1] * Wt[:, j:]  # (Co, k − j, Ci): W_j W_l
                U += ww.reshape(Co, -1) @ XZ.reshape(-1, n + m)
        var = (2 * U[:, n:]).reshape(Co, Ho, Wo).clamp_min(0)
        U = U[:, :n].reshape(Co, *size)
        T = U + U.flip((-2, -1))
        T[:, Ho - 1, Wo - 1] = var.sum((1, 2))
        return var, T

    def _channels(self, x: Field):
        """(κ, R_out, Q_out) of :func:`channels.conv_channels` (None: x carries none, or past its cost)."""
        if x.chan is None or x.chan_dc is None:
            return None
        inside = occupancy(x.shape[1:], self.wshape[-2:], self.stride, self.padding)
        return conv_channels(self.weight, x, self.groups, inside, self.stride)

    def _shape(self, x: Field, out: Field) -> Field:
        """``out`` with its skewness and excess kurtosis, the taps taken independent:
        κ₃ = conv(γ₁ v^{3/2}, W³), κ₄ = conv(γ₂ v², W⁴) (zero padding: a constant, no cumulant)."""
        if x.skew is None and x.kurt is None:
            return out
        v = x.var.clamp_min(0)
        ok = out.var > 1e-300
        den = torch.where(ok, out.var, torch.ones_like(out.var))
        shape = {}
        for key, gamma, k in (("skew", x.skew, 3), ("kurt", x.kurt, 4)):
            if gamma is not None:
                kappa = self._conv(gamma * v ** (k / 2), self.weight**k)
                shape[key] = torch.where(ok, kappa / den ** (k / 2), 0.0)
        src = self._source()
        if src is not None and x.components is None:  # depthwise: neighbouring outputs share skewed inputs
            k3, k4 = (None if g is None else self._taps((g * v ** (k / 2))[src], out.shape[1:])
                      for g, k in ((x.skew, 3), (x.kurt, 4)))  # fmt: skip
            w = self._own(src)
            shape["joint"] = depthwise_joint(w, self._tap_offsets(), self.stride, k3, k4, out.var)
        return replace(out, **shape)

    def _source(self) -> torch.Tensor | None:
        """The input channel each output channel reads (Co,), where each reads one (depthwise); None else."""
        if self.src is not None:
            return self.src if bool((self.Wd.abs().sum(1) > 0).all()) else None
        reads = self.W.flatten(2).abs().sum(2) > 0  # (Co, Ci)
        if not bool((reads.sum(1) == 1).all()):
            return None
        return reads.to(torch.int8).argmax(1)

    def backward(self, g: Field) -> Field:
        x, (Co, Ci, kh, kw), (sh, sw), (ph, pw) = self.x, self.wshape, self.stride, self.padding
        H, W = x.shape[1:]
        if self.src is not None and positions.cheaper(Co, kh * kw, (H, W), g.shape[1:]):
            var, T = positions.conv_backward(self._matrix((H, W), g.shape[1:]), self.src, Ci, g, (H, W))
        else:
            var, T = self._pairs_backward(g)
        out = _field_from_sums(torch.zeros_like(var), var, T)
        if g.dependence is not None:
            out.dependence = self._dependence(g, var)
        out.centred = centred.through_conv(g, self.weight, self.groups, H * W)
        if (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and x.components is None:
            out.coupling = pointwise_conv_coupling(g.coupling, self.W[:, :, 0, 0])
        return out

    def _pairs_backward(self, g: Field) -> tuple[torch.Tensor, torch.Tensor]:
        """The input gradient's (variance map, lag sums) over the pairs of taps."""
        x, (Co, Ci, kh, kw), (sh, sw), (ph, pw) = self.x, self.wshape, self.stride, self.padding
        H, W = x.shape[1:]
        Ho, Wo = g.shape[1:]
        size = (2 * Ho - 1, 2 * Wo - 1)
        n, m = size[0] * size[1], Ho * Wo
        sg = g.var.clamp_min(0).sqrt()
        # over the pairs of taps (j, l), M_u the output positions whose tap u lands inside the input:
        #   v_in(i, q)  = Σ_o Σ_{j,l} W_j W_l Cov(g_P, g_{P+Δ}), q = sP + u_j − p, sΔ = u_j − u_l
        #   T_in(i, e)  = Σ_o Σ_{j,l} W_j W_l ρ_g(Δ) Σ_P sg(P) sg(P+Δ) M_j(P) M_l(P+Δ), e = sΔ + u_l − u_j
        # Taps with the same M (all but the border ones) share the sum over P: one FFT product per pair of
        # mask classes. As forward: the pairs (j, l) of class pairs c1 ≤ c2 (within a class j ≤ l, j = l
        # halved), then v = 2·V, T = U(e) + U(−e). Within a class pair T's term depends on the pair through
        # its tap offset d = u_l − u_j only: the weights W_j W_l summed per offset first (A(d), the filter's
        # autocorrelation, where all taps are of one class), one matrix product over o per offset, not per
        # pair (Mixer-S/32's 32 × 32 patch embedding: 524,800 pairs of one class, 3,969 offsets); v's
        # term per pair whose taps meet, grouped by the output lag Δ.
        masks = self._taps(torch.ones((1, H, W), dtype=_DT), (Ho, Wo))
        classes: list[torch.Tensor] = []
        of = []  # each tap's class
        for mask in masks:
            c = next((i for i, k in enumerate(classes) if torch.equal(k, mask)), None)
            if c is None:
                classes.append(mask)
                c = len(classes) - 1
            of.append(c)
        live = [c for c, mask in enumerate(classes) if bool(mask.any())] or [0]  # a tap that only ever
        members = tuple(tuple(j for j in range(len(of)) if of[j] == c) for c in live)  # reads the padding
        classes = [classes[c] for c in live]  # adds nothing (ConvNeXt-T's 7 × 7 on 2 × 2: 40 taps)
        taps = self._tap_offsets()
        at_lag = _input_lags(kh, kw, (sh, sw), (H, W), (Ho, Wo))  # (offsets, n): e = sΔ + d in U
        plan = _pair_plan(kh, kw, (sh, sw), (Ho, Wo), members)
        Wk = None if self.src is not None else self.W.flatten(2).permute(2, 1, 0).contiguous()  # (k, Ci, Co)
        U = torch.zeros(((2 * H - 1) * (2 * W - 1) + 1, Ci), dtype=_DT)  # the last row: e beyond the map
        acc_v = torch.zeros((len(taps), Ci, m), dtype=_DT)  # v's terms summed by tap j
        Q = {}  # Δ: Cov(g_P, g_{P+Δ}) (Co, Ho·Wo)
        for c1, X in enumerate(self._pair_xcorr(torch.stack([sg * c for c in classes]), size)):
            Y = (g.corr[None] * X).reshape(len(X), Co, n)  # ρ_g Σ_P S_c1 S_c2, c2 ≥ c1
            for c2 in range(c1, len(classes)):
                (jj, ll, half, d, at), meet = plan[c1, c2]
                B = self._pair_weights(Wk, jj, ll, half, at, len(d))  # (D, Ci, Co): per offset
                t = self._through(B, Y[c2 - c1])  # (D, Ci, n)
                U.index_add_(0, at_lag[d].flatten(), t.permute(0, 2, 1).reshape(-1, Ci))
                for D, i in meet:  # the pairs i meeting at Δ (a row of B each where B is per pair)
                    if D not in Q:
                        Q[D] = (sg * _shifted(sg, *D) * _at_lag(g.corr, *D)[:, None, None]).reshape(Co, m)
                    if at is not None:
                        Bv = self._pair_weights(Wk, jj[i], ll[i], half[i], None, len(i))
                    else:
                        Bv = B if len(i) == len(B) else B[i]
                    acc_v.index_add_(0, jj[i], self._through(Bv, Q[D]))
        vpad = torch.zeros((Ci, H + 2 * ph, W + 2 * pw), dtype=_DT)  # the input padded: tap j at sP + u_j
        for (a, b), v in zip(taps, acc_v):
            vpad[:, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw] += v.reshape(Ci, Ho, Wo)
        var = (2 * vpad[:, ph : ph + H, pw : pw + W]).clamp_min(0)
        U = U[:-1].T.reshape(Ci, 2 * H - 1, 2 * W - 1)
        T = U + U.flip((-2, -1))
        T[:, H - 1, W - 1] = var.sum((1, 2))
        return var, T

    def _pair_weights(self, Wk, jj, ll, half, at, rows: int) -> torch.Tensor:
        """Σ half · W_j W_l over the pairs (jj, ll) of each row ``at`` (None: a row per pair): (rows, Ci, Co)
        from Wk (k, Ci, Co), depthwise (rows, Co); the pairs a chunk at a time (a matrix (pairs, Ci, Co) of
        Mixer-S/32's 524,800 pairs: 6.4 GB)."""
        if self.src is not None:
            w = (self.Wd[:, jj] * self.Wd[:, ll] * half).T  # (J, Co)
            return w if at is None else torch.zeros((rows, len(self.src)), dtype=_DT).index_add_(0, at, w)
        step = max(1, 2**22 // (Wk.shape[1] * Wk.shape[2]))
        if at is None and len(jj) <= step:
            return Wk[jj] * Wk[ll] * half[:, None, None]
        out = torch.zeros((rows, *Wk.shape[1:]), dtype=_DT)
        for a in range(0, len(jj), step):
            j, l, h = jj[a : a + step], ll[a : a + step], half[a : a + step, None, None]
            out.index_add_(
                0, torch.arange(a, a + len(j)) if at is None else at[a : a + step], Wk[j] * Wk[l] * h
            )
        return out

    def _through(self, B: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Σ_o B[r, i, o] cols[o, :] (r, Ci, ·); depthwise B (r, Co): each output on its own input channel."""
        if self.src is None:
            return (B.reshape(-1, B.shape[-1]) @ cols).reshape(len(B), B.shape[1], -1)
        out = torch.zeros((len(B), self.wshape[1], cols.shape[1]), dtype=_DT)
        return out.index_add_(1, self.src, B[:, :, None] * cols[None])

    def _dependence(self, g: Field, var_in: torch.Tensor) -> tuple | None:
        """(β₁, β₂, None, None) of the input's gradient from the output's ``g.dependence`` (see the module
        docstring), for a conv whose every output channel reads one input channel (depthwise); None else."""
        Co, Ci = self.wshape[:2]
        src = self._source()  # (Co,) the input channel of each output channel
        if self.x.components is not None or src is None:
            return None
        w = self._own(src)  # (Co, kh, kw)
        (sh, sw), (ph, pw) = self.stride, self.padding
        H, W = self.x.shape[1:]
        Ho, Wo = g.shape[1:]
        b1, b2, r1, r2 = (torch.zeros_like(g.var) if t is None else t for t in g.dependence)
        sg, s_out = g.var.clamp_min(0).sqrt(), self.out_var.clamp_min(1e-300).sqrt()
        s_in = self._taps(self.x.var.clamp_min(0).sqrt()[src], (Ho, Wo))  # tap j's √v_p on the output grid
        taps = self._tap_offsets()
        base, t = [], []  # per tap j on the output grid: w_j sg, t_j
        for j, (a, b) in enumerate(taps):
            wj = w[:, a, b][:, None, None]
            base.append(wj * sg)
            t.append(wj * s_in[j] / s_out)
        he1 = [base[j] ** 2 * b1 * t[j] for j in range(len(taps))]  # the diagonal j = l
        he2 = [base[j] ** 2 * b2 * t[j] ** 2 for j in range(len(taps))]
        for j, (aj, bj) in enumerate(taps):  # the pairs j ≠ l landing on one input position: P_l = P_j + Δ
            for l, (al, bl) in enumerate(taps):
                dh, dw = aj - al, bj - bl
                if l == j or dh % sh or dw % sw:
                    continue
                dh, dw = dh // sh, dw // sw
                rho = _at_lag(g.corr, dh, dw)[:, None, None]
                other, other_r1 = _shifted(base[l], dh, dw), _shifted(base[l] * r1 * t[l], dh, dw)
                he1[j] = he1[j] + 2 * base[j] * r1 * t[j] * other * rho
                he2[j] = he2[j] + base[j] * (r1 * t[j] * other_r1 + 2 * r2 * t[j] ** 2 * other) * rho

        def to_input(maps: list[torch.Tensor]) -> torch.Tensor:  # tap j of output P lands at sP + u_j − p
            pad = torch.zeros((Co, H + 2 * ph, W + 2 * pw), dtype=_DT)
            for (a, b), v in zip(taps, maps):
                pad[:, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw] += v
            return torch.zeros((Ci, H, W), dtype=_DT).index_add_(0, src, pad[:, ph : ph + H, pw : pw + W])

        ok = var_in > 1e-300
        den = torch.where(ok, var_in, torch.ones_like(var_in))
        return tuple(torch.where(ok, to_input(h) / den, 0.0) for h in (he1, he2)) + (None, None)


@functools.lru_cache(maxsize=16)
def _offsets(kh: int, kw: int):
    """The tap offsets u_l − u_j of a kh × kw kernel, and (k, k) the index of each pair's among them."""
    offs = [(a, b) for a in range(-(kh - 1), kh) for b in range(-(kw - 1), kw)]
    ah, aw = torch.arange(kh).repeat_interleave(kw), torch.arange(kw).repeat(kh)  # tap j's (a, b)
    return offs, (kh - 1 + ah[None] - ah[:, None]) * (2 * kw - 1) + kw - 1 + aw[None] - aw[:, None]


@functools.lru_cache(maxsize=64)
def _input_lags(kh: int, kw: int, stride, in_hw, out_hw) -> torch.Tensor:
    """(offsets, (2Ho−1)(2Wo−1)): the input lag e = sΔ + d of each tap offset d (:func:`_offsets`) and
    output lag Δ, as an index into the (2H−1)(2W−1) lags, centred; (2H−1)(2W−1) where e is beyond the map."""
    (sh, sw), (H, W), (Ho, Wo) = stride, in_hw, out_hw
    offs, _ = _offsets(kh, kw)
    da, db = torch.tensor(offs).T
    eh = sh * torch.arange(-(Ho - 1), Ho)[None, :, None] + da[:, None, None]  # (offsets, 2Ho−1, 1)
    ew = sw * torch.arange(-(Wo - 1), Wo)[None, None, :] + db[:, None, None]  # (offsets, 1, 2Wo−1)
    inside = (eh.abs() < H) & (ew.abs() < W)
    return torch.where(inside, (H - 1 + eh) * (2 * W - 1) + W - 1 + ew, (2 * H - 1) * (2 * W - 1)).flatten(1)


@functools.lru_cache(maxsize=64)
def _pair_plan(kh: int, kw: int, stride, out_hw, members):
    """The backward's pairs of taps, per pair of mask classes c1 ≤ c2 (``members``: each class's taps):
    ((jj, ll) the pairs (within a class l ≥ j), their weight ½ (j = l) or 1, d the tap offsets u_l − u_j
    that occur (indices in :func:`_offsets`), at each pair's among d (None: one pair per offset)), and
    per output lag Δ at which two taps meet (u_j − u_l = sΔ) those pairs' indices."""
    (sh, sw), (Ho, Wo) = stride, out_hw
    _, oi = _offsets(kh, kw)
    plan = {}
    for c1, a in enumerate(members):
        for c2 in range(c1, len(members)):
            b = members[c2]
            pairs = [(j, l) for j in a for l in b if c2 > c1 or l >= j]
            jj, ll = torch.tensor(pairs).reshape(-1, 2).T
            half = torch.where(jj == ll, 0.5, 1.0).to(_DT)
            d, at = torch.unique(oi[jj, ll], return_inverse=True)
            d, at = (oi[jj, ll], None) if len(d) == len(jj) else (d, at)  # one pair per offset: as they come
            meet: dict = {}
            for i, (j, l) in enumerate(pairs):
                dh, dw = j // kw - l // kw, j % kw - l % kw
                if dh % sh == 0 and dw % sw == 0 and abs(dh // sh) < Ho and abs(dw // sw) < Wo:
                    meet.setdefault((dh // sh, dw // sw), []).append(i)
            plan[c1, c2] = (jj, ll, half, d.tolist(), at), [(D, torch.tensor(i)) for D, i in meet.items()]
    return plan


def box_conv(channels: int, kernel, stride, padding) -> Conv:
    """An average pool as a depthwise conv with the box filter 1/(kh·kw) (zero padding counted)."""
    kh, kw = kernel
    w = torch.full((channels, 1, kh, kw), 1.0 / (kh * kw), dtype=_DT)
    return Conv(w, None, stride, padding, groups=channels)


@register_correlated_rule(nn.Conv2d)
def conv_rule(m: nn.Conv2d, weight: torch.Tensor | None = None):
    """Conv2d with zero padding: given as numbers, ``'valid'``, or ``'same'`` (uneven for an even kernel:
    the map padded first, :class:`correlated.Pad`); a dilated kernel as the kernel with zeros between its
    taps (exact)."""
    if m.padding_mode != "zeros":
        raise NotImplementedError(f"conv rule: padding_mode {m.padding_mode!r} (zeros only)")
    weight = m.weight if weight is None else weight
    dh, dw = pair(m.dilation)
    if (dh, dw) != (1, 1):
        kh, kw = weight.shape[-2:]
        dilated = weight.new_zeros((*weight.shape[:2], dh * (kh - 1) + 1, dw * (kw - 1) + 1))
        dilated[..., ::dh, ::dw] = weight
        weight = dilated
    if m.padding == "valid":
        return Conv(weight, m.bias, pair(m.stride), (0, 0), m.groups)
    if m.padding != "same":
        return Conv(weight, m.bias, pair(m.stride), pair(m.padding), m.groups)
    (th, tw) = (k - 1 for k in weight.shape[-2:])  # torch's 'same': the extra row and column after
    if th % 2 == 0 and tw % 2 == 0:
        return Conv(weight, m.bias, pair(m.stride), (th // 2, tw // 2), m.groups)
    pad = Pad(tw // 2, tw - tw // 2, th // 2, th - th // 2)
    return Steps(pad, Conv(weight, m.bias, pair(m.stride), (0, 0), m.groups))


def _std_conv(m: nn.Conv2d, scaled: bool):
    """timm's ``StdConv2d`` and ``ScaledStdConv2d`` (NF-Nets, BiT): a conv whose weight is standardised
    per output channel, (W − mean)/√(var + eps), times ``gain · scale`` when scaled; the conv's rule on
    that weight (timm's own expression)."""
    w = m.weight.reshape(1, m.out_channels, -1)
    gain = (m.gain * m.scale).view(-1) if scaled else None
    w = F.batch_norm(w, None, None, weight=gain, training=True, momentum=0.0, eps=m.eps)
    return conv_rule(m, w.reshape_as(m.weight))


register_named_rule("timm.layers.std_conv.StdConv2d")(lambda m: _std_conv(m, scaled=False))
register_named_rule("timm.layers.std_conv.ScaledStdConv2d")(lambda m: _std_conv(m, scaled=True))


@register_named_rule("timm.layers.mixed_conv2d.MixedConv2d")
def mixed_conv_rule(m: nn.Module) -> Conv:
    """timm's ``MixedConv2d`` (MixNet's: the channels split, each piece its own conv and kernel size, the
    outputs stacked) as one conv: each piece's kernel zero-padded into the largest, placed so that it reads
    the same inputs (offset p_max − p_i, the pieces' paddings), its weights in its block of the channels;
    depthwise where every piece is. Exact; one conv, so the pieces' channels keep their correlation
    (``Field.chan``, which a cat of the pieces drops). Pieces that are plain ``nn.Conv2d`` with numeric
    zero padding and no dilation only (not ``Conv2dSame``)."""
    convs = list(m.values())
    if not convs or any(type(c) is not nn.Conv2d or c.padding_mode != "zeros" or isinstance(c.padding, str)
                        or pair(c.dilation) != (1, 1) for c in convs):  # fmt: skip
        raise NotImplementedError("mixed conv rule: pieces of nn.Conv2d with numeric zero padding only")
    strides = {pair(c.stride) for c in convs}
    if len(strides) != 1:
        raise NotImplementedError("mixed conv rule: pieces of one stride only")
    depthwise = all(c.groups == c.in_channels == c.out_channels for c in convs)
    if not depthwise and any(c.groups != 1 for c in convs):
        raise NotImplementedError("mixed conv rule: pieces all depthwise or all dense")
    K = tuple(max(c.weight.shape[2 + i] for c in convs) for i in (0, 1))
    P = tuple(max(pair(c.padding)[i] for c in convs) for i in (0, 1))
    Co, Ci = sum(c.out_channels for c in convs), sum(c.in_channels for c in convs)
    weight = torch.zeros((Co, 1 if depthwise else Ci, *K), dtype=_DT)
    o = i = 0
    for c in convs:
        kh, kw = c.weight.shape[-2:]
        (ah, aw) = (P[0] - pair(c.padding)[0], P[1] - pair(c.padding)[1])
        if ah < 0 or aw < 0 or ah + kh > K[0] or aw + kw > K[1]:
            raise NotImplementedError("mixed conv rule: a piece's padding places it outside the largest")
        cols = slice(0, 1) if depthwise else slice(i, i + c.in_channels)
        weight[o : o + c.out_channels, cols, ah : ah + kh, aw : aw + kw] = c.weight.detach().to("cpu", _DT)
        o, i = o + c.out_channels, i + c.in_channels
    biases = [torch.zeros(c.out_channels) if c.bias is None else c.bias.detach() for c in convs]
    bias = None if all(c.bias is None for c in convs) else torch.cat(biases)
    return Conv(weight, bias, strides.pop(), P, Co if depthwise else 1)
