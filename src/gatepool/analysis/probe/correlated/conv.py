"""conv (and every linear map with a kernel: avg pools, the global pool).

conv      mean  m_out = conv(m, W) + b
          var   v_out(p) = Σ_d conv(P_d, W_d)(p),  P_d(q) = √(v_q v_{q+d}) ρ(d),  W_d(u) = W(u) W(u+d)
          lags  T_out(o, Δ) = Σ_i Σ_{u,u'} W[o,i,u] W[o,i,u'] ρ_i(sΔ + u' − u) Σ_P √v(sP+u) √v(sP+sΔ+u'),
                the output pairs whose taps both land inside the map (away from the border this is
                Σ_i Σ_d A[o,i,d] T_i(sΔ + d), A[o,i,d] = Σ_u W[o,i,u] W[o,i,u+d]: the filter's
                autocorrelation)
          back  v_g,in = Σ_Δ convᵀ(Q_Δ, W(u) W(u − sΔ)), the lags the same sum over tap pairs (A(−d))
avg pool  a conv with the box filter (adaptive and global pools too: every position-mean pattern kept)
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated.field import _DT, Field, _at_lag, _field_from_sums, _rho_strided


def _lags(kh: int, kw: int):
    return [(dh, dw) for dh in range(-(kh - 1), kh) for dw in range(-(kw - 1), kw)]


def _shifted(f: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """g(q) = f(q + d), zero outside."""
    H, W = f.shape[-2:]
    out = torch.zeros_like(f)
    h0, h1 = max(0, -dh), min(H, H - dh)
    w0, w1 = max(0, -dw), min(W, W - dw)
    if h0 < h1 and w0 < w1:
        out[..., h0:h1, w0:w1] = f[..., h0 + dh : h1 + dh, w0 + dw : w1 + dw]
    return out


def _shift_prod(W: torch.Tensor, dh: int, dw: int) -> torch.Tensor:
    """W(u) W(u + d) over the kernel (zero where u + d falls outside): (..., kh, kw)."""
    return W * _shifted(W, dh, dw)


def _shift_prods(W: torch.Tensor, lags, dim: int) -> torch.Tensor:
    """:func:`_shift_prod` of (Co, Ci, kh, kw) weights at every lag, stacked along ``dim`` (0: the
    lag-major (n·Co, Ci, kh, kw), 1: (Co, n·Ci, kh, kw)), written in place (no per-lag copies)."""
    Co, Ci, kh, kw = W.shape
    out = torch.zeros((len(lags), Co, Ci, kh, kw) if dim == 0 else (Co, len(lags), Ci, kh, kw), dtype=W.dtype)
    for n, (dh, dw) in enumerate(lags):
        h0, h1, w0, w1 = max(0, -dh), min(kh, kh - dh), max(0, -dw), min(kw, kw - dw)
        if h0 < h1 and w0 < w1:
            prod = W[..., h0:h1, w0:w1] * W[..., h0 + dh : h1 + dh, w0 + dw : w1 + dw]
            (out[n] if dim == 0 else out[:, n])[..., h0:h1, w0:w1] = prod
    return out.reshape(-1, Ci, kh, kw) if dim == 0 else out.reshape(Co, -1, kh, kw)


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
        W = weight.detach().to("cpu", _DT)
        if groups > 1:  # block-diagonal dense weight
            co, ci_g = W.shape[:2]
            dense = torch.zeros((co, ci_g * groups, *W.shape[2:]), dtype=_DT)
            per = co // groups
            for g in range(groups):
                dense[g * per : (g + 1) * per, g * ci_g : (g + 1) * ci_g] = W[g * per : (g + 1) * per]
            W = dense
        self.W = W
        self.b = None if bias is None else bias.detach().to("cpu", _DT)
        self.stride, self.padding = stride, padding

    def _taps(self, f: torch.Tensor, out_hw) -> list[torch.Tensor]:
        """f(s·P + u − p) on the output grid for every tap u (zero where it falls in the padding)."""
        (kh, kw), (sh, sw), (ph, pw), (Ho, Wo) = self.W.shape[-2:], self.stride, self.padding, out_hw
        pad = F.pad(f, (pw, pw, ph, ph))
        return [
            pad[:, a : a + sh * (Ho - 1) + 1 : sh, b : b + sw * (Wo - 1) + 1 : sw]
            for a in range(kh)
            for b in range(kw)
        ]

    def _tap_offsets(self):
        kh, kw = self.W.shape[-2:]
        return [(a, b) for a in range(kh) for b in range(kw)]

    def _tap_xcorr(self, FS, j, size, Ho, Wo):
        """Σ_P S_j(P) S_l(P + Δ) for every tap l: (k, C, 2Ho−1, 2Wo−1), from the taps' FFTs FS (k, C, …)."""
        return torch.roll(torch.fft.irfft2(FS[j].conj()[None] * FS, s=size), (Ho - 1, Wo - 1), (-2, -1))

    def forward(self, x: Field) -> Field:
        self.x = x
        if x.components is not None:  # x = mix z: the weights W·mix on z's uncorrelated channels
            mix, z = x.components
            folded = Conv(torch.einsum("oiuv,ir->oruv", self.W, mix), None, self.stride, self.padding)
            out = folded.forward(z)
            return replace(out, mean=F.conv2d(x.mean[None], self.W, self.b, self.stride, self.padding)[0])
        mean = F.conv2d(x.mean[None], self.W, self.b, self.stride, self.padding)[0]
        s = x.var.clamp_min(0).sqrt()
        H, W = x.shape[1:]
        lags = [(dh, dw) for dh, dw in _lags(*self.W.shape[-2:]) if abs(dh) < H and abs(dw) < W]  # in the map
        P = torch.cat(
            [s * _shifted(s, dh, dw) * _at_lag(x.corr, dh, dw)[:, None, None] for dh, dw in lags], 0
        )
        Wd = _shift_prods(self.W, lags, 1)  # (Co, nd·Ci, kh, kw)
        var = F.conv2d(P[None], Wd, None, self.stride, self.padding)[0].clamp_min(0)  # (nd·Ci, H, W) in
        # T_out(o, Δ) = Σ_{u,u'} Σ_i W_u W_u' ρ_i(sΔ + u' − u) Σ_P s(sP+u−p) s(sP+sΔ+u'−p): the output pairs
        # exactly (both taps inside the map), every pair of taps
        Ho, Wo = var.shape[1:]
        size = (2 * Ho - 1, 2 * Wo - 1)
        FS = torch.fft.rfft2(torch.stack(self._taps(s, (Ho, Wo))), s=size)  # (k, Ci, …)
        taps, Wf = self._tap_offsets(), self.W.flatten(2)  # Wf (Co, Ci, k)
        rho = {}
        T = torch.zeros((self.W.shape[0], *size), dtype=_DT)
        for j, (a1, b1) in enumerate(taps):
            R = []
            for a2, b2 in taps:
                off = (a2 - a1, b2 - b1)
                if off not in rho:
                    rho[off] = _rho_strided(x.corr, x.shape[1:], (Ho, Wo), self.stride, *off)
                R.append(rho[off])
            ww = (Wf[:, :, j : j + 1] * Wf).permute(2, 0, 1)  # (k, Co, Ci): W_j W_l
            T += torch.einsum("loi,lihw->ohw", ww, torch.stack(R) * self._tap_xcorr(FS, j, size, Ho, Wo))
        T[:, Ho - 1, Wo - 1] = var.sum((1, 2))
        return _field_from_sums(mean, var, T)

    def backward(self, g: Field) -> Field:
        x, (kh, kw), (sh, sw) = self.x, self.W.shape[-2:], self.stride
        H, W = x.shape[1:]
        Ho, Wo = g.shape[1:]
        sg = g.var.clamp_min(0).sqrt()
        deltas = [
            (a, b)
            for a in range(-min((kh - 1) // sh, Ho - 1), min((kh - 1) // sh, Ho - 1) + 1)
            for b in range(-min((kw - 1) // sw, Wo - 1), min((kw - 1) // sw, Wo - 1) + 1)
        ]  # the output lags two taps of one input position span, within the map
        Q = torch.cat([sg * _shifted(sg, a, b) * _at_lag(g.corr, a, b)[:, None, None] for a, b in deltas], 0)
        Wp = _shift_prods(self.W, [(-sh * a, -sw * b) for a, b in deltas], 0)  # W(u) W(u − sΔ)
        # convᵀ(Q, Wp) as one matrix product and a fold (float64 conv_transpose2d is slow on the CPU)
        cols = Wp.reshape(Wp.shape[0], -1).T @ Q.reshape(Q.shape[0], -1)  # (Ci·kh·kw, Ho·Wo)
        var = F.fold(cols[None], (H, W), (kh, kw), padding=self.padding, stride=self.stride)[0].clamp_min(0)
        # T_in(i, e) = Σ_{u,u'} Σ_o W_u W_u' Σ_Δ ρ_g(Δ) Σ_P sg(P) sg(P+Δ) M_u(P) M_u'(P+Δ), e = sΔ + u' − u,
        # M_u the output positions whose tap u lands inside the input. Taps with the same M (all but the
        # border ones) share the sum over P: one FFT product per pair of mask classes.
        masks = self._taps(torch.ones((1, H, W), dtype=_DT), (Ho, Wo))
        classes: list[torch.Tensor] = []
        of = []  # each tap's class
        for m in masks:
            c = next((i for i, k in enumerate(classes) if torch.equal(k, m)), None)
            if c is None:
                classes.append(m)
                c = len(classes) - 1
            of.append(c)
        size = (2 * Ho - 1, 2 * Wo - 1)
        FS = torch.fft.rfft2(torch.stack([sg * m for m in classes]), s=size)  # (K, Co, …)
        kk = max(kh, kw)
        big = torch.zeros((x.shape[0], 2 * H - 1 + 2 * kk, 2 * W - 1 + 2 * kk), dtype=_DT)
        taps, Wf = self._tap_offsets(), self.W.flatten(2)  # Wf (Co, Ci, k)
        members = [[j for j in range(len(taps)) if of[j] == c] for c in range(len(classes))]
        for c1, js in enumerate(members):
            Y = g.corr[None] * self._tap_xcorr(FS, c1, size, Ho, Wo)  # (K, Co, …): ρ_g Σ_P S_c1 S_c2
            for c2, ls in enumerate(members):
                ww = Wf[:, :, js, None] * Wf[:, :, None, ls]  # (Co, Ci, |c1|, |c2|): W_j W_l
                vals = torch.einsum("oijl,ohw->jlihw", ww, Y[c2])
                for a, j in enumerate(js):
                    for b, l in enumerate(ls):
                        (a1, b1), (a2, b2) = taps[j], taps[l]
                        h0, w0 = H - 1 + kk - sh * (Ho - 1) + a2 - a1, W - 1 + kk - sw * (Wo - 1) + b2 - b1
                        big[
                            :, h0 : h0 + sh * (2 * Ho - 2) + 1 : sh, w0 : w0 + sw * (2 * Wo - 2) + 1 : sw
                        ] += vals[a, b]
        T = big[:, kk : kk + 2 * H - 1, kk : kk + 2 * W - 1].clone()
        T[:, H - 1, W - 1] = var.sum((1, 2))
        return _field_from_sums(torch.zeros_like(var), var, T)


def box_conv(channels: int, kernel, stride, padding) -> Conv:
    """An average pool as a depthwise conv with the box filter 1/(kh·kw) (zero padding counted)."""
    kh, kw = kernel
    w = torch.full((channels, 1, kh, kw), 1.0 / (kh * kw), dtype=_DT)
    return Conv(w, None, stride, padding, groups=channels)
