"""The joint cumulants of a depthwise conv's neighbouring outputs (``Field.joint``), against Monte Carlo.

A depthwise conv's outputs share inputs; where those are skewed (an activation's), the outputs' pairs are
not jointly Gaussian given their correlation: on a small map they share the energy of the same few
inputs. The pool of the activation after its norm (MobileNetV3's squeeze-and-excitation gates) then has
more variance than the Gaussian state's lags give: 0.61–0.75 of it predicted in MobileNetV3-small.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import correlated as cr

DT = torch.float64
ACTS = {"hardswish": (F.hardswish, lambda: cr.Pointwise("hardswish")), "relu": (torch.relu, cr.ReLU)}


def _white(C: int, H: int) -> cr.Field:
    corr = torch.zeros((C, 2 * H - 1, 2 * H - 1), dtype=DT)
    corr[:, H - 1, H - 1] = 1.0
    return cr.Field(torch.zeros((C, H, H), dtype=DT), torch.ones((C, H, H), dtype=DT), corr)


def _norm(t: torch.Tensor) -> torch.Tensor:
    return (t - t.mean((0, 2, 3), keepdim=True)) / t.var((0, 2, 3), keepdim=True).sqrt()


def _pool_variance(act: str, k: int, H: int) -> tuple[float, float]:
    """expand 16 → 64 → norm → act → depthwise k × k → norm → Hardswish on H × H from white N(0, 1): the
    variance of the map's mean per channel, predicted over 8000 draws', with ``joint`` and without."""
    torch.manual_seed(0)
    ex, dw = (
        nn.Conv2d(16, 64, 1, bias=False).double(),
        nn.Conv2d(64, 64, k, padding=k // 2, groups=64, bias=False),
    )
    dw = dw.double()
    f, rule = ACTS[act]
    x = torch.randn(8000, 16, H, H, dtype=DT, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = F.hardswish(_norm(dw(f(_norm(ex(x))))))
    measured = float(y.mean((2, 3)).var(0).mean())
    field = _white(16, H)
    steps = [
        cr.Conv(ex.weight, None, (1, 1), (0, 0)),
        cr.BatchNorm(None, None, 0.0),
        rule(),
        cr.Conv(dw.weight, None, (1, 1), dw.padding, groups=64),
        cr.BatchNorm(None, None, 0.0),
    ]
    for step in steps:
        field = step.forward(field)
    out = [cr.Pointwise("hardswish").forward(f) for f in (field, replace(field, joint=None))]
    return tuple(float(o.lag_sums().sum((1, 2)).mean()) / H**4 / measured for o in out)


@pytest.mark.parametrize("act, k, H", [("hardswish", 5, 4), ("relu", 5, 4), ("hardswish", 3, 8)])
def test_pool_of_the_activation_after_a_depthwise_conv(act, k, H):
    """Within 3% with the joint cumulants (measured 1.011, 1.008, 0.995); without, 0.80, 0.82, 0.86."""
    with_joint, without = _pool_variance(act, k, H)
    assert abs(with_joint - 1) < 0.03, (with_joint, without)
    assert without < 0.9, (with_joint, without)


def test_a_dense_conv_carries_no_joint_cumulants():
    """Outputs that read many channels: the shared inputs' cumulants average away (not carried)."""
    f = cr.ReLU().forward(_white(4, 4))
    assert cr.Conv(torch.randn(4, 4, 3, 3, dtype=DT), None, (1, 1), (1, 1)).forward(f).joint is None
    dw = cr.Conv(torch.randn(4, 1, 3, 3, dtype=DT), None, (1, 1), (1, 1), groups=4).forward(f)
    assert dw.joint is not None and len(dw.joint) == 24  # the lags of a 3 × 3 kernel's pairs, stride 1


class _Mixer(nn.Module):
    """A small ConvMixer: a patch stem, then blocks of a depthwise conv's residual (conv, an identity,
    ReLU, BatchNorm) and a 1 × 1 conv, ReLU, BatchNorm."""

    def __init__(self, C: int = 8, k: int = 5, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, C, 4, stride=4), nn.ReLU(), nn.BatchNorm2d(C))
        self.dw = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(C, C, k, padding=k // 2, groups=C), nn.Identity(), nn.ReLU(), nn.BatchNorm2d(C)
            )
            for _ in range(blocks)
        )
        self.pw = nn.ModuleList(
            nn.Sequential(nn.Conv2d(C, C, 1), nn.ReLU(), nn.BatchNorm2d(C)) for _ in range(blocks)
        )
        self.head = nn.Linear(C, 10)

    def forward(self, x):
        x = self.stem(x)
        for dw, pw in zip(self.dw, self.pw):
            x = pw(dw(x) + x)
        return self.head(x.mean((2, 3)))


def test_the_walk_lets_the_joint_cumulants_go_once_read(monkeypatch):
    """The rows hold no depthwise conv's joint cumulants after the walk (0.25 GB each at ConvMixer-768's),
    and the forward's prediction is the one of a walk that keeps them all, to 1e-10."""
    from gatepool.analysis.probe import correlated_predict as cp

    torch.manual_seed(0)
    model = _Mixer()
    stats = cr.measure_input(torch.randn(32, 3, 24, 24, generator=torch.Generator().manual_seed(0)))
    freed = cp.predict_correlated(model, stats, batch=32, backward=None)  # the forwards alone read them
    monkeypatch.setattr(cp._Walk, "visited", lambda self, n: None)
    kept = cp.predict_correlated(model, stats, batch=32, backward=None)
    held = [n for n, r in kept.rows.items() if r.field is not None and r.field.joint is not None]
    assert {"dw.0.0", "dw.1.0", "dw.0.1", "dw.1.1"} <= set(held)  # the convs' and the identities' outputs
    assert all(r.field is None or r.field.joint is None for r in freed.rows.values())
    for name, r in kept.rows.items():
        f = freed.rows[name]
        for a, b in ((r.mean, f.mean), (r.var, f.var), (r.corr(1), f.corr(1)), (r.corr(2), f.corr(2))):
            assert a is not None and (abs(a - b) <= 1e-10 * abs(a) or a != a and b != b), (name, a, b)
