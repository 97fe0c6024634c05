"""A gradient's batch mean below a BatchNorm's backward, against Monte Carlo (:mod:`correlated.centred`).

BatchNorm in training takes its input gradient's mean over the batch and the positions out. Its rule had
taken that mean as E[Ḡ²]/S (Ḡ the per-sample spatial mean, the samples independent) at every norm; below
the first one the samples' Ḡ sum to zero, and what the next norm removes is near 0. timm's
EfficientNet-B0 (49 norms, a gradient constant over the positions from its global pool) lost 1/32 of its
gradient at each and its backward fell to 0.77 of the measured at the stem (123 of 233 rows within 15%).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated import centred
from gatepool.analysis.probe.correlated_predict import predict_correlated

S, HW = 8, 4


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
        nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    ).double()  # fmt: skip


def _measured(net: nn.Sequential, at: list[str], draws: int = 400) -> dict[str, torch.Tensor]:
    """Per module in ``at``: its output gradient's S·E[m_c²] (m_c the mean over the batch and the
    positions) and E[Ḡ_c²], over ``draws`` batches of S N(0, 1) images and unit-noise seeds: (2, C)."""
    grads: dict[str, list] = {k: [] for k in at}

    def hook(k):
        def keep(m, a, o):
            o.register_hook(lambda g: grads[k].append(g.detach()))

        return keep

    for k in at:
        net[int(k)].register_forward_hook(hook(k))
    gen = torch.Generator().manual_seed(1)
    for _ in range(draws):
        out = net(torch.randn(S, 8, HW, HW, generator=gen, dtype=torch.float64))
        out.backward(torch.randn(out.shape, generator=gen, dtype=torch.float64))
    out = {}
    for k, gs in grads.items():
        G = torch.stack(gs)  # (draws, S, C, H, W)
        out[k] = torch.stack([S * (G.mean((1, 3, 4)) ** 2).mean(0), (G.mean((3, 4)) ** 2).mean((0, 1))])
    return out


def test_the_batch_mean_a_batchnorm_took_out_stays_out():
    """Below the second norm (module 4), at the first SiLU's output (2: through a 3 × 3 conv) and at its
    input (1: through the SiLU's factor), S·E[m²] is 0.014 and 0.08 of E[Ḡ²] (measured over 400
    batches); predicted as E[Ḡ²] − ``centred`` within 0.05 of E[Ḡ²] each (0.014 and 0.016), where the
    samples taken independent give E[Ḡ²] itself. Above the norms (5, 4) nothing has cancelled."""
    net = _net()
    pred = predict_correlated(net, cr.unit_noise(8, (HW, HW)), batch=S)
    meas = _measured(net, ["5", "4", "2", "1"])
    for k in ("5", "4"):
        assert pred[k].grad.centred is None
    for k in ("2", "1"):
        f = pred[k].grad
        whole = centred.spatial_mean2(f).mean()
        kept = whole - centred.cancelled(f).mean()
        m, sm = (float(v.mean()) for v in meas[k])
        assert abs(float(whole) / sm - 1) < 0.1  # the per-sample mean itself: predicted
        assert m < 0.1 * sm  # the batch has cancelled most of it
        assert abs(float(kept) - m) < 0.05 * sm
