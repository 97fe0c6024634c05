"""A map padded with a constant: ``F.pad(x, (left, right, top, bottom), value=c)`` (hgnetv2's stem), and
the uneven zero padding of a conv given ``padding='same'`` with an even kernel.

forward   the mean map padded with c, the variance map with 0 (the padding is fixed); the lag sums
          T(e) = Σ_p Cov(x_p, x_{p+e}) are those of the map (a padded value pairs with nothing), set in
          the larger map's lag range
backward  the gradient at the map's positions (the padding's dropped): its variance map cut out, its
          stationary correlation at the smaller map's lags
nothing   a constant pad of 0 on every side, of any tensor (Swin's channels-last pad to whole windows
          where the map is already whole: 6 sides of 0): the tensor itself, exactly
"""

from __future__ import annotations

import torch.nn.functional as F

from gatepool.analysis.probe.correlated.field import Field, _field_from_sums


class Pad:
    """``F.pad(x, (left, right, top, bottom), value=value)`` of a (C, H, W) field (pads ≥ 0)."""

    def __init__(self, left: int, right: int, top: int, bottom: int, value: float = 0.0) -> None:
        pads = (left, right, top, bottom)
        if not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pads):
            raise ValueError(f"the pads (left, right, top, bottom) must be ints ≥ 0, got {pads}")
        self.pads, self.value = pads, float(value)

    def forward(self, x: Field) -> Field:
        left, right, top, bottom = self.pads
        self.hw = x.shape[1:]
        mean = F.pad(x.mean, self.pads, value=self.value)
        var = F.pad(x.var, self.pads)
        dh, dw = top + bottom, left + right  # the lag range grows by the new rows and columns each way
        T = F.pad(x.lag_sums(), (dw, dw, dh, dh))
        return _field_from_sums(mean, var, T)

    def backward(self, g: Field) -> Field:
        left, _, top, _ = self.pads
        (H, W), (Hp, Wp) = self.hw, g.shape[1:]
        cut = (slice(None), slice(top, top + H), slice(left, left + W))
        corr = g.corr[:, Hp - H : Hp + H - 1, Wp - W : Wp + W - 1]
        return Field(g.mean[cut], g.var[cut], corr)


def adds_nothing(pads, mode: str = "constant") -> bool:
    """Whether ``F.pad(x, pads, mode)`` is ``x`` itself: a constant pad of 0 on every side, whatever the
    tensor's layout and the pads' count."""
    return mode == "constant" and all(isinstance(p, int) and not isinstance(p, bool) and p == 0 for p in pads)
