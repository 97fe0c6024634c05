"""Experiments 13, 15, 16: one attention layer reaches the whole digit; where it looks; what shuffling does.

The net (``gatepool.models.conv_attention``) is a deliberately weak conv stem, 144 tokens of 32 features,
then (or not) one single-head attention layer, the mean over the tokens and a Linear:

    X = stem(image)                            (B, 144, 32)   a token sees a 6×6-pixel patch
    G = softmax((X W_Q)(X W_K)ᵀ / √d)          (B, 144, 144)  d = 16: every token reads every other
    P = G (X W_V) W_O                          (B, 144, 32)
    logits = Linear(mean over tokens of P)     (B, 10)

13 ``attention-reach``: the net with and without its attention layer, trained alike (8,000 digits, 20
   epochs); the lift in test accuracy is what reaching the whole digit in one step buys. Beside it, the
   reach of stacked convs: L layers of k×k convs at stride 1 see ``1 + L(k − 1)`` pixels, measured here
   with autograd (the support of one output unit's gradient), so 5×5 convs need 7 layers to see all 28.
15 ``attention-maps``: the seed-0 attention net's gate rows G[q] for three query tokens of the first test
   "7", drawn over the token strengths ‖x_j‖, with the share of the gate the top-3 tokens hold (an even
   split gives 3/144 = .021).
16 ``shuffle``: every score q_i·k_j depends on the tokens' contents only, so for any permutation π
   ``attn(πX) = π attn(X)`` and after the mean pool the prediction cannot change. Pixels are another
   matter: one fixed shuffle of the pixels sinks a CNN trained on plain digits, while an MLP, which has
   no notion of where a pixel sits, learns shuffled digits as well as plain ones.

Training: AdamW (weight decay 1e-4), batch 128, the one-cycle schedule (30% warm-up), with each model's
peak learning rate picked by an lr check (``--set lr_check=true`` reruns it: a short run at each rate of
``LR_GRID``; the tiny stem (1,162 weights) wants a far larger rate than the attention net). The full
profile also trains seed 0 of both nets at one shared rate (``shared_lr`` = 1e-3), the comparison an
untuned setup makes, to show how much of the lift is the stem's learning rate.
The trainings are ``gatepool.train`` runs in ``<out>/attention-reach/<model>-s<seed>-<config hash>/``;
15 and 16 ask for the same seed-0 runs (16 also uses the stem-only net as its CNN), which are loaded when
13 has finished them and trained otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.train.sweep import run_tasks
from gatepool.utils.checks import check_int
from gatepool.utils.plotting import pyplot

ROOT = "attention-reach"  # the folder (under the run's out) that holds every training of this file
LR_KEY = {"conv_stem": "lr_stem", "conv_attention": "lr_attention"}
LR_GRID = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0]
TRAIN = {  # the lecture's setup for the attention net and its stem-only twin
    "train_size": 8000, "test_size": 2000, "epochs": 20, "batch_size": 128, "optimizer": "adamw",
    "lr_stem": 0.3, "lr_attention": 0.03, "weight_decay": 1e-4, "schedule": "onecycle", "d": 16,
}  # fmt: skip
TRAIN_QUICK = {"train_size": 2000, "test_size": 1000, "epochs": 4}
QUICK_SHIPPED = ("; quick (4 epochs on 2,000 digits leave both nets near 45%, far from converged) judges the "
                 "shipped nets instead: the full profile's trainings of seeds 0, 1, 2 (gatepool pretrained)")
ACC_WHY = (
    "about 3 standard errors of a mean over 3 seeds: the seeds' std is 0.6 (stem) and 1.2 (attention) "
    "points, and 2,000 test digits add a binomial 0.7 points at 90%"
)


# ----------------------------------------------------------------------------- trainings


def train_config(setup: dict[str, Any], model: str, seed: int, device: str = "cpu", **changes: Any
                 ) -> dict[str, Any]:  # fmt: skip
    """The TrainConfig (as a dict) of ``model`` ("conv_stem" or "conv_attention") for a setup, trained on
    ``device`` (how to run, not what: no part of the run folder's name)."""
    config = {
        "model": model, "model_kwargs": {"d": setup["d"]} if model == "conv_attention" else {},
        "train_size": setup["train_size"], "test_size": setup["test_size"], "epochs": setup["epochs"],
        "batch_size": setup["batch_size"], "optimizer": setup["optimizer"], "lr": setup[LR_KEY[model]],
        "weight_decay": setup["weight_decay"], "schedule": setup["schedule"], "seed": seed, "device": device,
    }  # fmt: skip
    config.update(changes)
    return config


def run_folder(root: Path, config: dict[str, Any]) -> Path:
    """``root/<model>-s<seed>-<hash of the config>``: another setup never lands in a finished run's folder."""
    from gatepool.train import RUNTIME_FIELDS  # how to run (threads), not what: no part of the name

    what = {k: v for k, v in config.items() if k not in RUNTIME_FIELDS}
    digest = hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:8]
    return Path(root) / f"{config['model']}-s{config['seed']}-{digest}"


def train_one(task: dict[str, Any]) -> dict[str, Any]:
    """One training (a worker's unit): a registered model, or this file's MLP on (maybe shuffled) pixels."""
    from gatepool.train import TrainConfig, load_data, train

    config = TrainConfig.from_dict(task["config"])
    model = data = None
    if config.model == "mlp":
        torch.manual_seed(config.seed)
        model = MLP(**config.model_kwargs)
        finished = (Path(task["out"]) / "results.json").is_file()
        data = None if finished else load_data(config)
        if data is not None and task["pixel_seed"] is not None:
            data = type(data)(*(shuffle_pixels(t, task["pixel_seed"]) if t.is_floating_point() else t
                                for t in data))  # fmt: skip
    result = train(config, out=task["out"], progress=task["progress"], verbose=task["progress"],
                   model=model, data=data)  # fmt: skip
    return result.record


def run_trainings(tasks: list[dict[str, Any]], jobs: int, executor: Any = None) -> list[dict[str, Any]]:
    """Every task's results record: the unfinished ones trained (in ``jobs`` workers, or through
    ``executor``), then all loaded."""
    pending = [t for t in tasks if not (Path(t["out"]) / "results.json").is_file()]
    run_tasks(train_one, pending, jobs, executor)
    return [train_one({**t, "progress": False}) for t in tasks]  # finished: loaded, not trained


def attention_net(ctx: Context, seed: int | None = None) -> nn.Module:
    """Experiment 13's attention net of ``seed`` (default ``ctx["seed"]``), in eval mode (loaded, or trained
    now)."""
    from gatepool.train import TrainConfig, train

    config = train_config(ctx.setup, "conv_attention", ctx["seed"] if seed is None else seed, ctx.device)
    out = run_folder(ctx.out.parent / ROOT, config)
    result = train(TrainConfig.from_dict(config), out=out, progress=ctx.progress, verbose=ctx.progress)
    return result.model.cpu().eval()  # the maps and the shuffle read it on the CPU


def shipped_name(model: str, seed: int) -> str:
    """The shipped weights of ``model`` ("conv_stem" or "conv_attention") trained with the full setup."""
    return f"{model}-s{seed}"


def shipped_nets(ctx: Context, models: tuple[str, ...] = tuple(LR_KEY)
                 ) -> dict[str, dict[int, nn.Module]] | None:  # fmt: skip
    """In the quick profile on its own setup (no ``--set`` on the training or the seeds): the shipped nets
    (the full profile's trainings, ``gatepool pretrained``) of every full-profile seed, by model and seed,
    in eval mode. Otherwise None: the run's own trainings answer."""
    if not ctx.quick or not ctx.is_lecture(*TRAIN, "seeds"):
        return None
    seeds = ctx.experiment.setup["seeds"]
    return {m: {s: ctx.shipped(m, shipped_name(m, s)) for s in seeds} for m in models}


def first_test_digit(label: int) -> tuple[torch.Tensor, int]:
    """The first MNIST test digit with ``label``: ((1, 1, 28, 28) normalized, its index in the test set)."""
    from gatepool.data import load_dataset

    check_int(label, "--set digit", 0, 9)
    test = load_dataset("mnist", "test")
    hits = (test.labels == label).nonzero().flatten()  # every label has test digits
    i = int(hits[0])
    return test.normalized()[i : i + 1], i


# ----------------------------------------------------------------------------- 13. attention-reach


def receptive_width(layers: int, kernel: int, pool: int = 1) -> int:
    """Pixels (along a row) that one output unit of ``layers`` stacked ``kernel``² convs sees, stride 1;
    with ``pool`` > 1, each conv is followed by a ``pool``² average pool of stride ``pool`` (a stage).

    Measured, not computed: the support of ∂y/∂x for one unit of a stack of all-ones convs and average
    pools (positive weights, so nothing cancels) on a canvas large enough for any answer.
    """
    side = (layers * kernel + 1) * pool**layers  # ≥ every receptive field of `layers` stages
    x = torch.zeros(1, 1, side, side, dtype=torch.float64, requires_grad=True)
    y = x
    for _ in range(layers):
        y = nn.functional.conv2d(y, torch.ones(1, 1, kernel, kernel, dtype=torch.float64))  # (1, 1, h, w)
        if pool > 1:
            y = nn.functional.avg_pool2d(y, pool)  # (1, 1, h/pool, w/pool)
    (grad,) = torch.autograd.grad(y[0, 0, 0, 0], x)  # the top-left output unit
    return int((grad[0, 0].abs().sum(0) > 0).sum())  # columns it depends on


def layers_to_see(pixels: int, kernel: int, pool: int = 1) -> tuple[int, list[int]]:
    """The fewest stacked ``kernel``² convs (each followed by a ``pool``² pool when ``pool`` > 1) whose unit
    sees ``pixels`` pixels, and the widths on the way."""
    check_int(kernel, "rf_kernel", 2)
    check_int(pixels, "rf_pixels")
    check_int(pool, "rf_pool")
    widths = [1]  # zero layers: a pixel sees itself
    while widths[-1] < pixels:
        widths.append(receptive_width(len(widths), kernel, pool))
    return len(widths) - 1, widths


def _reach_claims(setup: dict[str, Any]) -> list[Claim]:
    acc = ("train_size", "epochs", "d")
    k, p = setup["rf_kernel"], setup["rf_pixels"]
    return [
        Claim("stem-acc", "conv stem alone, no attention: test accuracy (%, mean over seeds)", 58.0, 3.0,
              ACC_WHY + QUICK_SHIPPED, depends=acc,
            source="lecture",
            ref="lecture, one attention layer reaches the whole digit: the stem alone 58%",
        ),
        Claim("attention-acc", "stem + one attention layer (d = 16): test accuracy (%, mean over seeds)",
              90.0, 3.0, ACC_WHY + QUICK_SHIPPED, depends=acc,
            source="lecture",
            ref="lecture, the same: stem + one attention layer 90%",
        ),
        Claim("lift", "one attention layer lifts test accuracy by about 30 points", 30.0, 5.0,
              "'about 30': ±5 points, more than the two accuracies' seed spread combined" + QUICK_SHIPPED,
              depends=acc,
            source="lecture",
            ref="lecture, the same: 'about +30 points'",
        ),
        Claim("layers-to-see-28", f"stacked {k}×{k} convs (stride 1) a unit needs to see all {p} pixels: "
              f"1 + L(k − 1) ≥ {p}", 7, 0,
              "a count: exact", kind="equal", depends=("rf_kernel", "rf_pixels"),
            source="arithmetic",
            ref="lecture, the reach of stacked convs: 5×5 convs need 7 layers to see all 28 pixels (the "
            "receptive width 1 + L(k − 1), read off autograd's support: fixed by the convs' construction)",
        ),
    ]


@experiment("attention-reach", title="one attention layer reaches the whole digit: +30 points over the stem",
            order=13, setup={**TRAIN, "seeds": [0, 1, 2], "rf_kernel": 5, "rf_pixels": 28, "lr_check": False,
                             "shared_lr": 1e-3},
            quick={**TRAIN_QUICK, "seeds": [0], "shared_lr": 0.0}, claims=_reach_claims)
def attention_reach(ctx: Context) -> None:
    k, pixels = ctx["rf_kernel"], ctx["rf_pixels"]
    layers, widths = layers_to_see(pixels, k)
    ctx.check("layers-to-see-28", layers, theory=math.ceil((pixels - 1) / (k - 1)))
    ctx.note(f"receptive field of L stacked {k}×{k} convs, measured by autograd: "
             + ", ".join(f"L={i}: {w}" for i, w in enumerate(widths))
             + f" pixels; L = {layers} sees {pixels}")
    ctx.data["receptive_widths"] = widths

    if ctx["lr_check"]:
        _lr_check(ctx)
    tasks = []
    for model in LR_KEY:
        for seed in ctx["seeds"]:
            tasks.append({"config": train_config(ctx.setup, model, seed, ctx.device), "shared": False})
        if ctx["shared_lr"] > 0:  # the contrast: both nets at one rate, as an untuned comparison would be
            tasks.append({"config": train_config(ctx.setup, model, ctx["seeds"][0], ctx.device,
                                                    lr=ctx["shared_lr"]),
                          "shared": True})  # fmt: skip
    for t in tasks:
        t.update(out=str(run_folder(ctx.out, t["config"])), progress=ctx.progress and ctx.jobs == 1)
    records = run_trainings(tasks, ctx.jobs, ctx.executor)

    acc: dict[str, list[float]] = {m: [] for m in LR_KEY}
    shared: dict[str, float] = {}
    for task, rec in zip(tasks, records):
        model, value = task["config"]["model"], 100 * rec["final"]["test_acc"]
        if task["shared"]:
            shared[model] = value
        else:
            acc[model].append(value)
    mean = {m: statistics.fmean(a) for m, a in acc.items()}
    for m, a in acc.items():
        sd = f" ± {statistics.stdev(a):.2f}" if len(a) > 1 else ""
        ctx.note(f"{m:<15} test accuracy {mean[m]:.2f}{sd} % (seeds {ctx['seeds']}: "
                 f"{', '.join(f'{v:.2f}' for v in a)}); peak lr {ctx[LR_KEY[m]]:g}")
    ctx.note(f"training: {ctx['optimizer']} (weight decay {ctx['weight_decay']:g}), {ctx['schedule']} "
             f"schedule, batch {ctx['batch_size']}, {ctx['epochs']} epochs on {ctx['train_size']} digits, "
             f"tested on {ctx['test_size']}")
    if shared:
        ctx.note(f"both at one peak lr {ctx['shared_lr']:g} (seed {ctx['seeds'][0]}): stem "
                 f"{shared['conv_stem']:.2f} %, attention {shared['conv_attention']:.2f} %, lift "
                 f"{shared['conv_attention'] - shared['conv_stem']:+.2f} points")
    untuned = ""
    if shared:
        untuned = (f"; at one shared lr {ctx['shared_lr']:g}: stem {shared['conv_stem']:.1f} %, attention "
                   f"{shared['conv_attention']:.1f} %")
    nets = shipped_nets(ctx)
    if ctx.quick:
        ctx.note("quick: the accuracies above are of unconverged nets, not judged")
    if nets is not None:
        _judge_shipped(ctx, nets)
    elif ctx.quick:
        ctx.note("quick with --set on the training: no shipped nets answer it (stem-acc, attention-acc and "
                 "lift are not run)")
    else:
        _check_accuracies(ctx, mean, untuned)
    ctx.data["test_acc"] = acc
    ctx.data["shared_lr_test_acc"] = shared
    ctx.data["seconds"] = {m: [r["seconds"] for t, r in zip(tasks, records) if t["config"]["model"] == m
                               and not t["shared"]] for m in LR_KEY}  # fmt: skip
    _reach_figure(ctx, tasks, records)


# ----------------------------------------------------------------------------- 13.1 conv-reach


def _conv_reach_claims(setup: dict[str, Any]) -> list[Claim]:
    k, p, pool = setup["rf_kernel"], setup["rf_pixels"], setup["rf_pool"]
    return [
        Claim("pool-stages-to-see-28", f"stages of a {k}×{k} conv then a {pool}×{pool} stride-{pool} pool a "
              f"unit needs to see all {p} pixels (read off autograd's support at each stage's output)", 3, 0,
              "a count: exact", kind="equal", depends=("rf_kernel", "rf_pixels", "rf_pool"),
              source="arithmetic",
              ref="lecture, the reach of stacked convs: 'three pooling stages would be needed to reach that "
              f"far' (all {p} pixels; a stage read as the conv stem's: a {k}×{k} conv then a 2×2 pool; the "
              "receptive width is fixed by the stages' construction)"),
    ]


@experiment("conv-reach", title="pooling widens the reach: three conv + pool stages see all 28 pixels",
            order=13.1, setup={"rf_kernel": 5, "rf_pixels": 28, "rf_pool": 2}, claims=_conv_reach_claims)
def conv_reach(ctx: Context) -> None:
    k, pixels, pool = ctx["rf_kernel"], ctx["rf_pixels"], ctx["rf_pool"]
    stages, widths = layers_to_see(pixels, k, pool)
    ctx.check("pool-stages-to-see-28", stages)
    ctx.note(f"receptive field after S stages of a {k}×{k} conv and a {pool}×{pool} pool, measured by "
             "autograd: "
             + ", ".join(f"S={i}: {w}" for i, w in enumerate(widths)) + f" pixels; without pools "
             f"{layers_to_see(pixels, k)[0]} convs are needed")
    ctx.data["receptive_widths"] = widths


def _check_accuracies(ctx: Context, mean: dict[str, float], extra: str = "",
                      shipped: dict[str, str] | None = None) -> None:  # fmt: skip
    """stem-acc, attention-acc and lift from the mean test accuracy (%) of each model over its seeds."""
    shipped = shipped or {}
    both = ", ".join(shipped.values()) if shipped else None
    ctx.check("stem-acc", mean["conv_stem"], note=f"peak lr {ctx.setup[LR_KEY['conv_stem']]:g}{extra}",
              shipped_model=shipped.get("conv_stem"))
    ctx.check("attention-acc", mean["conv_attention"], shipped_model=shipped.get("conv_attention"),
              note=f"peak lr {ctx.setup[LR_KEY['conv_attention']]:g}{extra}")
    ctx.check("lift", mean["conv_attention"] - mean["conv_stem"], note=f"each at its own tuned lr{extra}",
              shipped_model=both)


def _judge_shipped(ctx: Context, nets: dict[str, dict[int, nn.Module]]) -> None:
    """The three accuracy claims from the shipped nets, each tested on the full profile's test digits."""
    from gatepool.train import TrainConfig, evaluate, load_data

    full = ctx.experiment.setup
    test = load_data(TrainConfig(train_size=1, test_size=full["test_size"]))  # the trainings' test subset
    acc = {m: {s: 100 * evaluate(net, test.test_x, test.test_y)["acc"] for s, net in by_seed.items()}
           for m, by_seed in nets.items()}  # fmt: skip
    for m, by_seed in acc.items():
        ctx.note(f"shipped {m} (full profile: {full['epochs']} epochs on {full['train_size']} digits, "
                 f"peak lr {full[LR_KEY[m]]:g}): test accuracy on {full['test_size']} digits "
                 + ", ".join(f"seed {s} {a:.2f}" for s, a in by_seed.items()) + " %")  # fmt: skip
    mean = {m: statistics.fmean(a.values()) for m, a in acc.items()}
    names = {m: ", ".join(shipped_name(m, s) for s in a) for m, a in acc.items()}
    extra = (f"; shipped nets (full profile, seeds {list(acc['conv_stem'])}), tested on {full['test_size']} "
             "digits")
    _check_accuracies(ctx, mean, extra, names)
    ctx.data["shipped_test_acc"] = {m: list(a.values()) for m, a in acc.items()}


def _lr_check(ctx: Context) -> None:
    """Seed 0 of each model for a quarter of the epochs at every rate of LR_GRID (the choice is noted)."""
    epochs = max(1, ctx["epochs"] // 4)
    tasks = [{"config": train_config(ctx.setup, m, 0, ctx.device, lr=lr, epochs=epochs), "progress": False}
             for m in LR_KEY for lr in LR_GRID]  # fmt: skip
    for t in tasks:
        t["out"] = str(run_folder(ctx.out / "lr-check", t["config"]))
    records = run_trainings(tasks, ctx.jobs, ctx.executor)
    rows = [(t["config"]["model"], t["config"]["lr"], 100 * r["final"]["test_acc"])
            for t, r in zip(tasks, records)]
    ctx.data["lr_check"] = [{"model": m, "lr": lr, "test_acc": a, "epochs": epochs} for m, lr, a in rows]
    for m in LR_KEY:
        best = max((r for r in rows if r[0] == m), key=lambda r: r[2])
        ctx.note(f"lr check ({epochs} epochs) {m}: " + ", ".join(f"{lr:g}: {a:.1f}%" for mm, lr, a in rows
                                                                 if mm == m) + f"; best {best[1]:g}")


def _reach_figure(ctx: Context, tasks: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, m in enumerate(LR_KEY):
        first = True
        for task, rec in zip(tasks, records):
            if task["config"]["model"] != m:
                continue
            h = rec["history"]
            label = f"{m}, lr {task['config']['lr']:g}" if first or task["shared"] else None
            ax.plot([e["epoch"] for e in h], [100 * e["test_acc"] for e in h], color=f"C{i}", alpha=0.8,
                    ls="--" if task["shared"] else "-", label=label)
            first = first and task["shared"]
    ax.set(xlabel="epoch", ylabel="test accuracy (%)",
           title=f"{ctx['train_size']} digits; solid: tuned lr, one line per seed {ctx['seeds']}")
    ax.legend(fontsize=8)
    ctx.figure(fig, "attention-reach.png")


# ----------------------------------------------------------------------------- 15. attention-maps

LECTURE_SHARES = {(2, 6): 0.31, (3, 8): 0.45, (10, 3): 0.23}
CORNER = (3, 8)  # the lecture's corner query: it "looks 7 rows down, p̂ = .97" (to the 7's stem)
LECTURE_CORNER_ROWS, LECTURE_CORNER_GATE = 7, 0.97
MAPS_REF = "lecture, where one query looks: the first test 7's gate rows for three queries"
SEED_TOL = ("twice the std over the seeds' nets (measured in this run; the lecture shows one net), plus half "
            "a unit of the printed digit; not judged with one seed, nor when the bar lies inside a spread "
            "wider than half the bar (such a spread can refute the bar, not confirm it); quick reads the "
            "shipped nets of the full profile's seeds 0, 1, 2 (gatepool pretrained)")
MAP_SETUP = {**TRAIN, "seeds": [0, 1, 2], "digit": 7, "queries": ["2:6", "3:8", "10:3"], "corner": "3:8",
             "k": 3, "tokens": 144}  # fmt: skip
MAP_QUICK = {**TRAIN_QUICK, "seeds": [0]}


def parse_queries(queries: list[str], grid: tuple[int, int] = (12, 12)) -> list[tuple[int, int]]:
    """``["2:6", ...]`` -> ``[(2, 6), ...]`` (row, col) on the token grid."""
    out = []
    for q in queries:
        r, sep, c = str(q).partition(":")
        try:
            rc = (int(r), int(c))
        except ValueError:
            rc = None
        if not sep or rc is None or not (0 <= rc[0] < grid[0] and 0 <= rc[1] < grid[1]):
            raise ValueError(f"--set queries: each query is ROW:COL on the {grid[0]}×{grid[1]} grid, "
                             f"got {q!r}")
        out.append(rc)
    return out


def _map_claims(setup: dict[str, Any]) -> list[Claim]:
    on_lecture = setup["k"] == 3 and setup["digit"] == 7
    claims = []
    for r, c in parse_queries(setup["queries"]):
        claims.append(Claim(
            f"top{setup['k']}-r{r}c{c}",
            f"query (row {r}, col {c}): the share of the gate its top-{setup['k']} tokens hold "
            "(mean over seeds)",
            LECTURE_SHARES.get((r, c)) if on_lecture else None, 0.0, SEED_TOL,
            depends=("queries", "digit", "k"), source="lecture", ref=MAPS_REF))  # fmt: skip
    corner = parse_queries([setup["corner"]])[0] == CORNER and setup["digit"] == 7
    claims += [
        Claim("corner-rows",
              "the corner query (3, 8): rows from it down to its strongest gate (mean over seeds)",
              LECTURE_CORNER_ROWS if corner else None, 0.0, SEED_TOL + " (at least half a row)",
              depends=("corner", "digit"), source="lecture", ref=MAPS_REF + ": 'looks 7 rows down'"),
        Claim("corner-gate", "the corner query's strongest gate p̂ (mean over seeds)",
              LECTURE_CORNER_GATE if corner else None, 0.0, SEED_TOL, depends=("corner", "digit"),
              source="lecture", ref=MAPS_REF + ": 'p̂ = .97'"),
        Claim("reach", "the corner query's strongest gate lies outside its own receptive field, in every "
              "seed's net (fewest tokens apart)", None, 0.0, "a count: exact", kind="min",
              depends=("corner",), source="ours",
              ref="the lecture's point that one attention layer reaches past the token's patch; "
              "the bar is where the stem's 6×6-pixel patches (stride 2) stop overlapping: ⌈6/2⌉ = 3 tokens"),
    ]  # fmt: skip
    return claims


def _seed_mean(values: list[float], half_unit: float) -> tuple[float | None, float]:
    """(mean over seeds, its tolerance: 2 std + half a printed unit); no mean with one seed."""
    if len(values) < 2:
        return None, 0.0
    return statistics.fmean(values), 2 * statistics.stdev(values) + half_unit


def check_over_seeds(ctx: Context, claim_id: str, values: list[float], half_unit: float, note: str,
                     least: float = 0.0, shipped_model: str | None = None) -> None:  # fmt: skip
    """The mean over the seeds' nets against the claim's bar, within 2 std (+ half a printed unit, at
    least ``least``). A spread that wide can refute the bar but not confirm it: when the bar lies inside
    a tolerance wider than half the bar, the verdict is ``undecided`` (the mean is kept; the note gives the
    spread)."""
    mean, tol = _seed_mean(values, half_unit)
    tol = max(tol, least)
    bar = ctx.bar(claim_id)
    if mean is not None and bar is not None and abs(mean - bar) <= tol and tol > 0.5 * abs(bar):
        ctx.check(claim_id, mean, tolerance=tol, note=note, shipped_model=shipped_model,
                  undecided=f"the seeds' nets disagree: 2 std + half a unit = {tol:.3f}, more than half the "
                  f"bar {bar:g}, so the spread cannot confirm it")  # fmt: skip
        return
    ctx.check(claim_id, mean, tolerance=tol, note=note, shipped_model=shipped_model)


@experiment("attention-maps", title="where one query looks: the gate rows of trained attention nets",
            order=15, setup=MAP_SETUP, quick=MAP_QUICK, claims=_map_claims)
def attention_maps(ctx: Context) -> None:
    from gatepool.analysis.attention_maps import plot_attention_map, token_strengths, top_k_share

    x, index = first_test_digit(ctx["digit"])
    corner = parse_queries([ctx["corner"]])[0]
    shipped = shipped_nets(ctx, ("conv_attention",))
    if shipped is not None:  # quick on its own setup: the full profile's nets, shipped
        nets = shipped["conv_attention"]
        ctx.note(f"quick: the maps of the shipped conv_attention nets (the full profile's trainings of seeds "
                 f"{list(nets)}), not of this run's 4-epoch nets")  # fmt: skip
    else:
        nets = {seed: attention_net(ctx, seed) for seed in ctx["seeds"]}
    seeds = list(nets)
    names = ", ".join(shipped_name("conv_attention", s) for s in seeds) if shipped is not None else None
    rows, shares, corner_rows, corner_gates, corner_dist = [], {}, [], [], []
    for seed, model in nets.items():
        grid = model.grid
        queries = parse_queries(ctx["queries"], grid)
        if ctx["tokens"] != grid[0] * grid[1]:
            raise ValueError(f"tokens={ctx['tokens']}: the net's grid {grid} has {grid[0] * grid[1]} tokens")
        with torch.no_grad():
            tokens = model.tokens(x)  # (1, 144, 32)
            gates = model.mix(tokens, return_weights=True)[1][0]  # (144, 144): row i = query token i's gate
            logits = model.head(model.mix(tokens))  # (1, 10)
            torch.manual_seed(seed)
            gates0 = type(model)(d=ctx["d"]).eval().gates(x)[0]  # (144, 144): the same net untrained
        strengths = token_strengths(tokens, grid)[0]  # (12, 12)
        ctx.note(f"seed {seed}: test digit #{index} (label {ctx['digit']}), predicted {int(logits.argmax())}")
        for r, c in queries:
            q = r * grid[1] + c
            info = top_k_share(gates[q], ctx["k"])
            if seed == seeds[0]:  # the first seed's maps, drawn
                path = ctx.out / f"attention-map-r{r}c{c}.png"
                plot_attention_map(gates[q], strengths, (r, c), path, k=ctx["k"], image=x[0, 0],
                                   title=f"test digit #{index}: query token ({r}, {c}), seed {seed}")
                ctx.figures.append(str(path))
            top = [divmod(t, grid[1]) for t in info["tokens"]]
            shares.setdefault((r, c), []).append(info["share"])
            rows.append({"seed": seed, "query": [r, c], "share": info["share"], "top": top,
                         "gates": info["gates"],
                         "untrained_share": top_k_share(gates0[q], ctx["k"])["share"]})
        if seed == seeds[0]:
            ctx.figure(_gate_matrix(gates, grid, index, seed), "attention-gate-matrix.png")
            ctx.data["explorer"] = explorer_data(gates, grid, index, ctx["digit"], seed,
                                                 "shipped conv_attention" if shipped is not None
                                                 else "trained in this run")  # fmt: skip
        g = gates[corner[0] * grid[1] + corner[1]]
        tr, tc = divmod(int(g.argmax()), grid[1])
        corner_rows.append(tr - corner[0])
        corner_gates.append(float(g.max()))
        corner_dist.append(max(abs(tr - corner[0]), abs(tc - corner[1])))
    rf, stride = patch_geometry(model)
    apart = math.ceil(rf / stride)  # tokens this far apart see disjoint patches
    for (r, c), values in shares.items():
        check_over_seeds(ctx, f"top{ctx['k']}-r{r}c{c}", values, 0.005,
                         f"seeds {seeds}: {', '.join(f'{v:.3f}' for v in values)}; even split "
                         f"{ctx['k'] / ctx['tokens']:.3f}", shipped_model=names)  # fmt: skip
    check_over_seeds(ctx, "corner-rows", corner_rows, 0.0, f"per seed {corner_rows} rows down", least=0.5,
                     shipped_model=names)
    check_over_seeds(ctx, "corner-gate", corner_gates, 0.005,
                     "per seed " + ", ".join(f"{v:.3f}" for v in corner_gates), shipped_model=names)
    ctx.check("reach", min(corner_dist), theory=apart, shipped_model=names,
              note=f"per seed {corner_dist} tokens from the query; patches are {rf} pixels, stride {stride}: "
                   f"≥ {apart} tokens apart they do not overlap")  # fmt: skip
    ctx.data["queries"] = rows


def explorer_data(gates: torch.Tensor, grid: tuple[int, int], index: int, label: int, seed: int, model: str
                  ) -> dict[str, Any]:  # fmt: skip
    """What the report's attention explorer draws: test digit ``index`` (28×28, pixels in [0, 1]) and the
    whole gate G (T, T) of the net's one attention head, row q = query token q's softmax over the T keys,
    rounded to 4 decimals."""
    from gatepool.data import load_dataset

    image = load_dataset("mnist", "test").images[index].double() / 255.0  # (28, 28) raw pixels
    return {"image": [[round(v, 4) for v in row] for row in image.tolist()], "grid": list(grid),
            "rows": [[round(v, 4) for v in row] for row in gates.double().tolist()], "label": int(label),
            "seed": int(seed), "model": model}  # fmt: skip


def _gate_matrix(gates: torch.Tensor, grid: tuple[int, int], index: int, seed: int):
    """The whole (t, t) gate: row i is query token i's softmax over every key token (log colour scale)."""
    from matplotlib.colors import LogNorm

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 5))
    t = grid[0] * grid[1]
    im = ax.imshow(gates.clamp_min(1e-6).numpy(), norm=LogNorm(vmin=1e-6, vmax=1.0), cmap="magma")
    ax.set(xlabel="key token (row-major on the grid)", ylabel="query token",
           title=f"the full {t} × {t} gate, test digit #{index}, seed {seed}")  # fmt: skip
    fig.colorbar(im, ax=ax, shrink=0.8, label="gate")
    return fig


def patch_geometry(model: nn.Module) -> tuple[int, int]:
    """(side of the pixel patch one stem token sees, pixels between neighbouring tokens), from the stem's
    conv and pool: a k×k conv then a p×p pool of stride s sees k + (p − 1) pixels; tokens are s apart."""
    conv, pool = model.stem.conv, model.stem.pool
    k, cs = conv.kernel_size[0], conv.stride[0]
    p = pool.kernel_size if isinstance(pool.kernel_size, int) else pool.kernel_size[0]
    s = pool.stride if isinstance(pool.stride, int) else pool.stride[0]
    return k + (p - 1) * cs, s * cs


# ----------------------------------------------------------------------------- 16. shuffle


class MLP(nn.Sequential):
    """784 → hidden → ReLU → 10. It has no idea where a pixel sits: a fixed shuffle of the pixels is only
    a relabelling of its first layer's inputs, ``W (P x) = (W P) x``."""

    def __init__(self, *, hidden: int = 256, pixels: int = 784, num_classes: int = 10) -> None:
        super().__init__(OrderedDict(flatten=nn.Flatten(), fc1=nn.Linear(pixels, hidden), relu=nn.ReLU(),
                                     fc2=nn.Linear(hidden, num_classes)))  # fmt: skip


def shuffle_pixels(x: torch.Tensor, seed: int) -> torch.Tensor:
    """One fixed permutation (drawn from ``seed``) of the pixels of every image: (N, C, H, W) → same shape."""
    from gatepool.analysis.symmetry import PermuteTokens

    return PermuteTokens(seed=seed, dim=1)(x.flatten(1)).view_as(x)


SHUFFLE_SETUP = {**TRAIN, "seed": 0, "digit": 7, "token_seed": 0, "digits": 500, "pixel_seed": 0,
                 "cnn": "conv_stem", "cnn_epochs": 3, "mlp_epochs": 10, "mlp_hidden": 256}  # fmt: skip
SHUFFLE_QUICK = {**TRAIN_QUICK, "digits": 200, "mlp_epochs": 3}
SHUFFLE_EXACT = (" (the library's attention without positions, then a mean: exact by construction for any "
                 "weights, trained or not, up to rounding; a definition checked, not a reproduction)")
SHUFFLE_CLAIMS = [
    Claim("equivariance", "max |attn(shuffle(X)) − shuffle(attn(X))| over the 7's 144 tokens × 32 features",
          0.0, 1e-4, "float rounding only: the softmax row sums and G·V's 144-term sums are added in "
          "another order (float32, ε = 1.2e-7, outputs of order 10); bound 1e-4", kind="max",
        source="arithmetic",
        ref="lecture, shuffling tokens: attn(πX) = π attn(X) exactly (the bar allows float rounding)"
        + SHUFFLE_EXACT,
    ),
    Claim("same-prediction", "after the mean pool the 7's prediction is the same with its tokens shuffled",
          True, 0, "exact", kind="equal",
        source="arithmetic",
        ref="lecture, shuffling tokens: after the mean pool the prediction cannot change" + SHUFFLE_EXACT,
    ),
    Claim("flips", "test digits whose prediction changes when their tokens are shuffled (each its own order)",
          0, 0, "exact up to float rounding: a flip needs two logits within ~1e-6", kind="equal",
        source="arithmetic",
        ref="lecture, shuffling tokens: the prediction cannot change, so no test digit flips" + SHUFFLE_EXACT,
    ),
    Claim("cnn-kept", "a CNN trained on plain digits, tested on pixel-shuffled ones, keeps almost none of "
          "its accuracy above chance: (acc shuffled − 10%) / (acc plain − 10%)", 0.0, 0.2,
          "the lecture says 'sinks' without a number; here: at most a fifth of the way from chance back to "
          "its plain accuracy (a shuffled digit keeps little but its amount of ink)", kind="max",
        source="ours",
        ref="the lecture says a pixel shuffle 'sinks' the CNN, without a number: "
        "a fifth of the way back from chance is our bar",
    ),
    Claim("mlp-gap", "an MLP trained on shuffled pixels vs the same MLP on plain ones: accuracy gap (points)",
          0.0, 1.5, "the two runs differ only by a relabelling of the first layer's inputs, i.e. by the "
          "init: the spread between inits plus test sampling (2,000 digits at 95%: SE of a difference ~0.7 "
          "points); quick: 1,000 digits at ~88%, SE ~1.5 points, ±3", quick_tolerance=3.0,
        source="lecture",
        ref="lecture, shuffling pixels: an MLP learns shuffled digits as well as plain ones "
        "(gap 0; the tolerance is sampling)",
    ),
]


@experiment("shuffle", title="attention ignores the order of its tokens; an MLP ignores the order of pixels",
            order=16, setup=SHUFFLE_SETUP, quick=SHUFFLE_QUICK, claims=SHUFFLE_CLAIMS)
def shuffle(ctx: Context) -> None:
    from gatepool.analysis.symmetry import PermuteTokens, equivariance_error
    from gatepool.train import TrainConfig, evaluate, load_data

    # the trainings, all independent (side by side with --jobs): the attention net and, by default, the
    # CNN are experiment 13's seed-0 runs (loaded when 13 has run); the two MLPs are this experiment's
    shared = ctx.out.parent / ROOT
    attention = train_config(ctx.setup, "conv_attention", ctx["seed"], ctx.device)
    if ctx["cnn"] == "conv_stem":  # a pure CNN: conv, ReLU, max pool, global average, Linear
        cnn = train_config(ctx.setup, "conv_stem", ctx["seed"], ctx.device)
        cnn_out = run_folder(shared, cnn)
    elif ctx["cnn"] == "residual_cnn":  # Tuesday's CNN, trained as in experiment 12 (Adam 3e-3, one-cycle)
        cnn = {**attention, "model": "residual_cnn", "model_kwargs": {}, "epochs": ctx["cnn_epochs"],
               "optimizer": "adam", "lr": 3e-3, "weight_decay": 0.0}  # fmt: skip
        cnn_out = run_folder(ctx.out, cnn)
    else:
        raise ValueError(f"--set cnn: conv_stem or residual_cnn, got {ctx['cnn']!r}")
    mlp = {**attention, "model": "mlp", "model_kwargs": {"hidden": ctx["mlp_hidden"]},
           "epochs": ctx["mlp_epochs"], "optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0,
           "threads": max(1, (os.cpu_count() or 1) // ctx.jobs) if ctx.jobs > 1 else None}  # fmt: skip
    tasks = [{"config": attention, "out": run_folder(shared, attention)}, {"config": cnn, "out": cnn_out}]
    for name, pixel_seed in (("mlp-plain", None), ("mlp-shuffled", ctx["pixel_seed"])):
        out = run_folder(ctx.out, {**mlp, "model": name, "pixel_seed": pixel_seed})
        tasks.append({"config": mlp, "out": out, "pixel_seed": pixel_seed})
    for t in tasks:
        t.update(out=str(t["out"]), progress=ctx.progress and ctx.jobs == 1)
    records = run_trainings(tasks[:2], ctx.jobs, ctx.executor)
    records += run_trainings(tasks[2:], 1)  # the MLPs: seconds, no worker

    # attention: token shuffles
    model = attention_net(ctx)  # finished above: loaded
    x, index = first_test_digit(ctx["digit"])
    perm = PermuteTokens(seed=ctx["token_seed"], dim=1)  # over the 144 tokens
    with torch.no_grad():
        tokens = model.tokens(x)  # (1, 144, 32)
        err = equivariance_error(model.mix, tokens, perm)
        logits, moved = model.head(model.mix(tokens)), model.head(model.mix(perm(tokens)))  # (1, 10) each
    ctx.check("equivariance", err, note=f"test digit #{index}; largest |attn(X)| = "
              f"{model.mix(tokens).abs().max().item():.2f}")  # fmt: skip
    ctx.check("same-prediction", bool(logits.argmax() == moved.argmax()),
              note=f"predicted {int(logits.argmax())} both ways; logits differ by at most "
                   f"{(logits - moved).abs().max().item():.1e}")  # fmt: skip
    data = load_data(TrainConfig.from_dict(train_config(ctx.setup, "conv_attention", ctx["seed"])))
    test_x, test_y = data.test_x[: ctx["digits"]], data.test_y[: ctx["digits"]]
    with torch.no_grad():
        t = model.tokens(test_x)  # (N, 144, 32)
        g = torch.Generator().manual_seed(ctx["token_seed"])
        shuffled = torch.stack([ti[torch.randperm(len(ti), generator=g)] for ti in t])  # each its own order
        flips = int((model.head(model.mix(t)).argmax(1) != model.head(model.mix(shuffled)).argmax(1)).sum())
    ctx.check("flips", flips, note=f"over {len(test_y)} test digits")

    # pixels: one fixed shuffle
    cnn_model = _load(tasks[1])
    px = shuffle_pixels(data.test_x, ctx["pixel_seed"])  # (N, 1, 28, 28)
    acc = {
        "cnn plain": 100 * records[1]["final"]["test_acc"],
        "cnn shuffled": 100 * evaluate(cnn_model, px, data.test_y)["acc"],
        "attention net plain": 100 * records[0]["final"]["test_acc"],
        "attention net shuffled": 100 * evaluate(model, px, data.test_y)["acc"],
        "mlp plain": 100 * records[2]["final"]["test_acc"],
        "mlp shuffled": 100 * records[3]["final"]["test_acc"],
    }
    ctx.note(f"test accuracy (%), cnn = {ctx['cnn']}: " + ", ".join(f"{k} {v:.2f}" for k, v in acc.items())
             + " ('shuffled': one fixed pixel permutation; the MLP was trained on it, the others were not)")
    above = acc["cnn plain"] - 10.0
    kept = (acc["cnn shuffled"] - 10.0) / above if above >= 5.0 else float("nan")  # NaN: it never learned
    ctx.check("cnn-kept", kept, note=f"{acc['cnn plain']:.2f}% on plain digits, {acc['cnn shuffled']:.2f}% "
              "on shuffled ones")  # fmt: skip
    ctx.check("mlp-gap", abs(acc["mlp shuffled"] - acc["mlp plain"]),
              note=f"plain {acc['mlp plain']:.2f}%, shuffled {acc['mlp shuffled']:.2f}%")
    ctx.data["test_acc"] = acc
    _shuffle_figure(ctx, data.test_x[0], px[0], acc)


def _load(task: dict[str, Any]) -> nn.Module:
    from gatepool.train import TrainConfig, train

    return train(TrainConfig.from_dict(task["config"]), out=task["out"], progress=False, verbose=False).model


def _shuffle_figure(ctx: Context, plain: torch.Tensor, shuffled: torch.Tensor, acc: dict[str, float]) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), gridspec_kw={"width_ratios": [1, 1, 2.2]},
                             layout="constrained")
    for ax, img, title in ((axes[0], plain, "a test digit"), (axes[1], shuffled, "its pixels shuffled")):
        ax.imshow(img[0].numpy(), cmap="gray_r")
        ax.set_title(title)
        ax.axis("off")
    names = list(acc)
    axes[2].barh(names, [acc[n] for n in names], color=["C0" if "plain" in n else "C3" for n in names])
    axes[2].axvline(10, color="k", ls=":", lw=1)
    axes[2].invert_yaxis()
    axes[2].set(xlabel="test accuracy (%)", xlim=(0, 100), title="plain vs pixel-shuffled test digits")
    ctx.figure(fig, "shuffle.png")
