"""get_lr: the one learning-rate schedule, against torch's own schedulers."""

from __future__ import annotations

import math

import pytest
import torch

from gatepool.train import get_lr


@pytest.mark.parametrize("total, warmup", [(100, 0.3), (37, 0.25), (5, 0.1), (1, 0.3)])
def test_onecycle_matches_torch(total, warmup):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.01, total_steps=total, pct_start=warmup, cycle_momentum=False
    )
    for step in range(total):
        want = opt.param_groups[0]["lr"]
        assert get_lr(step, total, lr=0.01, schedule="onecycle", warmup=warmup) == pytest.approx(
            want, rel=1e-12, abs=1e-15
        )
        opt.step()
        if step < total - 1:
            sched.step()


def test_cosine_warms_up_linearly_then_matches_torch():
    total, warm = 50, 5
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warm)
    lrs = [get_lr(t, total, lr=0.1, schedule="cosine", warmup=warm / total) for t in range(total)]
    assert lrs[:warm] == pytest.approx([0.1 * (t + 1) / warm for t in range(warm)], rel=1e-15)
    for step in range(warm, total):
        assert lrs[step] == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-15)
        opt.step()
        sched.step()


def test_constant_warms_up_then_stays():
    lrs = [get_lr(t, 10, lr=0.1, schedule="constant", warmup=0.2) for t in range(10)]
    assert lrs == pytest.approx([0.05, 0.1] + [0.1] * 8, rel=1e-15)
    assert get_lr(7, 10, lr=0.1, schedule="constant") == 0.1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"schedule": "step"}, "schedule"),
        ({"warmup": 1.0}, "warmup"),
        ({"warmup": -0.1}, "warmup"),
        ({"step": 10}, "step"),
        ({"step": -1}, "step"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    args = {"step": 0, "total_steps": 10, "lr": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        get_lr(args.pop("step"), args.pop("total_steps"), **args)


def test_cosine_reaches_its_peak_and_decays_towards_zero():
    total = 1000
    lrs = [get_lr(t, total, lr=1.0, schedule="cosine", warmup=0.1) for t in range(total)]
    assert max(lrs) == 1.0 and lrs.index(1.0) == 99
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:]))  # monotone after the warm-up
    assert lrs[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 899 / 900)), rel=1e-12) and lrs[-1] < 1e-4
