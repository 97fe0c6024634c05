"""Experiment 12.1 ``adam-reach``: Adam could have moved τ 10× either way over pool-comparison's schedule.

Adam moves a parameter by at most about lr per step (|m̂/√v̂| ≲ 1), so over the schedule log τ could
move by Σ_t lr_t; the claim is that this sum reaches ln 10 (arithmetic on the schedule, no training).
"""

from __future__ import annotations

import math

from gatepool.lab.claims import Claim, Context, experiment

REACH_SETUP = {"epochs": 6, "train_size": 60000, "batch_size": 128, "lr": 3e-3, "schedule": "onecycle"}


@experiment(
    "adam-reach",
    title="Adam could have moved τ 10× either way: the schedule's Σ lr against ln 10",
    order=12.1,
    setup=REACH_SETUP,
    claims=[
        Claim(
            "log-tau-reach",
            "Adam moves a parameter by at most about lr per step (|m̂/√v̂| ≲ 1), so over pool-comparison's "
            "schedule log τ could have moved by Σ_t lr_t: at least ln 10 = 2.30, i.e. τ 10× either way",
            math.log(10),
            0.0,
            "a bound, no slack",
            kind="min",
            depends=("epochs", "train_size", "batch_size", "lr", "schedule"),
            source="arithmetic",
            ref="lecture, the learned temperatures: 'Adam could have moved τ 10× either way' (the sum of the "
            "schedule's learning rates: arithmetic; the τ the trainings reached is pool-comparison's tau-min "
            "and tau-max)",
        ),
    ],
)
def adam_reach(ctx: Context) -> None:
    from gatepool.train.schedule import DEFAULT_WARMUP, get_lr

    steps = ctx["epochs"] * math.ceil(ctx["train_size"] / ctx["batch_size"])
    total = sum(get_lr(t, steps, lr=ctx["lr"], schedule=ctx["schedule"],
                       warmup=DEFAULT_WARMUP[ctx["schedule"]]) for t in range(steps))  # fmt: skip
    ctx.check("log-tau-reach", total, theory=math.log(10),
              note=f"{steps} steps, Σ lr = {total:.2f}: τ could have reached e^±{total:.2f} = "
              f"{math.exp(-total):.3g} to {math.exp(total):.3g}; the learned log τ is a parameter "
              "(GatedPool's log_temperature), so Adam's step applies to it directly")
