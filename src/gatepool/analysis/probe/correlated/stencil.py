"""A stride-1 map of the positions whose tap weights depend on the output position, the same at every
channel: an ``AvgPool2d(k, 1, p)`` without ``count_include_pad`` (each window divided by its taps inside
the map: a conv with border-dependent weights), and PoolFormer's and EfficientFormer's ``pool(x) − x``
(the centre tap less one). No dense matrix of the positions, so any map size.

          y(P) = Σ_j a_j(P) x(P + u_j − p)
forward   m_out(P) = Σ_j a_j(P) m(P + u_j − p); the variance and the lag sums as a depthwise conv's
          (:class:`conv.Conv`) with the taps' weights in the maps S_j(P) = a_j(P) √v(P + u_j − p):
          v_out(P) = Σ_{j,l} ρ(u_l − u_j) S_j(P) S_l(P),
          T_out(Δ) = Σ_{j,l} ρ(Δ + u_l − u_j) Σ_P S_j(P) S_l(P + Δ)   (exact at every position)
backward  g_in(q) = Σ_j a_j(q + p − u_j) g(q + p − u_j): the same map with the taps flipped,
          b_{k−1−u}(q) = a_u(q + p − u), padding k − 1 − p
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gatepool.analysis.probe.correlated import positions
from gatepool.analysis.probe.correlated.conv import Conv
from gatepool.analysis.probe.correlated.field import _DT, Field


class Stencil(Conv):
    """y(P) = Σ_u a[u](P) x(P + u − p) at every channel: ``a`` (kh, kw, Ho, Wo), stride 1."""

    def __init__(self, channels: int, a: torch.Tensor, padding: tuple[int, int]) -> None:
        kh, kw, Ho, Wo = a.shape
        super().__init__(torch.ones((channels, 1, kh, kw), dtype=_DT), None, (1, 1), padding, groups=channels)
        self.a = a.to(_DT)

    def _taps(self, f: torch.Tensor, out_hw) -> list[torch.Tensor]:
        kw = self.a.shape[1]
        return [t * self.a[j // kw, j % kw] for j, t in enumerate(super()._taps(f, out_hw))]

    def _matrix(self, in_hw, out_hw) -> torch.Tensor:
        a = self.a.expand(len(self.Wd), *self.a.shape)  # (C, kh, kw, Ho, Wo): every channel's
        return positions.conv_matrix(a, in_hw, out_hw, self.stride, self.padding)

    def forward(self, x: Field) -> Field:
        if x.components is not None:
            raise NotImplementedError("a position-dependent stencil of the input's mixed channels")
        out_hw = self.a.shape[2:]
        H, W = x.shape[1:]
        (ph, pw), (kh, kw) = self.padding, self.a.shape[:2]
        if (H + 2 * ph - kh + 1, W + 2 * pw - kw + 1) != tuple(out_hw):
            raise ValueError(f"the stencil maps {out_hw} outputs, the {H}×{W} map gives another size")
        self.x = x
        out = super().forward(Field(x.mean, x.var, x.corr))
        return replace(out, mean=sum(self._taps(x.mean, out_hw)))

    def backward(self, g: Field) -> Field:
        kh, kw, Ho, Wo = self.a.shape
        (ph, pw), (H, W) = self.padding, self.x.shape[1:]
        b = torch.zeros((kh, kw, H, W), dtype=_DT)
        for u in range(kh):
            for v in range(kw):  # b(q) = a(q + d), d = p − u: the q with q + d inside the output
                dh, dw = ph - u, pw - v
                h0, h1, w0, w1 = max(0, -dh), min(H, Ho - dh), max(0, -dw), min(W, Wo - dw)
                if h0 < h1 and w0 < w1:
                    src = self.a[u, v, h0 + dh : h1 + dh, w0 + dw : w1 + dw]
                    b[kh - 1 - u, kw - 1 - v, h0:h1, w0:w1] = src
        back = Stencil(g.shape[0], b, (kh - 1 - ph, kw - 1 - pw))
        return back.forward(Field(torch.zeros_like(g.mean), g.var, g.corr))


def pool_stencil(channels: int, A_h: torch.Tensor, A_w: torch.Tensor, kernel, padding, minus_identity=False
                 ) -> Stencil:  # fmt: skip
    """The stride-1 pool whose windows along the two sides are A_h (Ho, H) and A_w (Wo, W)
    (:func:`adaptive.avg_windows`) as a stencil; ``minus_identity``: ``pool(x) − x``."""
    (kh, kw), (ph, pw) = kernel, padding
    (Ho, H), (Wo, W) = A_h.shape, A_w.shape
    a = torch.zeros((kh, kw, Ho, Wo), dtype=_DT)
    for u in range(kh):
        rows = torch.arange(Ho) + u - ph
        ah = torch.where((rows >= 0) & (rows < H), A_h[torch.arange(Ho), rows.clamp(0, H - 1)], 0.0)
        for v in range(kw):
            cols = torch.arange(Wo) + v - pw
            aw = torch.where((cols >= 0) & (cols < W), A_w[torch.arange(Wo), cols.clamp(0, W - 1)], 0.0)
            a[u, v] = ah[:, None] * aw[None, :]
    if minus_identity:
        if (Ho, Wo) != (H, W) or not (0 <= ph < kh and 0 <= pw < kw):
            raise NotImplementedError("pool(x) − x of a pool that changes the map's size")
        a[ph, pw] -= 1.0
    return Stencil(channels, a, (ph, pw))
