"""Beyond the lecture: does the gate matter when the loudest value in a window is not the relevant one?

On MNIST every gate lands within a few hundredths of a point (pool-comparison), and the lecture says why:
every gate finds the digit's strokes. Here the six gates train on questions where that fails
(:mod:`gatepool.data.canvas`: translated-, cluttered- and distractor-mnist on a 60×60 canvas) and on
Fashion-MNIST as it is, each gate in *every* pool of the net:

    nets       residual_cnn_canvas (Tuesday's CNN + one pool stage: 60 → 30 → 15 → 7) on the 60×60 sets,
               residual_cnn (the lecture's, 28×28) on Fashion-MNIST, and resnet_gate (four gate pools,
               6 blocks, widths 16 → 128) on ``deep_datasets``
    per cell   pools × seeds trainings, the same budget and the same learning-rate rule for every gate:
               the lecture's pool-comparison recipe untouched (Adam, peak lr 3e-3, one-cycle, batch 128),
               chosen once for all gates, data sets and nets, never per result
    statistic  test accuracy (%) per seed; per gate g ≠ max: mean(acc_g) − mean(acc_max) with Welch's
               95% interval (:mod:`gatepool.lab.stats`)
    verdict    per (net, data set): "the gates differ" when some gate's interval at 1 − 0.05/5 excludes 0
               (Bonferroni over the five comparisons: family-wise 95%); else "no difference detected",
               and the intervals say how large a difference the seeds rule out; a gate whose seeds and
               max pool's each gave one same accuracy (zero spread: no interval) is not judged, and
               unless another gate differs the verdict is "unable to decide" (claim ``not run``)

The claims (source "beyond") state the null — no gate differs from max pool — so ``ok`` there means the
gate did not matter and ``off`` means it did: a finding either way, not a failure. With one seed (the
quick profile) there is no interval and the claims are ``not run``.

Every training is a ``gatepool.train`` run in ``<out>/<net>-<data>/<pool>-s<seed>/`` (checkpoint every
epoch), all of them through the same parallel workers (``run_tasks``), so a killed run resumes.

Sizing: :func:`estimate_seconds` predicts a setup's wall clock on 2 one-thread workers from ``RATES``
(training images/s of one worker per net: the nets' relative costs, measured together, times one
reference rate for the lecture's CNN, kept a quarter below what a quiet machine gives) and ``EVAL_COST``
(an evaluation pass costs about a third of a training step): a training costs
epochs · (train_size + test_size/3) image-passes. The full profile (10,000 training and 4,000 test
digits, 5 epochs, 3 seeds, not 5; the same random subsets for every gate and seed) is sized so that its
estimate stays within ``BUDGET_S`` (2.5 h), and a test keeps it there; the estimate cannot say how long
the run will take (the rates were measured under load). ``python -m gatepool.lab.experiments.gate_matters
--measure`` times training steps of the three nets in turn (:func:`measure_rates`). The quick profile
(cluttered- and distractor-mnist, canvas CNN, one seed, 512 images × 2 epochs) is a smoke run of the
whole pipeline: accuracies near chance, no intervals, claims not run. The measurements behind ``RATES``,
the budget rule and the runs: docs/beyond.md.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from typing import Any

import torch

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common import GATES
from gatepool.lab.common.canvas_gates import (
    CANVAS_MODEL,
    DEEP_MODEL,
    EVAL_COST,
    MNIST_MODEL,
    RATES,
    gate_maps,
    routed_weight,
)
from gatepool.lab.common.gate_trainings import gate_task, training_config
from gatepool.lab.stats import bonferroni, welch_difference
from gatepool.train.sweep import run_tasks
from gatepool.train.task import TrainTask, load_trained, train_task
from gatepool.utils.plotting import pyplot

POOLS = list(GATES)  # every gate of the library, in its order
DATASETS = ["cluttered-mnist", "distractor-mnist", "translated-mnist", "fashion-mnist"]
MODEL_NAMES = {CANVAS_MODEL: "the canvas ResidualCNN", MNIST_MODEL: "the lecture's ResidualCNN",
               DEEP_MODEL: "ResNetGate"}
BUDGET_S = 2.5 * 3600  # the bound on the full profile's *estimated* wall clock on 2 cores (RATES)


def model_for(net: str, dataset: str) -> str:
    """The registry name of ``net`` sized for ``dataset``'s canvas (60×60 generated, or 28×28)."""
    from gatepool.data import GENERATED, dataset_names

    if dataset not in dataset_names():
        raise ValueError(f"datasets: {dataset!r} is unknown; choose from {dataset_names()}")
    if net == "resnet":
        if dataset not in GENERATED:
            raise ValueError(f"deep_datasets: resnet_gate is sized for the 60×60 sets {list(GENERATED)}, "
                             f"not {dataset}")
        return DEEP_MODEL
    return CANVAS_MODEL if dataset in GENERATED else MNIST_MODEL


def cells(setup: dict[str, Any]) -> list[tuple[str, str]]:
    """The (net, data set) pairs of a setup, in the order they run."""
    return [("cnn", d) for d in setup["datasets"]] + [("resnet", d) for d in setup["deep_datasets"]]


def estimate_seconds(setup: dict[str, Any], rates: dict[str, float] = RATES, jobs: int = 2) -> float:
    """Predicted wall seconds of a setup's trainings on ``jobs`` one-thread workers at ``rates``."""
    passes = setup["epochs"] * (setup["train_size"] + EVAL_COST * setup["test_size"])
    worker_s = sum(passes / rates[model_for(net, d)] for net, d in cells(setup)) * len(setup["pools"])
    return worker_s * len(setup["seeds"]) / jobs


def _claims(setup: dict[str, Any]) -> list[Claim]:
    k = len(setup["pools"]) - 1
    return [
        Claim(
            f"same-{net}-{data}",
            f"{MODEL_NAMES[model_for(net, data)]} on {data}: no gate's test accuracy differs from max pool's "
            f"(Welch intervals at family-wise {setup['confidence']:.0%}; measured: gates that differ)",
            0,
            0.0,
            f"a count; each of the {k} intervals at {bonferroni(setup['confidence'], max(k, 1)):.2%} "
            "(Bonferroni); needs two seeds and some spread over them",
            kind="equal",
            source="beyond",
            ref="beyond the lecture, which says the gate cannot matter on MNIST and a learned score needs a "
            "harder question: this is that question. 'ok': the gate did not matter; 'off': it did",
        )
        for net, data in cells(setup)
    ]


def _available(ctx: Context) -> list[str]:
    """Load (and so generate, once, here rather than in racing workers) every data set; skip missing ones."""
    from gatepool.data import GENERATED, DataError, load, loudest_not_digit

    ok = []
    for data in dict.fromkeys(ctx["datasets"] + ctx["deep_datasets"]):
        try:
            test = load(data, "test")
            load(data, "train")
        except DataError as e:
            ctx.note(f"{data}: not available, its trainings are not run ({e})")
            continue
        ok.append(data)
        ctx.data.setdefault("sources", {})[data] = str(test.source)
        if data in GENERATED:
            share = loudest_not_digit(data)
            ctx.data.setdefault("loudest_not_digit", {})[data] = share
            ctx.note(f"{data}: in {share:.0%} of the 8×8 tiles holding digit ink the loudest pixel is not "
                     "the digit's (2,000 test canvases)")
    return ok


@experiment(
    "gate-matters",
    title="beyond the lecture: does the gate matter on harder questions?",
    order=100,
    beyond=True,
    setup={
        "pools": POOLS,
        "seeds": [0, 1, 2],
        "datasets": DATASETS,
        "deep_datasets": ["cluttered-mnist", "distractor-mnist"],
        "epochs": 5,
        "train_size": 10000,
        "test_size": 4000,
        "batch_size": 128,
        "optimizer": "adam",
        "lr": 3e-3,
        "schedule": "onecycle",
        "confidence": 0.95,
        "examples": 6,
    },
    quick={
        "seeds": [0],
        "datasets": ["cluttered-mnist", "distractor-mnist"],
        "deep_datasets": [],
        "epochs": 2,
        "train_size": 512,
        "test_size": 256,
        "batch_size": 64,
    },
    claims=_claims,
)
def gate_matters(ctx: Context) -> None:
    for net, data in cells(ctx.setup):
        model_for(net, data)  # a bad setup fails before any training
    available = _available(ctx)
    tasks = [
        {
            "task": gate_task(training_config(ctx, model_for(net, data), pool, seed, data=data),
                              ctx.out / f"{net}-{data}" / f"{pool}-s{seed}", ctx.progress and ctx.jobs == 1),
            "cell": (net, data),
            "pool": pool,
            "seed": seed,
        }
        for net, data in cells(ctx.setup)
        if data in available
        for pool in ctx["pools"]
        for seed in ctx["seeds"]
    ]
    records = run_tasks(train_task, [t["task"] for t in tasks], ctx.jobs, ctx.executor)

    acc: dict[str, dict[str, list[float]]] = {}  # "net/data" -> pool -> accuracy per seed (%)
    taus: dict[str, list[float]] = {}  # data -> every final τ of the canvas CNN's soft-learned pools
    for task, rec in zip(tasks, records):
        key = "/".join(task["cell"])
        acc.setdefault(key, {}).setdefault(task["pool"], []).append(100 * rec["final"]["test_acc"])
        if task["pool"] == "soft-learned" and task["cell"][0] == "cnn":
            last = rec["history"][-1]
            taus.setdefault(task["cell"][1], []).extend(
                t for k, v in last.items() if k.startswith("tau_") for t in v)
    ctx.data["test_acc"] = acc
    ctx.data["tau_final"] = taus
    ctx.data["differences"] = {key: _judge(ctx, key, per_pool) for key, per_pool in acc.items()}
    _figures(ctx, acc, taus, available)


def _judge(ctx: Context, key: str, per_pool: dict[str, list[float]]) -> dict[str, Any]:
    """Notes, differences to max pool with their intervals, and the cell's claim."""
    net, data = key.split("/")
    claim = f"same-{net}-{data}"
    for pool, a in per_pool.items():
        sd = f" ± {statistics.stdev(a):.2f}" if len(a) > 1 else ""
        ctx.note(f"{key}: {pool:<13} {statistics.fmean(a):.2f}{sd} % over seeds {ctx['seeds']}")
    if "max" not in per_pool or len(ctx["seeds"]) < 2:
        ctx.check(claim, None, note="one seed (or no max pool): no interval, no verdict")
        return {}
    others = [p for p in per_pool if p != "max"]
    family = bonferroni(ctx["confidence"], len(others))
    out, differ, unjudged = {}, [], []
    for pool in others:
        d = welch_difference(per_pool[pool], per_pool["max"], ctx["confidence"])
        fw = welch_difference(per_pool[pool], per_pool["max"], family)
        out[pool] = {"diff": d.diff, "low": d.low, "high": d.high, "df": d.df, "family_low": fw.low,
                     "family_high": fw.high, "differs": fw.differs}  # None (JSON null) where not judged
        if not fw.judged:
            unjudged.append(pool)
            ctx.note(f"{key}: {pool} − max = {d.diff:+.2f} points, not judged: every seed of both gates "
                     "gave the same accuracy (zero spread, no interval)")
            continue
        ctx.note(f"{key}: {pool} − max = {d.diff:+.2f} points, 95% [{d.low:+.2f}, {d.high:+.2f}], "
                 f"family-wise [{fw.low:+.2f}, {fw.high:+.2f}]")
        if fw.differs:
            differ.append(pool)
    if differ:  # the others' intervals hold at 1 − α/k whether or not every comparison was judged
        verdict = f"the gates differ ({', '.join(differ)} vs max)"
    elif unjudged:
        verdict = (f"unable to decide: {', '.join(unjudged)} vs max not judged (zero spread over the seeds, "
                   "e.g. nets collapsed to one class)")
    else:
        verdict = "no difference detected"
    ctx.note(f"{key}: {verdict} at family-wise {ctx['confidence']:.0%}")
    ctx.check(claim, None if unjudged and not differ else len(differ), note=verdict)
    return out


# ----------------------------------------------------------------------------- figures


def _figures(ctx: Context, acc: dict[str, dict[str, list[float]]], taus: dict[str, list[float]],
             available: list[str]) -> None:
    plt = pyplot()
    if available:
        ctx.figure(picture_grid(available), "gate-matters-datasets.png")
    if acc:
        _accuracy_figure(ctx, plt, acc)
    if taus:
        fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(taus), 3.2))
        ax.boxplot(list(taus.values()), showfliers=True)
        ax.set_xticks(range(1, len(taus) + 1), list(taus), fontsize=8)
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set(ylabel="learned τ per channel",
               title=f"soft-learned, canvas CNN, every pool and seed, after {ctx['epochs']} epochs")
        ctx.figure(fig, "gate-matters-tau.png")
    where = ctx.out / "cnn-cluttered-mnist" / f"attention-s{ctx['seeds'][0]}"
    if (where / "results.json").is_file():
        ctx.figure(attention_figure(str(where), ctx["examples"]), "gate-matters-attention.png")


def _accuracy_figure(ctx: Context, plt: Any, acc: dict[str, dict[str, list[float]]]) -> None:
    keys = list(acc)
    fig, axes = plt.subplots(2, len(keys), figsize=(3.4 * len(keys), 5.6), squeeze=False)
    for col, key in enumerate(keys):
        per_pool = acc[key]
        top, bottom = axes[0, col], axes[1, col]
        for i, (pool, a) in enumerate(per_pool.items()):
            m = statistics.fmean(a)
            half = _t_half(a, ctx["confidence"])
            top.errorbar(i, m, yerr=half, fmt="o", color="C0", capsize=3)
            top.scatter([i] * len(a), a, s=10, facecolors="none", edgecolors="k", zorder=3)
            d = (welch_difference(a, per_pool["max"], ctx["confidence"])
                 if pool != "max" and "max" in per_pool and len(a) > 1 and len(per_pool["max"]) > 1 else None)
            if d is not None and d.low is not None and d.high is not None:
                bottom.errorbar(i, d.diff, yerr=[[d.diff - d.low], [d.high - d.diff]], fmt="o",
                                color="C3" if d.differs else "C0", capsize=3)
            elif pool != "max" and "max" in per_pool:
                bottom.scatter(i, statistics.fmean(a) - statistics.fmean(per_pool["max"]), color="C0")
        for ax in (top, bottom):
            ax.set_xticks(range(len(per_pool)), list(per_pool), rotation=45, fontsize=7)
        bottom.axhline(0, color="k", lw=0.8)
        top.set_title(key, fontsize=9)
        top.set_ylabel("test accuracy (%)" if col == 0 else "")
        bottom.set_ylabel("gate − max (points)" if col == 0 else "")
    seeds = len(ctx["seeds"])
    what = f"{ctx['confidence']:.0%} intervals over {seeds} seeds" if seeds > 1 else "one seed: no intervals"
    fig.suptitle(f"{ctx['epochs']} epochs on {ctx['train_size']} images; {what}", fontsize=10)
    fig.tight_layout()
    ctx.figure(fig, "gate-matters-accuracy.png")


def _t_half(a: list[float], confidence: float) -> float:
    """Half-width of the t interval of a mean (0 for one value)."""
    if len(a) < 2:
        return 0.0
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, len(a) - 1) * statistics.stdev(a) / math.sqrt(len(a)))


def picture_grid(datasets: list[str], n: int = 8) -> Any:
    """A row of the first ``n`` test images of each data set (uint8, as generated)."""
    from gatepool.data import load

    plt = pyplot()
    fig, axes = plt.subplots(len(datasets), n, figsize=(n * 0.9, len(datasets) * 1.0), squeeze=False)
    for r, data in enumerate(datasets):
        images = load(data, "test").images[:n]
        for c in range(n):
            ax = axes[r, c]
            ax.imshow(images[c].numpy(), cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r, 0].set_ylabel(data, rotation=0, ha="right", va="center", fontsize=8)
    fig.tight_layout()
    return fig


def attention_figure(run: str, n: int = 6) -> Any:
    """Where the attention gate's weight goes on the first ``n`` cluttered test digits."""
    from gatepool.data import load
    from gatepool.train import TrainConfig
    from gatepool.utils.io import read_json

    task = TrainTask(read_json(f"{run}/results.json")["config"], str(run))
    model, config = load_trained(task).model.cpu(), TrainConfig.from_dict(task.config)
    test = load(config.data, "test")
    x = (test.images[:n].unsqueeze(1).float() / 255 - test.mean) / test.std  # (n, 1, 60, 60)
    maps = gate_maps(model, x)
    routed = routed_weight(maps)
    plt = pyplot()
    fig, axes = plt.subplots(3, n, figsize=(1.5 * n, 4.8), squeeze=False)
    for c in range(n):
        axes[0, c].imshow(test.images[c].numpy(), cmap="gray")
        axes[1, c].imshow(maps[0][c].numpy(), cmap="magma", vmin=0, vmax=1)
        axes[2, c].imshow(test.images[c].numpy(), cmap="gray")
        h, w = routed.shape[-2:]
        axes[2, c].imshow(routed[c].numpy(), cmap="magma", alpha=0.6, extent=(0, w, h, 0))
        for r in range(3):
            axes[r, c].set_xticks([])
            axes[r, c].set_yticks([])
    for r, label in enumerate(["input", "pool1 gate", f"all {len(maps)} gates"]):
        axes[r, 0].set_ylabel(label, fontsize=8)
    fig.suptitle(f"attention gate, canvas CNN, seed {config.seed}: weight per input position", fontsize=9)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- sizing


def measure_rates(rounds: int = 3, steps: int = 4, batch: int = 64) -> dict[str, dict[str, float]]:
    """Training images/s of one 1-thread worker, per model (at its data sets' input size) and gate.

    A step is the trainer's (:func:`gatepool.train.train_step`: Adam as ``make_optimizer`` builds it,
    cross-entropy) on a batch of ``batch`` random inputs in channels_last. The three models take turns
    within each round (so background load hits them alike); each timing is ``torch.utils.benchmark``'s
    ``Timer.timeit(steps)`` on one thread (``steps`` steps after its own two warm-up steps); the median
    over ``rounds`` is kept. Data sets of one size cost the same (the 60×60 sets alike).
    """
    from torch.utils.benchmark import Timer

    from gatepool.models import create_model
    from gatepool.train import TrainConfig, make_optimizer, train_step

    shapes = {MNIST_MODEL: 28, CANVAS_MODEL: 60, DEEP_MODEL: 60}
    rates: dict[str, dict[str, float]] = {m: {} for m in shapes}
    for pool in POOLS:
        timers = {}
        for model, size in shapes.items():
            torch.manual_seed(0)
            net = create_model(model, pool=pool).to(memory_format=torch.channels_last)
            opt = make_optimizer(TrainConfig(model=model, lr=1e-3), net)
            x = torch.randn(batch, 1, size, size).contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, 10, (batch,))
            step = functools.partial(train_step, net, opt, x, y)
            timers[model] = Timer("step()", globals={"step": step}, num_threads=1)
        times: dict[str, list[float]] = {m: [] for m in shapes}
        for _ in range(rounds):
            for model, timer in timers.items():
                times[model].append(batch / timer.timeit(steps).mean)  # mean: seconds per step
        for model in shapes:
            rates[model][pool] = statistics.median(times[model])
    return rates


def harmonic(values: list[float]) -> float:
    """The rate at which a mix of equal amounts of work at ``values`` runs."""
    return len(values) / sum(1 / v for v in values)


if __name__ == "__main__" and "--measure" in sys.argv:  # python -m gatepool.lab.experiments.gate_matters
    for model, per_pool in measure_rates().items():
        row = "  ".join(f"{p} {r:.0f}" for p, r in per_pool.items())
        print(f"{model:<20} harmonic mean {harmonic(list(per_pool.values())):5.0f} images/s  ({row})")
