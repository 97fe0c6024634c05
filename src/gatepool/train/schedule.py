"""The learning rate as a pure function of the step (nanoGPT's ``get_lr``): one function, every schedule.

Over T = ``total_steps`` steps (t = 0 … T − 1 is the step about to be taken) with w = round(warmup · T)
warm-up steps:

    constant   lr_t = lr · min(1, (t + 1) / w)                        (linear warm-up, then flat)
    cosine     lr_t = lr · (t + 1) / w                                for t < w (linear warm-up)
               lr_t = lr · ½ (1 + cos(π (t − w) / (T − w)))           after, down towards 0
                                                           (= torch's CosineAnnealingLR after the warm-up)
    onecycle   lr_t = lr/25 + (lr − lr/25) · ½ (1 − cos(π t / p))     for t ≤ p = warmup·T − 1, then
               lr_t = lr/25e4 + (lr − lr/25e4) · ½ (1 + cos(π (t − p) / (T − 1 − p)))
                                                           (= torch's OneCycleLR with anneal_strategy="cos")

The trainer sets ``group["lr"] = get_lr(t, T, ...)`` before every step: the rate depends on nothing but
the step, so a resumed run needs no scheduler state.
"""

from __future__ import annotations

import math

__all__ = ["DEFAULT_WARMUP", "SCHEDULES", "get_lr"]

SCHEDULES = ("onecycle", "cosine", "constant")
DEFAULT_WARMUP = {"onecycle": 0.3, "cosine": 0.05, "constant": 0.0}  # share of all steps


def get_lr(step: int, total_steps: int, *, lr: float, schedule: str = "cosine", warmup: float = 0.0) -> float:
    """The learning rate at step ``step`` (0-based) of ``total_steps``, peaking at ``lr``.

    Args:
        schedule: ``"onecycle"``, ``"cosine"`` or ``"constant"`` (see the module doc).
        warmup: the share of all steps spent warming up, in [0, 1).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    if not 0.0 <= warmup < 1.0:
        raise ValueError(f"warmup must be a share of the steps in [0, 1), got {warmup!r}")
    if not 0 <= step < total_steps:
        raise ValueError(f"step must be in [0, total_steps) = [0, {total_steps}), got {step}")
    T = total_steps
    if schedule == "onecycle":  # torch.optim.lr_scheduler.OneCycleLR, anneal_strategy="cos"
        start, end = lr / 25.0, lr / 25.0 / 1e4  # div_factor=25, final_div_factor=1e4
        peak = warmup * T - 1  # the step at which lr is reached (a float, as in torch)
        if step <= peak and peak > 0:
            return _cos_anneal(start, lr, step / peak)
        return _cos_anneal(lr, end, (step - peak) / (T - 1 - peak))  # T − 1 − p = (1 − warmup)·T > 0
    w = int(round(warmup * T))
    if step < w:  # linear warm-up, reaching lr at step w − 1
        return lr * (step + 1) / w
    if schedule == "constant":
        return lr
    return _cos_anneal(lr, 0.0, (step - w) / max(T - w, 1))  # cosine: torch's CosineAnnealingLR


def _cos_anneal(start: float, end: float, pct: float) -> float:
    """From ``start`` at pct = 0 to ``end`` at pct = 1 along half a cosine."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)
