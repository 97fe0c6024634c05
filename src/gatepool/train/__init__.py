"""Training: one trainer (``trainer.py``), one learning-rate schedule (``schedule.py``) and sweeps of
independent trainings (``sweep.py``)."""

from gatepool.train.schedule import SCHEDULES, get_lr
from gatepool.train.trainer import (
    CHECKPOINT,
    PREVIOUS,
    RESULTS,
    RUNTIME_FIELDS,
    WEIGHTS,
    TrainConfig,
    TrainData,
    TrainResult,
    cross_entropy_loss,
    data_batches,
    epoch_seed,
    evaluate,
    load_data,
    make_optimizer,
    train,
    train_epoch,
    train_step,
)

__all__ = [
    "CHECKPOINT",
    "PREVIOUS",
    "RESULTS",
    "RUNTIME_FIELDS",
    "SCHEDULES",
    "WEIGHTS",
    "TrainConfig",
    "TrainData",
    "TrainResult",
    "cross_entropy_loss",
    "data_batches",
    "epoch_seed",
    "evaluate",
    "get_lr",
    "load_data",
    "make_optimizer",
    "train",
    "train_epoch",
    "train_step",
]
