"""A net with one gate in every pool, trained: what pool-comparison, gate-matters and distractor-study
share.

Each training is a ``gatepool.train`` run in its own folder (checkpoint every epoch, then
``results.json`` and ``model.safetensors``), so a killed experiment resumes where it stopped; the
history records every learned temperature τ after each epoch.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from gatepool.lab.claims import Context


def record_temperatures(model: nn.Module, epoch: int) -> dict[str, Any]:
    """The learned τ of every pool that has one (per channel, at any depth), for the history."""
    return {
        f"tau_{name}": module.temperature.detach().tolist()
        for name, module in model.named_modules()
        if getattr(module, "gate", None) == "soft-learned"
    }


def train_one(task: dict[str, Any]) -> dict[str, Any]:
    """One training (a worker's unit): returns its results record."""
    from gatepool.train import TrainConfig, train

    config = TrainConfig.from_dict(task["config"])
    result = train(
        config,
        out=task["out"],
        progress=task["progress"],
        verbose=task["progress"],
        on_epoch_end=record_temperatures,
    )
    return result.record


def training_config(ctx: Context, model: str, pool: str, seed: int, **extra: Any) -> dict[str, Any]:
    """A TrainConfig (as a dict, for a worker) of ``model`` with ``pool`` in every pool, trained by the
    experiment's own budget and recipe (its setup's epochs, sizes, batch, optimizer, lr and schedule)."""
    keys = ("epochs", "train_size", "test_size", "batch_size", "optimizer", "lr", "schedule")
    return {"model": model, "model_kwargs": {"pool": pool}, **{k: ctx[k] for k in keys}, "seed": seed,
            "device": ctx.device, **extra}
