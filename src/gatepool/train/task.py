"""One training as a unit of work: what every lab experiment, ``gatepool grid`` and the shipped nets hand
to :func:`gatepool.train.sweep.run_tasks`.

A :class:`TrainTask` is a run folder, a config and, where the registry's model or the data set's
batches are not the ones to train, the module-level functions that build them; plain data and
module-level functions, so it pickles for the local process pool and for Ray. :func:`train_task` runs
one through :func:`gatepool.train.train`: a finished run is loaded, a started one resumes from its last
complete epoch, and either way the results record comes back; :func:`load_trained` gives a finished
task's model too.

:func:`run_folder` names a run after what it trains, so that another setup never lands in a finished
run's folder::

    <root>/<model>-s<seed>-<first 8 hex digits of sha1(the config as sorted JSON, runtime fields left out)>

(the runtime fields, ``RUNTIME_FIELDS``: threads, data_dir, device, compile, say how to run, not what).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gatepool.train.batches import TrainData, load_data
from gatepool.train.checkpoint import RESULTS, TrainResult
from gatepool.train.config import RUNTIME_FIELDS, TrainConfig


@dataclass(frozen=True)
class TrainTask:
    """One training: ``config`` (a :class:`TrainConfig` as a dict) trained into the run folder ``out``.

    ``progress``: the trainer's progress bar and epoch lines (for one training at a time).
    ``on_epoch_end(model, epoch) -> dict``: extra entries for each epoch's history (e.g. learned τ).
    ``model(config) -> nn.Module``: a model the registry does not build (seeded by the function itself).
    ``data(config) -> TrainData``: data other than ``config.data``'s; called only for a run not finished.
    ``batches(config, data) -> f(generator) -> iterable of (x, y)``: the epoch's batches, where they are not
    one pass over the training set (the trainer's ``batches``; ``config.steps_per_epoch`` of them).
    """

    config: dict[str, Any]
    out: str
    progress: bool = False
    on_epoch_end: Callable[[nn.Module, int], dict[str, Any]] | None = None
    model: Callable[[TrainConfig], nn.Module] | None = None
    data: Callable[[TrainConfig], TrainData] | None = None
    batches: Callable[[TrainConfig, TrainData], Callable[[torch.Generator], Iterable]] | None = None

    def finished(self) -> bool:
        """Whether the run folder holds a finished training (its results record)."""
        return (Path(self.out) / RESULTS).is_file()


def train_task(task: TrainTask) -> dict[str, Any]:
    """Train (or resume, or load) one task; its results record. Module-level: a worker's unit."""
    from gatepool.train.loop import train

    config = TrainConfig.from_dict(task.config)
    model = task.model(config) if task.model is not None else None
    pending = not task.finished()
    data = task.data(config) if task.data is not None and pending else None
    batches = None
    if task.batches is not None and pending:
        data = data if data is not None else load_data(config)
        batches = task.batches(config, data)
    result = train(config, out=task.out, progress=task.progress, verbose=task.progress, model=model,
                   data=data, batches=batches, on_epoch_end=task.on_epoch_end)  # fmt: skip
    return result.record


def load_trained(task: TrainTask) -> TrainResult:
    """A finished task's model and record, read from its run folder (nothing is trained)."""
    from gatepool.train.loop import train

    if not task.finished():
        raise ValueError(f"task.out: {task.out} holds no finished training (train it first: train_pending)")
    config = TrainConfig.from_dict(task.config)
    model = task.model(config) if task.model is not None else None
    return train(config, out=task.out, progress=False, verbose=False, model=model)


def train_pending(tasks: Sequence[TrainTask], jobs: int = 1, executor: Any = None) -> list[dict[str, Any]]:
    """Every task's results record: the unfinished ones trained (in ``jobs`` workers, or through
    ``executor``), then all loaded here, in task order."""
    from gatepool.train.sweep import run_tasks

    run_tasks(train_task, [t for t in tasks if not t.finished()], jobs, executor)
    return [train_task(TrainTask(t.config, t.out, model=t.model)) for t in tasks]  # finished: loaded


def run_folder(root: str | Path, config: dict[str, Any]) -> Path:
    """``root/<model>-s<seed>-<hash of the config>``: another setup never lands in a finished run's folder."""
    what = {k: v for k, v in config.items() if k not in RUNTIME_FIELDS}
    digest = hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:8]
    return Path(root) / f"{config['model']}-s{config['seed']}-{digest}"


__all__ = ["TrainTask", "load_trained", "run_folder", "train_pending", "train_task"]
