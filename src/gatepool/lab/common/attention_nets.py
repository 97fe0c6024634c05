"""The lecture's attention net, its stem-only twin, and their trainings: what attention-reach,
attention-maps and shuffle share.

The net (``gatepool.models.conv_attention``) is a deliberately weak conv stem, 144 tokens of 32 features,
then (or not) one single-head attention layer, the mean over the tokens and a Linear:

    X = stem(image)                            (B, 144, 32)   a token sees a 6×6-pixel patch
    G = softmax((X W_Q)(X W_K)ᵀ / √d)          (B, 144, 144)  d = 16: every token reads every other
    P = G (X W_V) W_O                          (B, 144, 32)
    logits = Linear(mean over tokens of P)     (B, 10)

Training (``TRAIN``): AdamW (weight decay 1e-4), batch 128, the one-cycle schedule (30% warm-up), each
model at its own peak learning rate. The trainings are ``gatepool.train`` runs in
``<out>/attention-reach/<model>-s<seed>-<config hash>/``; attention-maps and shuffle ask for the same
seed-0 runs, which are loaded when attention-reach has finished them and trained otherwise (each a
:class:`gatepool.train.task.TrainTask`, its folder named by :func:`gatepool.train.task.run_folder`). In
the quick profile the shipped nets
(the full profile's trainings, ``gatepool pretrained``) answer the claims on trained nets.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from gatepool.lab.claims import Context
from gatepool.train.task import run_folder
from gatepool.utils.checks import check_int

ROOT = "attention-reach"  # the folder (under the run's out) that holds the attention nets' trainings
LR_KEY = {"conv_stem": "lr_stem", "conv_attention": "lr_attention"}
TRAIN = {  # the lecture's setup for the attention net and its stem-only twin
    "train_size": 8000, "test_size": 2000, "epochs": 20, "batch_size": 128, "optimizer": "adamw",
    "lr_stem": 0.3, "lr_attention": 0.03, "weight_decay": 1e-4, "schedule": "onecycle", "d": 16,
}  # fmt: skip
TRAIN_QUICK = {"train_size": 2000, "test_size": 1000, "epochs": 4}


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


def attention_net(ctx: Context, seed: int | None = None) -> nn.Module:
    """attention-reach's attention net of ``seed`` (default ``ctx["seed"]``), in eval mode (loaded, or trained
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
