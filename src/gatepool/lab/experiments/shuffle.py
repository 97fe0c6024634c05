"""Experiment 16 ``shuffle``: attention ignores the order of its tokens; an MLP ignores the order of pixels.

Every score q_i·k_j depends on the tokens' contents only, so for any permutation π
``attn(πX) = π attn(X)`` and after the mean pool the prediction cannot change. Pixels are another matter:
one fixed shuffle of the pixels sinks a CNN trained on plain digits, while an MLP, which has no notion of
where a pixel sits, learns shuffled digits as well as plain ones. The attention net and the CNN (by
default the stem-only net) are attention-reach's seed-0 trainings (:mod:`gatepool.lab.common.attention_nets`:
loaded when attention-reach has run, trained otherwise); the two MLPs are this experiment's (the
:class:`MLP` on plain and on pixel-shuffled digits, each a ``TrainTask`` that builds them).
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict

import torch
import torch.nn as nn

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.attention_nets import (
    ROOT,
    TRAIN,
    TRAIN_QUICK,
    attention_net,
    first_test_digit,
    train_config,
)
from gatepool.train import TrainConfig, TrainData
from gatepool.train.task import TrainTask, load_trained, run_folder, train_pending
from gatepool.utils.plotting import pyplot


class MLP(nn.Sequential):
    """784 → hidden → ReLU → 10. It has no idea where a pixel sits: a fixed shuffle of the pixels is only
    a relabelling of its first layer's inputs, ``W (P x) = (W P) x``."""

    def __init__(self, *, hidden: int = 256, pixels: int = 784, num_classes: int = 10) -> None:
        super().__init__(OrderedDict(flatten=nn.Flatten(), fc1=nn.Linear(pixels, hidden), relu=nn.ReLU(),
                                     fc2=nn.Linear(hidden, num_classes)))  # fmt: skip


def mlp_net(config: TrainConfig) -> MLP:
    """The MLP of a training (a ``TrainTask``'s model): ``config.model_kwargs``, seeded by ``config.seed``."""
    torch.manual_seed(config.seed)
    return MLP(**config.model_kwargs)


def shuffle_pixels(x: torch.Tensor, seed: int) -> torch.Tensor:
    """One fixed permutation (drawn from ``seed``) of the pixels of every image: (N, C, H, W) → same shape."""
    from gatepool.analysis.symmetry import PermuteTokens

    return PermuteTokens(seed=seed, dim=1)(x.flatten(1)).view_as(x)


def pixel_data(config: TrainConfig, pixel_seed: int | None) -> TrainData:
    """The training's digits (a ``TrainTask``'s data), every image's pixels shuffled by the one fixed
    permutation of ``pixel_seed`` (None: as they are)."""
    from gatepool.train import load_data

    data = load_data(config)
    if pixel_seed is None:
        return data
    return type(data)(*(shuffle_pixels(t, pixel_seed) if t.is_floating_point() else t for t in data))


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
        source="arithmetic",
        ref="lecture, shuffling pixels: an MLP learns shuffled digits as well as plain ones (gap 0: the two "
        "runs differ only by a relabelling of the first layer's inputs, so no correct torch trains them "
        "apart beyond init and sampling; the tolerance is sampling)",
    ),
]


@experiment("shuffle", title="attention ignores the order of its tokens; an MLP ignores the order of pixels",
            order=16, setup=SHUFFLE_SETUP, quick=SHUFFLE_QUICK, claims=SHUFFLE_CLAIMS)
def shuffle(ctx: Context) -> None:
    from gatepool.analysis.symmetry import PermuteTokens, equivariance_error
    from gatepool.train import evaluate, load_data

    # the trainings, all independent (side by side with --jobs): the attention net and, by default, the
    # CNN are attention-reach's seed-0 runs (loaded when it has run); the two MLPs are this experiment's
    shared = ctx.out.parent / ROOT
    attention = train_config(ctx.setup, "conv_attention", ctx["seed"], ctx.device)
    if ctx["cnn"] == "conv_stem":  # a pure CNN: conv, ReLU, max pool, global average, Linear
        cnn = train_config(ctx.setup, "conv_stem", ctx["seed"], ctx.device)
        cnn_out = run_folder(shared, cnn)
    elif ctx["cnn"] == "residual_cnn":  # Tuesday's CNN, trained as in pool-comparison (Adam 3e-3, one-cycle)
        cnn = {**attention, "model": "residual_cnn", "model_kwargs": {}, "epochs": ctx["cnn_epochs"],
               "optimizer": "adam", "lr": 3e-3, "weight_decay": 0.0}  # fmt: skip
        cnn_out = run_folder(ctx.out, cnn)
    else:
        raise ValueError(f"--set cnn: conv_stem or residual_cnn, got {ctx['cnn']!r}")
    mlp = {**attention, "model": "mlp", "model_kwargs": {"hidden": ctx["mlp_hidden"]},
           "epochs": ctx["mlp_epochs"], "optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0,
           "threads": max(1, (os.cpu_count() or 1) // ctx.jobs) if ctx.jobs > 1 else None}  # fmt: skip
    progress = ctx.progress and ctx.jobs == 1
    tasks = [TrainTask(attention, str(run_folder(shared, attention)), progress),
             TrainTask(cnn, str(cnn_out), progress)]  # fmt: skip
    for name, pixel_seed in (("mlp-plain", None), ("mlp-shuffled", ctx["pixel_seed"])):
        out = run_folder(ctx.out, {**mlp, "model": name, "pixel_seed": pixel_seed})
        tasks.append(TrainTask(mlp, str(out), progress, model=mlp_net,
                               data=functools.partial(pixel_data, pixel_seed=pixel_seed)))  # fmt: skip
    records = train_pending(tasks[:2], ctx.jobs, ctx.executor)
    records += train_pending(tasks[2:], 1)  # the MLPs: seconds, no worker

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


def _load(task: TrainTask) -> nn.Module:
    return load_trained(task).model


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
