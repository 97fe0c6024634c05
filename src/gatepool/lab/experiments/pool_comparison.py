"""Experiment 12 ``pool-comparison``: Tuesday's CNN with both pools swapped for every gate, trained on MNIST.

    max  avg  soft  soft-learned  attention  conv        × seeds, full MNIST, 6 epochs

The lecture's claim: all six land within 0.3 points of each other, about the spread between seeds; the
learned temperatures start at τ = 1 and end between 0.89 and 1.12 per channel. Each training is a
``gatepool.train`` run in its own folder (``<out>/<pool>-s<seed>/``: checkpoint every epoch, then
``results.json`` and ``model.safetensors``), so a killed experiment resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import numpy as np

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common import GATES
from gatepool.lab.common.gate_trainings import gate_task, training_config
from gatepool.train.sweep import run_tasks
from gatepool.train.task import train_task
from gatepool.utils.plotting import pyplot

POOLS = list(GATES)  # every gate of the library, in its order

COMPARISON_REF = ("lecture, every gate trains Tuesday's CNN alike: 'all six within 0.3 points of each other, "
                  "about the spread between seeds'")
TAU_REF = "lecture, the learned temperatures start at τ = 1 and end between 0.89 and 1.12 per channel"
CLAIMS = [
    Claim(
        "spread",
        "all six gates land within 0.3 points of test accuracy (max − min of the means)",
        0.3,
        0.0,
        "the lecture's bound, with no slack",
        kind="max",
        quick_tolerance=2.0,
        depends=("epochs", "train_size", "seeds"),
        source="lecture",
        ref=COMPARISON_REF,
    ),
    Claim(
        "seed-spread",
        "the spread between seeds (mean over gates of max − min) is about 0.3 points",
        0.3,
        1 / 3,
        "'about': we read it as within a third of 0.3 (0.2 to 0.4 points); needs two seeds",
        kind="rel",
        depends=("epochs", "train_size", "seeds"),
        source="lecture",
        ref=COMPARISON_REF,
    ),
    Claim(
        "gates-within-seeds",
        "the gates' spread is no larger than seeds alone would make it: (spread of the gates' means) / "
        "(seed spread) at most its 95th percentile when the gate does not matter",
        None,
        0.0,
        "the percentile of that ratio for normal accuracies with one mean, the same gates and seeds "
        "(Monte Carlo, 20,000 draws); needs two seeds",
        kind="max",
        source="ours",
        ref="the lecture's 'about the spread between seeds', made a test: the gates differ by no more than "
        "seed noise explains",
    ),
    Claim(
        "tau-push-turns",
        "the push on the learned τ changes sign during training: the share of learned-τ pools (each seed) "
        "whose mean τ moves one way to its farthest point and then back (per epoch)",
        1.0,
        0.0,
        "every pool of every seed: a direction, no slack",
        kind="min",
        depends=("epochs", "train_size"),
        source="lecture",
        ref="lecture, the learned temperatures: the gradient on τ pushes one way early "
        "and the other way later",
    ),
    Claim(
        "tau-min",
        "the smallest learned τ over every channel, pool and seed "
        "ends at 0.89 (the lecture's lower end: a two-sided bar, so a τ "
        "that never moved from 1 is off)",
        0.89,
        0.05,
        "τ's path depends on the optimizer and schedule; ±0.05 around the lecture's single run (a one-sided "
        "bound passed a τ stuck at 1)",
        quick_tolerance=0.1,
        depends=("epochs", "train_size"),
        source="lecture",
        ref=TAU_REF,
    ),
    Claim(
        "tau-max",
        "the largest learned τ over every channel, pool and seed "
        "ends at 1.12 (the lecture's upper end: a two-sided bar, so a τ "
        "that never moved from 1 is off)",
        1.12,
        0.05,
        "τ's path depends on the optimizer and schedule; ±0.05 around the lecture's single run (a one-sided "
        "bound passed a τ stuck at 1)",
        quick_tolerance=0.1,
        depends=("epochs", "train_size"),
        source="lecture",
        ref=TAU_REF,
    ),
]


def _claims(setup: dict[str, Any]) -> list[Claim]:
    """The claims, with why a lecture claim is not ok (``miss``) as it holds for this setup: the lecture's
    (full MNIST, 6 epochs, 3 seeds) or a smaller one (the quick profile's)."""
    lecture_run = setup["epochs"] == 6 and setup["train_size"] == 60000
    seeds = len(setup["seeds"])
    misses = {
        "seed-spread": (
            ("not reproduced", "on the lecture's own setup (full MNIST, 6 epochs, 3 seeds; it names Adam but "
             "no learning rate or schedule: ours are 3e-3, one-cycle) the spread between our seeds is not "
             "about 0.3 points; the gates' spread, the lecture's point, holds (spread, gates-within-seeds)")
            if seeds > 1 and lecture_run
            else ("setup differs", f"this setup trains {seeds} seed{'s' * (seeds != 1)} on "
                  f"{setup['train_size']:,} digits for {setup['epochs']} epochs, the lecture 3 seeds on full "
                  "MNIST for 6")
        ),
        "tau-push-turns": (
            ("setup differs", f"this setup trains {setup['epochs']} epochs on {setup['train_size']:,} "
             "digits, the lecture 6 on full MNIST")
            if not lecture_run else ("", "")
        ),
    }
    return [dataclasses.replace(c, miss=misses[c.id][0], miss_why=misses[c.id][1]) if c.id in misses else c
            for c in CLAIMS]


def tau_series(record: dict[str, Any]) -> dict[str, list[float]]:
    """Per learned-τ pool, its mean τ over channels at the start and after every epoch."""
    out = {}
    for key in (k for k in record["history"][0] if k.startswith("tau_")):
        start = record.get("initial", {}).get(key)
        series = ([start] if start else []) + [h[key] for h in record["history"]]
        out[key[4:]] = [statistics.fmean(t) for t in series]
    return out


def push_turns(series: list[float]) -> bool:
    """Does τ move one way and then back? From the start to its farthest point, then from there to the
    end, in opposite directions (one wiggle in a drifting series does not count)."""
    far = max(range(len(series)), key=lambda i: abs(series[i] - series[0]))
    return (series[far] - series[0]) * (series[-1] - series[far]) < 0


def spread_ratio(acc: dict[str, list[float]]) -> float:
    """(max − min of the gates' mean accuracies) / (mean over gates of max − min over seeds)."""
    means = [statistics.fmean(a) for a in acc.values()]
    seeds = statistics.fmean(max(a) - min(a) for a in acc.values())
    return (max(means) - min(means)) / seeds if seeds > 0 else math.inf


def null_ratio_percentile(gates: int, seeds: int, q: float = 0.95, draws: int = 20_000) -> float:
    """The ``q`` quantile of :func:`spread_ratio` when every gate's accuracies are draws of one normal."""
    x = np.random.default_rng(0).standard_normal((draws, gates, seeds))  # (draws, G, S)
    means = x.mean(-1)
    ratio = (means.max(-1) - means.min(-1)) / (x.max(-1) - x.min(-1)).mean(-1)
    return float(np.quantile(ratio, q))


@experiment(
    "pool-comparison",
    title="every gate trains Tuesday's CNN to the same accuracy",
    order=12,
    setup={
        "pools": POOLS,
        "seeds": [0, 1, 2],
        "epochs": 6,
        "train_size": 60000,
        "test_size": 10000,
        "batch_size": 128,
        "optimizer": "adam",
        "lr": 3e-3,
        "schedule": "onecycle",
    },
    quick={"seeds": [0], "epochs": 3, "train_size": 5000, "test_size": 1000, "batch_size": 64},
    claims=_claims,
)
def pool_comparison(ctx: Context) -> None:
    tasks = []
    for pool in ctx["pools"]:
        for seed in ctx["seeds"]:
            config = training_config(ctx, "residual_cnn", pool, seed)
            task = gate_task(config, ctx.out / f"{pool}-s{seed}", ctx.progress and ctx.jobs == 1)
            tasks.append({"task": task, "pool": pool, "seed": seed})
    records = run_tasks(train_task, [t["task"] for t in tasks], ctx.jobs, ctx.executor)

    acc: dict[str, list[float]] = {p: [] for p in ctx["pools"]}
    for task, rec in zip(tasks, records):
        acc[task["pool"]].append(100 * rec["final"]["test_acc"])
    means = {p: statistics.fmean(a) for p, a in acc.items()}
    for p in ctx["pools"]:
        sd = statistics.stdev(acc[p]) if len(acc[p]) > 1 else 0.0
        ctx.note(f"{p:<13} test accuracy {means[p]:.2f} ± {sd:.2f} % over seeds {ctx['seeds']}")
    ctx.data["test_acc"] = acc
    ctx.check("spread", max(means.values()) - min(means.values()))
    if len(ctx["seeds"]) > 1:
        ctx.check("seed-spread", statistics.fmean(max(a) - min(a) for a in acc.values()))
        bar = null_ratio_percentile(len(acc), len(ctx["seeds"]))
        ctx.check("gates-within-seeds", spread_ratio(acc), theory=bar,
                  note=f"95th percentile of the ratio with no gate effect: {bar:.2f}")
    else:
        for claim in ("seed-spread", "gates-within-seeds"):
            ctx.check(claim, None, note=f"needs two seeds; this setup trains seed {ctx['seeds']} only")

    taus = {t["seed"]: r for t, r in zip(tasks, records) if t["pool"] == "soft-learned"}
    if taus:
        final = [v for r in taus.values() for k, v in r["history"][-1].items() if k.startswith("tau_")]
        flat = [t for per_pool in final for t in per_pool]
        turns = [push_turns(series) for r in taus.values() for series in tau_series(r).values()]
        ctx.check("tau-push-turns", statistics.fmean(turns),
                  note=f"{sum(turns)} of {len(turns)} (pool, seed) series turn")
        ctx.check("tau-min", min(flat))
        ctx.check("tau-max", max(flat))
    _figures(ctx, acc, taus)


def _figures(ctx: Context, acc: dict[str, list[float]], taus: dict[int, dict[str, Any]]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, values in enumerate(acc.values()):
        ax.bar(i, statistics.fmean(values), color="C0", alpha=0.35, width=0.6)
        ax.scatter([i] * len(values), values, facecolors="none", edgecolors="k", zorder=3)
    ax.set_xticks(range(len(acc)), list(acc))
    lo = min(min(v) for v in acc.values())
    hi = max(max(v) for v in acc.values())
    ax.set(
        ylim=(lo - 0.5, hi + 0.3),
        ylabel="test accuracy (%)",
        title=f"Tuesday's CNN, {ctx['epochs']} epochs on {ctx['train_size']} digits; circles: seeds",
    )
    ctx.figure(fig, "pool-comparison.png")

    if taus:
        rec = taus[min(taus)]
        keys = [k for k in rec["history"][0] if k.startswith("tau_")]
        fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.4), squeeze=False)
        for ax, key in zip(axes[0], keys):
            start = rec.get("initial", {}).get(key)
            series = ([start] if start else []) + [h[key] for h in rec["history"]]
            epochs = list(range(len(series))) if start else [h["epoch"] for h in rec["history"]]
            for c in range(len(series[0])):
                ax.plot(epochs, [s[c] for s in series], color="C1", alpha=0.4, lw=1)
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
            ax.set(xlabel="epoch", ylabel="τ per channel", title=f"{key[4:]} (seed {min(taus)})")
        ctx.figure(fig, "pool-comparison-tau.png")
