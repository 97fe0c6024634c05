"""A net with one gate in every pool, trained: what pool-comparison, gate-matters and distractor-study
share.

Each training is a ``gatepool.train`` run in its own folder (checkpoint every epoch, then
``results.json`` and ``model.safetensors``), so a killed experiment resumes where it stopped; the
history records every learned temperature τ after each epoch (:func:`gate_task`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from gatepool.lab.claims import Context
from gatepool.train.task import TrainTask


def record_temperatures(model: nn.Module, epoch: int) -> dict[str, Any]:
    """The learned τ of every pool that has one (per channel, at any depth), for the history."""
    return {
        f"tau_{name}": module.temperature.detach().tolist()
        for name, module in model.named_modules()
        if getattr(module, "gate", None) == "soft-learned"
    }


def gate_task(config: dict[str, Any], out: str | Path, progress: bool = False) -> TrainTask:
    """The training of ``config`` into the run folder ``out``, its history holding the learned τ of
    every pool that has one after each epoch (nested pools too)."""
    return TrainTask(config, str(out), progress, on_epoch_end=record_temperatures)


def training_config(ctx: Context, model: str, pool: str, seed: int, **extra: Any) -> dict[str, Any]:
    """A TrainConfig (as a dict, for a worker) of ``model`` with ``pool`` in every pool, trained by the
    experiment's own budget and recipe (its setup's epochs, sizes, batch, optimizer, lr and schedule)."""
    keys = ("epochs", "train_size", "test_size", "batch_size", "optimizer", "lr", "schedule")
    return {"model": model, "model_kwargs": {"pool": pool}, **{k: ctx[k] for k in keys}, "seed": seed,
            "device": ctx.device, **extra}
