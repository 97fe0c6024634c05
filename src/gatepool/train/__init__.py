"""Training: one trainer (its config ``config.py``, its data ``batches.py``, its files ``checkpoint.py``,
its loop ``loop.py``), one learning-rate schedule (``schedule.py``), one training as a unit of work
(``task.py``: its run folder, its hooks) and sweeps of independent trainings (``sweep.py``)."""

from gatepool.train.batches import (
    TrainData,
    data_batches,
    data_to_device,
    epoch_seed,
    load_data,
    model_device,
)
from gatepool.train.checkpoint import CHECKPOINT, PREVIOUS, RESULTS, WEIGHTS, TrainResult
from gatepool.train.config import AMP, RUNTIME_FIELDS, TrainConfig, check_amp
from gatepool.train.loop import cross_entropy_loss, evaluate, make_optimizer, train, train_epoch, train_step
from gatepool.train.schedule import SCHEDULES, get_lr

__all__ = [
    "AMP",
    "CHECKPOINT",
    "PREVIOUS",
    "RESULTS",
    "RUNTIME_FIELDS",
    "SCHEDULES",
    "WEIGHTS",
    "TrainConfig",
    "TrainData",
    "TrainResult",
    "check_amp",
    "cross_entropy_loss",
    "data_batches",
    "data_to_device",
    "epoch_seed",
    "evaluate",
    "get_lr",
    "load_data",
    "make_optimizer",
    "model_device",
    "train",
    "train_epoch",
    "train_step",
]
