"""Beyond the lecture, registered: does a learned score help where the loudest value is a distractor?

The plan is ``results-beyond/distractor-plan.md``, committed on its own before any training of this study
(:data:`PLAN_COMMIT`); this module carries its SHA-256 (:data:`PLAN_SHA256`) and refuses to run when the
file in the checkout differs. Everything below is the plan's, restated for the code:

    data       distractor-mnist (:mod:`gatepool.data`'s canvas sets): all 60,000 training and 10,000 test
               canvases, 60×60
    net        residual_cnn_canvas, the gate in every pool
    gates      max (reference), soft, attention, conv; seeds 0–4, each (gate, seed) trained once
    recipe     gate-matters' (Adam, peak lr 3e-3, one-cycle, batch 128), 10 epochs: the largest count whose
               estimated wall fits 6 h on 2 one-thread workers at the reserved rate (:func:`estimate_seconds`)
    outcome    test accuracy (%) after the last epoch
    test       per gate g ≠ max, Welch's interval for mean(acc_g) − mean(acc_max) at 1 − 0.05/3
               (Bonferroni: family-wise 95%)
    readings   per gate, of its family-wise interval [lo, hi] (:func:`reading`):
               lo > 0 "helps", hi < 0 "hurts", inside [−2, +2] "does not matter", else "undecided"

The claims (source "beyond"): ``attention-helps`` (the lecture's conjecture, "a learned score needs a harder
question": ok when the attention gate's reading is "helps") and ``no-gate-matters`` (ok when every gate
does not matter). With one seed (the quick profile, a smoke run) there is no interval and both are
``not run``. Descriptive, beside them: learning curves, and where the attention gate's weight goes on the
test canvases (its share on bar and on digit pixels, against those pixels' share of the canvas), soft pool's
as the control.

Every training is a ``gatepool.train`` run in ``<out>/distractor-study/<gate>-s<seed>/`` with a checkpoint
every epoch, through ``run_tasks`` (local workers or Ray), so a killed run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.canvas_gates import CANVAS_MODEL, EVAL_COST, RATES, gate_maps, routed_weight
from gatepool.lab.common.gate_trainings import gate_task, training_config
from gatepool.lab.stats import bonferroni, welch_difference
from gatepool.train.sweep import run_tasks
from gatepool.train.task import TrainTask, load_trained, train_task
from gatepool.utils.plotting import pyplot

PLAN = Path(__file__).resolve().parents[4] / "results-beyond" / "distractor-plan.md"
PLAN_SHA256 = "f2a761f89cd6a60e64b68142199b6b4b4d3616fba27c6a0f3902b4eca1a3119a"
PLAN_COMMIT = "3953a732c5894aec077969c6e0716fbc50327bc7"  # the commit that added the plan, alone
DATA = "distractor-mnist"
POOLS = ["max", "soft", "attention", "conv"]
READINGS = ("helps", "hurts", "does not matter", "undecided")
WALL_BOUND_S = 6 * 3600  # the plan's bound on the estimated wall clock, 2 one-thread workers
SIZES = {"train": 60000, "test": 10000}  # distractor-mnist's splits (MNIST's)


def plan_sha256(path: Path | None = None) -> str:
    """SHA-256 of the plan file (:data:`PLAN` unless ``path``)."""
    return hashlib.sha256((path or PLAN).read_bytes()).hexdigest()


def estimate_seconds(setup: dict[str, Any], rate: float = RATES[CANVAS_MODEL], jobs: int = 2) -> float:
    """Estimated wall seconds of the setup's trainings on ``jobs`` one-thread workers at ``rate``."""
    train = setup["train_size"] or SIZES["train"]
    test = setup["test_size"] or SIZES["test"]
    passes = setup["epochs"] * (train + EVAL_COST * test)
    return passes / rate * len(setup["pools"]) * len(setup["seeds"]) / jobs


def reading(low: float | None, high: float | None, margin: float) -> str | None:
    """The plan's reading of a family-wise interval of g − max (points); None where there is no interval."""
    if low is None or high is None:
        return None
    if low > 0:
        return "helps"
    if high < 0:
        return "hurts"
    if -margin <= low and high <= margin:
        return "does not matter"
    return "undecided"


PLAN_REF = ("beyond the lecture, which ends its pooling part: 'MNIST doesn't need a smarter gate. A learned "
            "score needs a harder question'; the test and its readings are the registered plan's "
            "(results-beyond/distractor-plan.md)")


def _claims(setup: dict[str, Any]) -> list[Claim]:
    k = len(setup["pools"]) - 1
    level = f"{bonferroni(setup['confidence'], max(k, 1)):.2%}"
    return [
        Claim(
            "attention-helps",
            f"on {DATA}, the attention gate helps: the family-wise {setup['confidence']:.0%} interval of "
            "attention − max (test accuracy, points) lies above 0 (measured: its lower end)",
            0.0,
            0.0,
            f"the plan's rule 'helps: lo > 0', each of the {k} intervals at {level} (Bonferroni); needs two "
            "seeds",
            kind="min",
            source="beyond",
            ref=PLAN_REF,
        ),
        Claim(
            "no-gate-matters",
            f"on {DATA}, no gate matters: every gate's family-wise interval of g − max lies within "
            f"±{setup['margin']:g} points (measured: gates whose reading is not 'does not matter')",
            0,
            0.0,
            f"a count; the plan's equivalence margin of {setup['margin']:g} points, intervals at {level}",
            kind="equal",
            source="beyond",
            ref=PLAN_REF,
        ),
    ]


@experiment(
    "distractor-study",
    title="beyond the lecture, registered: does a learned score help on distractor-mnist?",
    order=101,
    beyond=True,
    setup={
        "pools": POOLS,
        "seeds": [0, 1, 2, 3, 4],
        "epochs": 10,
        "train_size": None,  # all 60,000
        "test_size": None,  # all 10,000
        "batch_size": 128,
        "optimizer": "adam",
        "lr": 3e-3,
        "schedule": "onecycle",
        "confidence": 0.95,
        "margin": 2.0,
        "examples": 6,
        "share_canvases": 1000,
    },
    quick={"seeds": [0], "epochs": 1, "train_size": 512, "test_size": 256, "batch_size": 64,
           "share_canvases": 64},
    claims=_claims,
)
def distractor_study(ctx: Context) -> None:
    _check_plan(ctx)
    tasks = [
        {
            "task": gate_task(training_config(ctx, CANVAS_MODEL, pool, seed, data=DATA),
                              ctx.out / f"{pool}-s{seed}", ctx.progress and ctx.jobs == 1),
            "pool": pool,
            "seed": seed,
        }
        for pool in ctx["pools"]
        for seed in ctx["seeds"]
    ]
    records = run_tasks(train_task, [t["task"] for t in tasks], ctx.jobs, ctx.executor)
    acc: dict[str, list[float]] = {}  # gate -> test accuracy (%) per seed, in seed order
    curves: dict[str, list[list[dict[str, float]]]] = {}  # gate -> per seed, per epoch
    for task, rec in zip(tasks, records):
        acc.setdefault(task["pool"], []).append(100 * rec["final"]["test_acc"])
        curves.setdefault(task["pool"], []).append(
            [{"test_acc": row["test_acc"], "train_loss": row["train_loss"]} for row in rec["history"]])
    ctx.data["test_acc"] = acc
    ctx.data["curves"] = curves
    ctx.data["comparisons"] = _judge(ctx, acc)
    _accuracy_figure(ctx, acc, ctx.data["comparisons"])
    _curves_figure(ctx, curves)
    runs = {pool: ctx.out / f"{pool}-s{ctx['seeds'][0]}" for pool in ("attention", "soft")}
    if all(pool in ctx["pools"] for pool in runs):
        _where_the_weight_goes(ctx, runs)


def _check_plan(ctx: Context) -> None:
    ctx.data["plan"] = {"file": "results-beyond/distractor-plan.md", "commit": PLAN_COMMIT,
                        "sha256": PLAN_SHA256}
    if not PLAN.is_file():  # an installed package without the repository: the hash is still recorded
        ctx.note(f"the registered plan is not beside this code ({PLAN}); its SHA-256 is {PLAN_SHA256}")
        return
    found = plan_sha256()
    if found != PLAN_SHA256:
        raise ValueError(f"{PLAN} is not the registered plan (SHA-256 {found}, registered {PLAN_SHA256} at "
                         f"commit {PLAN_COMMIT[:12]}): restore it with `git checkout {PLAN_COMMIT[:12]} -- "
                         "results-beyond/distractor-plan.md`")
    estimate = estimate_seconds(ctx.setup)
    ctx.data["estimated_wall_s"] = round(estimate)
    ctx.note(f"registered plan {PLAN_COMMIT[:12]} verified; estimated wall {estimate / 3600:.1f} h on 2 "
             f"one-thread workers at {RATES[CANVAS_MODEL]:.0f} images/s")


def _judge(ctx: Context, acc: dict[str, list[float]]) -> dict[str, Any]:
    """Each gate's difference to max pool, its intervals and reading; the two claims."""
    for pool, a in acc.items():
        sd = f" ± {statistics.stdev(a):.2f}" if len(a) > 1 else ""
        ctx.note(f"{pool:<10} {statistics.fmean(a):.2f}{sd} % over seeds {ctx['seeds']}")
    others = [p for p in acc if p != "max"]
    if "max" not in acc or len(ctx["seeds"]) < 2:
        for claim in ("attention-helps", "no-gate-matters"):
            ctx.check(claim, None, note="one seed (or no max pool): no interval, no verdict")
        return {}
    family = bonferroni(ctx["confidence"], len(others))
    out: dict[str, Any] = {}
    for pool in others:
        d = welch_difference(acc[pool], acc["max"], ctx["confidence"])
        fw = welch_difference(acc[pool], acc["max"], family)
        read = reading(fw.low, fw.high, ctx["margin"])
        out[pool] = {"diff": d.diff, "low": d.low, "high": d.high, "family_low": fw.low,
                     "family_high": fw.high, "df": d.df, "reading": read}
        if read is None:
            ctx.note(f"{pool} − max = {d.diff:+.2f} points: not judged (zero spread over the seeds)")
            continue
        ctx.note(f"{pool} − max = {d.diff:+.2f} points, family-wise [{fw.low:+.2f}, {fw.high:+.2f}] "
                 f"(95% [{d.low:+.2f}, {d.high:+.2f}]): {read}")
    att = out.get("attention", {})
    if att:
        ctx.check("attention-helps", att["family_low"], note=f"attention's reading: {att['reading']}")
    else:
        ctx.check("attention-helps", None, note="no attention gate in this setup")
    judged = [p for p in others if out[p]["reading"] is not None]
    if len(judged) < len(others):
        ctx.check("no-gate-matters", None, note="a gate was not judged (zero spread)")
    else:
        matter = [p for p in others if out[p]["reading"] != "does not matter"]
        ctx.check("no-gate-matters", len(matter),
                  note="every gate does not matter" if not matter else
                  "; ".join(f"{p}: {out[p]['reading']}" for p in matter))
    return out


# ----------------------------------------------------------------------------- figures


def _accuracy_figure(ctx: Context, acc: dict[str, list[float]], comparisons: dict[str, Any]) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.0, 3.4))
    for i, a in enumerate(acc.values()):
        left.scatter([i] * len(a), a, s=14, facecolors="none", edgecolors="k")
        left.plot([i - 0.25, i + 0.25], [statistics.fmean(a)] * 2, color="C0")
    left.set_xticks(range(len(acc)), list(acc), fontsize=8)
    left.set(ylabel="test accuracy (%)", title=f"{DATA}: every seed, and the mean")
    margin = ctx["margin"]
    right.axhspan(-margin, margin, color="0.9", label=f"±{margin:g} points: does not matter")
    right.axhline(0, color="k", lw=0.8)
    for i, c in enumerate(comparisons.values()):
        if c["family_low"] is None:
            continue
        color = {"helps": "C2", "hurts": "C3"}.get(c["reading"], "C0")
        right.errorbar(i, c["diff"], yerr=[[c["diff"] - c["family_low"]], [c["family_high"] - c["diff"]]],
                       fmt="o", color=color, capsize=4)
        right.annotate(c["reading"], (i, c["family_high"]), textcoords="offset points", xytext=(0, 4),
                       ha="center", fontsize=7)
    right.set_xticks(range(len(comparisons)), list(comparisons), fontsize=8)
    right.set(ylabel="gate − max (points)", title="family-wise 95% intervals (Bonferroni)")
    right.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{ctx['epochs']} epochs, seeds {ctx['seeds']}", fontsize=9)
    fig.tight_layout()
    ctx.figure(fig, "distractor-accuracy.png")


def _curves_figure(ctx: Context, curves: dict[str, list[list[dict[str, float]]]]) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.2))
    for k, (key, label) in enumerate((("test_acc", "test accuracy (%)"), ("train_loss", "training loss"))):
        ax = axes[k]
        for i, (pool, seeds) in enumerate(curves.items()):
            scale = 100 if key == "test_acc" else 1
            runs = np.array([[row[key] * scale for row in run] for run in seeds])  # (seeds, epochs)
            epochs = np.arange(1, runs.shape[1] + 1)
            ax.plot(epochs, runs.mean(0), color=f"C{i}", label=pool)
            ax.fill_between(epochs, runs.min(0), runs.max(0), color=f"C{i}", alpha=0.2, lw=0)
        ax.set(xlabel="epoch", ylabel=label)
    axes[0].legend(fontsize=7)
    fig.suptitle("mean over seeds, band: min to max", fontsize=9)
    fig.tight_layout()
    ctx.figure(fig, "distractor-curves.png")


def ink_masks(n: int, split: str = "test") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first ``n`` canvases of ``split`` (n, 60, 60) uint8, and two boolean masks of the same shape:
    the bars' pixels (255: the dimmed digit peaks near 102) and the digit's own ink
    (:func:`gatepool.data.digit_layer`), bars excluded."""
    from gatepool.data import digit_layer, load

    full, alone = digit_layer(DATA, split, n)
    if not np.array_equal(full, load(DATA, split).images[:n].numpy()):
        raise ValueError(f"{DATA}'s stored {split} canvases are not what its recipe makes: regenerate them "
                         f"(gatepool data generate {DATA} --force)")
    bars = full == 255
    return full, bars, (alone > 0) & ~bars


def weight_shares(maps: torch.Tensor, bars: np.ndarray, digit: np.ndarray) -> dict[str, float]:
    """How much of each canvas's weight (N, h, w; cropped to the top-left h × w) falls on bar and on digit
    pixels, averaged over the canvases, beside those pixels' share of the same area."""
    h, w = maps.shape[-2:]
    m = maps.double().numpy()
    total = m.sum((1, 2))
    b, d = bars[:, :h, :w], digit[:, :h, :w]
    return {
        "bar_weight": float(((m * b).sum((1, 2)) / total).mean()),
        "digit_weight": float(((m * d).sum((1, 2)) / total).mean()),
        "bar_pixels": float(b.mean()),
        "digit_pixels": float(d.mean()),
    }


def _trained(run: Path) -> torch.nn.Module:
    from gatepool.utils.io import read_json

    return load_trained(TrainTask(read_json(run / "results.json")["config"], str(run))).model.cpu()


def _where_the_weight_goes(ctx: Context, runs: dict[str, Path]) -> None:
    from gatepool.data import load

    n = ctx["share_canvases"]
    canvases, bars, digit = ink_masks(n)
    test = load(DATA, "test")
    x = (torch.from_numpy(canvases).unsqueeze(1).float() / 255 - test.mean) / test.std  # (n, 1, 60, 60)
    shares, shown = {}, {}
    for pool, run in runs.items():
        if not (run / "results.json").is_file():
            return
        maps = gate_maps(_trained(run), x, gate=pool)  # per pool (n, h_i, w_i)
        routed = routed_weight(maps)
        shares[pool] = {"first_pool": weight_shares(maps[0], bars, digit),
                        "routed": weight_shares(routed, bars, digit)}
        shown[pool] = (maps[0][: ctx["examples"]], routed[: ctx["examples"]])
        s = shares[pool]["routed"]
        ctx.note(f"{pool} gate, seed {ctx['seeds'][0]}, {n} test canvases: {s['bar_weight']:.1%} of the "
                 f"routed weight on bar pixels ({s['bar_pixels']:.1%} of the area), "
                 f"{s['digit_weight']:.1%} on the digit ({s['digit_pixels']:.1%})")
    ctx.data["weight_shares"] = shares
    _maps_figure(ctx, canvases, bars, digit, shown)


def _maps_figure(ctx: Context, canvases: np.ndarray, bars: np.ndarray, digit: np.ndarray,
                 shown: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    plt = pyplot()
    k = ctx["examples"]
    rows = 1 + 2 * len(shown)
    fig, axes = plt.subplots(rows, k, figsize=(1.5 * k, 1.55 * rows), squeeze=False)
    for c in range(k):
        axes[0, c].imshow(canvases[c], cmap="gray", vmin=0, vmax=255)
        axes[0, c].contour(bars[c], levels=[0.5], colors="C3", linewidths=0.6)
        axes[0, c].contour(digit[c], levels=[0.5], colors="C2", linewidths=0.6)
        for i, (first, routed) in enumerate(shown.values()):
            for j, m in enumerate((first, routed)):
                ax = axes[1 + 2 * i + j, c]
                ax.imshow(canvases[c], cmap="gray", vmin=0, vmax=255)
                h, w = m.shape[-2:]
                ax.imshow(m[c].numpy(), cmap="magma", alpha=0.65, extent=(0, w, h, 0))
    labels = ["canvas (red: bars,\ngreen: digit)"]
    for pool in shown:
        labels += [f"{pool}: pool 1", f"{pool}: all pools"]
    for r, label in enumerate(labels):
        axes[r, 0].set_ylabel(label, fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"where the gate's weight goes, seed {ctx['seeds'][0]}", fontsize=9)
    fig.tight_layout()
    ctx.figure(fig, "distractor-weights.png")
