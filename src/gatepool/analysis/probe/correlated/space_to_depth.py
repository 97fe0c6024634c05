"""Space to depth (TResNet's stem, timm's ``SpaceToDepth(4)``): each bs × bs block of a (C, H, W) map
becomes bs² · C channels at one position of an (H/bs, W/bs) map, channel (i · bs + j) · C + c holding
x_c(bs P_h + i, bs P_w + j) (timm's view, permute (0, 3, 5, 1, 2, 4), view).

forward   the mean and variance maps rearranged; channel (i, j, c) at lag Δ: ρ_c(bs Δ) (the same input
          channel at bs Δ), exact. Two new channels of one input channel, (i, j) and (i', j'), are
          correlated by ρ_c(bs Δ + (i' − i, j' − j)), which the state (channels uncorrelated) cannot hold:
          the rule holds where the covariance it drops is nil against the variance it keeps: the lag
          sums |T(bs Δ + (i' − i, j' − j))| ≤ ``tol`` T(0) (T(e) ≈ ρ(e) · its pairs' count · v: a long lag
          of few pairs, whose ρ a few images measure with noise, weighs its pairs), the N(0, 1) images of
          the check; above ``tol`` it has no answer (NotImplementedError).
          The input's own components (``Field.components``: x − m = mix (z − m_z)) are rearranged with
          it, mix block-diagonal over the bs² positions of a block.
backward  the inverse rearrangement of the gradient's maps; ρ at an input lag bs Δ is the gradient's ρ(Δ)
          of its channel (i, j, c) averaged over the bs² of them, 0 at the other lags (the gradients of
          two positions of one block are two channels of the state: uncorrelated)
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe.correlated.field import _DT, Field, _field_from_sums
from gatepool.analysis.probe.correlated.pad import Pad
from gatepool.analysis.probe.correlated.registry import register_named_rule

_TOL = 0.05  # the largest |T(e)|/T(0) it drops (lags the rearrangement turns into two channels)


def _to_depth(t: torch.Tensor, bs: int) -> torch.Tensor:
    """(C, H, W) → (bs² C, H/bs, W/bs), timm's order."""
    C, H, W = t.shape
    t = t.reshape(C, H // bs, bs, W // bs, bs).permute(2, 4, 0, 1, 3)  # (bs, bs, C, H/bs, W/bs)
    return t.reshape(bs * bs * C, H // bs, W // bs)


def _to_space(t: torch.Tensor, bs: int) -> torch.Tensor:
    """The inverse of :func:`_to_depth`."""
    D, h, w = t.shape
    C = D // (bs * bs)
    return t.reshape(bs, bs, C, h, w).permute(2, 3, 0, 4, 1).reshape(C, h * bs, w * bs)


def _strided_corr(corr: torch.Tensor, bs: int, oh: int = 0, ow: int = 0) -> torch.Tensor:
    """ρ(bs Δ + (oh, ow)) of a (C, 2H−1, 2W−1) correlation at every lag Δ of the (H/bs, W/bs) map."""
    H, W = (corr.shape[-2] + 1) // 2, (corr.shape[-1] + 1) // 2
    h, w = H // bs, W // bs
    ih = H - 1 + bs * torch.arange(-(h - 1), h) + oh
    iw = W - 1 + bs * torch.arange(-(w - 1), w) + ow
    okh, okw = (ih >= 0) & (ih <= 2 * H - 2), (iw >= 0) & (iw <= 2 * W - 2)
    out = corr[:, ih.clamp(0, 2 * H - 2)][:, :, iw.clamp(0, 2 * W - 2)]
    return out * (okh[:, None] & okw[None, :]).to(out.dtype)


class SpaceToDepth:
    """timm's ``SpaceToDepth(block_size)`` of a (C, H, W) field, H and W multiples of the block."""

    def __init__(self, block_size: int = 4) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int ≥ 1, got {block_size!r}")
        self.bs = block_size

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        bs = self.bs
        if H % bs or W % bs:
            raise ValueError(f"the map's {H}×{W} must be multiples of block_size {bs}")
        T = x.lag_sums()
        T0 = T[:, H - 1, W - 1, None, None].clamp_min(1e-300)  # Σ_p v_p per channel
        within = max((float((_strided_corr(T, bs, a, b) / T0).abs().max()) for a in range(1 - bs, bs)
                      for b in range(1 - bs, bs) if (a, b) != (0, 0)), default=0.0)  # fmt: skip
        if within > _TOL:
            raise NotImplementedError(f"space to depth of a map correlated within a block (|T(e)|/T(0) up "
                                      f"to {within:.2f} > {_TOL}): its new channels would be correlated")
        self.shape = x.shape
        corr = _strided_corr(x.corr, bs).repeat(bs * bs, 1, 1)
        out = Field(_to_depth(x.mean, bs), _to_depth(x.var, bs), corr)
        if x.components is not None:
            mix, z = x.components
            out.components = (torch.kron(torch.eye(bs * bs, dtype=_DT), mix.to(_DT)), self._z(z))
        return out

    def _z(self, z: Field) -> Field:
        bs = self.bs
        corr = _strided_corr(z.corr, bs).repeat(bs * bs, 1, 1)
        return Field(_to_depth(z.mean, bs), _to_depth(z.var, bs), corr)

    def backward(self, g: Field) -> Field:
        bs = self.bs
        C, H, W = self.shape
        var = _to_space(g.var, bs)
        h, w = H // bs, W // bs
        # ρ of input channel c at lag bs Δ: its bs² channels' lag sums, over its own envelope
        T = g.lag_sums().reshape(bs * bs, C, 2 * h - 1, 2 * w - 1).sum(0)
        full = torch.zeros((C, 2 * H - 1, 2 * W - 1), dtype=_DT)
        full[:, H - 1 - bs * (h - 1) :: bs, W - 1 - bs * (w - 1) :: bs] = T
        return _field_from_sums(torch.zeros_like(var), var, full)


register_named_rule("timm.layers.space_to_depth.SpaceToDepth")(lambda m: SpaceToDepth(m.bs))


class PatchMerging(SpaceToDepth):
    """torchvision's Swin ``_patch_merging_pad`` of a channels-last map: a zero row and column after an odd
    side, then each 2 × 2 block into 4 C channels in the order x(0, 0), x(1, 0), x(0, 1), x(1, 1) (timm's
    with the middle two swapped)."""

    _ORDER = (0, 2, 1, 3)  # torchvision's block k is timm's block _ORDER[k]

    def __init__(self) -> None:
        super().__init__(2)

    def _blocks(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(4, -1, *t.shape[1:])[list(self._ORDER)].reshape(t.shape)

    def forward(self, x: Field) -> Field:
        C, H, W = x.shape
        self.pad = Pad(0, W % 2, 0, H % 2)
        out = super().forward(self.pad.forward(x))
        if out.components is not None:
            raise NotImplementedError("patch merging of an input with its own components")
        return Field(self._blocks(out.mean), self._blocks(out.var), self._blocks(out.corr))

    def backward(self, g: Field) -> Field:
        return self.pad.backward(super().backward(Field(self._blocks(g.mean), self._blocks(g.var),
                                                        self._blocks(g.corr))))


register_named_rule("torchvision.models.swin_transformer._patch_merging_pad")(lambda x: PatchMerging())
