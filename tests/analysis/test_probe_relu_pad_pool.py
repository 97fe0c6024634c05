"""A max pool of f(ReLU(y)) with f a zero pad, a positive scale or a zero shift (HGNetV2's stem: its ReLU,
``LearnableAffineBlock`` at init, ``F.pad(x, (0, 1, 0, 1))``, a 2 × 2 pool at stride 1) draws f(y) and
rectifies the max, as for a pool right after the ReLU: f(ReLU(y)) = ReLU(f(y)). Without it the pool drew
normals of the rectified moments and came out 0.42 of the measured variance on HGNetV2-B0."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import DT

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe import correlated_predict
from gatepool.analysis.probe.correlated_predict import predict_correlated


class _Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.act = nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.ReLU()
        self.scale, self.pool = nn.Parameter(torch.ones(1)), nn.MaxPool2d(2, 1, ceil_mode=True)

    def forward(self, x):
        y = self.act(self.conv(x)) * self.scale + 0.0  # (B, 6, H, W)
        return self.pool(F.pad(y, (0, 1, 0, 1)))  # (B, 6, H, W)


def test_a_pool_of_a_padded_relu_output_draws_the_relus_input(monkeypatch):
    """The pool's variance within 2% of Monte Carlo's (4096 images: 1.003); with the ReLU's output drawn
    as normals of its moments, over 15% off (0.43)."""
    torch.manual_seed(0)
    model = _Stem().double()
    x = torch.randn(4096, 3, 10, 10, generator=torch.Generator().manual_seed(1), dtype=DT)
    with torch.no_grad():
        measured = float(model(x).var())
    ratio = predict_correlated(model, cr.measure_input(x), backward=None)["pool"].var / measured
    assert abs(ratio - 1) < 0.02, ratio
    monkeypatch.setattr(correlated_predict, "_commutes_with_relu", lambda step: False)
    ratio = predict_correlated(model, cr.measure_input(x), backward=None)["pool"].var / measured
    assert abs(ratio - 1) > 0.15, ratio
