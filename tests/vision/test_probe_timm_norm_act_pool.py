"""A max pool of timm's norm-and-activation output (``ConvNormAct``: a conv, then ``BatchNormAct2d``, the
norm and its ReLU one module), as timm's Inception v3 and DenseNet stems have it, and a cat of two such
outputs read by a max pool and by a conv (Inception's blocks). The module's output is its ReLU's: the
pool draws the ReLU's Gaussian input (max ReLU = ReLU max) and sends its gradient to the windows'
winners, where x > 0, so the ReLU's gate is not independent of it; the cat splits each user's gradient
on its own (``make test-vision``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.probe.measure import measure

pytest.importorskip("timm")


class _StemPool(nn.Module):
    """ConvNormAct → MaxPool2d(3, 2) → ConvNormAct, then a Linear over the map."""

    def __init__(self) -> None:
        from timm.layers import ConvNormAct

        super().__init__()
        self.stem, self.pool, self.conv = ConvNormAct(3, 8, 3), nn.MaxPool2d(3, 2), ConvNormAct(8, 8, 3)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 5 * 5, 10))

    def forward(self, x):
        return self.head(self.conv(self.pool(self.stem(x))))


class _CatPool(nn.Module):
    """Two ConvNormAct branches, their cat read by a 1 × 1 conv and by a MaxPool2d(3, 1, 1) then a 1 × 1
    conv; the two cat again, then a Linear over the map."""

    def __init__(self) -> None:
        from timm.layers import ConvNormAct

        super().__init__()
        self.a, self.b = ConvNormAct(4, 6, 3), ConvNormAct(4, 6, 1)
        self.one, self.pool, self.after = nn.Conv2d(12, 4, 1), nn.MaxPool2d(3, 1, 1), nn.Conv2d(12, 8, 1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(12 * 6 * 6, 10))

    def forward(self, x):
        c = torch.cat([self.a(x), self.b(x)], 1)
        return self.head(torch.cat([self.one(c), self.after(self.pool(c))], 1))


def _report(net: type[nn.Module], *shape: int):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return measure(net().double(), x, correlated=True, prediction=False, samples=0)


def _ratios(report, name: str) -> tuple[float, float]:
    row = report.rows[name]
    return row.predicted.var / row.forward.var, row.predicted.grad_e2 / row.backward.e2


def test_max_pool_of_a_norm_act():
    """512 N(0, 1) images of 3 × 12 × 12, seed 0's init: each module's Var within 10% and E[g²] within
    15% of the measurement (the same ratios as with ``BatchNorm2d`` then ``nn.ReLU`` in its place). With the
    module's output taken as a normal's, not a ReLU's, the pool's Var was 0.36 of the measurement, the
    stem's gradient 2.0 times it."""
    report = _report(_StemPool, 512, 3, 12, 12)
    for name in ("stem.conv", "stem", "pool", "conv.conv", "conv"):
        f, b = _ratios(report, name)
        assert abs(f - 1) < 0.10 and abs(b - 1) < 0.15, (name, f, b)


def test_cat_of_norm_acts_read_by_a_max_pool():
    """1024 N(0, 1) images of 4 × 6 × 6, seed 0's init: the branches' convs' gradient (the ReLUs' gate
    taken jointly with the pool's winners for the pool's part) within 15% of the measurement, where one
    independent gate for the whole gave ``a.conv`` 0.61 of it."""
    report = _report(_CatPool, 1024, 4, 6, 6)
    for name in ("a.conv", "b.conv", "a", "b"):
        f, b = _ratios(report, name)
        assert abs(f - 1) < 0.10 and abs(b - 1) < 0.15, (name, f, b)
