"""Training: one trainer (``trainer.py``) and sweeps of independent trainings (``sweep.py``)."""

from gatepool.train.trainer import (
    CHECKPOINT,
    RESULTS,
    RUNTIME_FIELDS,
    WEIGHTS,
    TrainConfig,
    TrainData,
    TrainResult,
    epoch_seed,
    evaluate,
    learning_rate,
    load_data,
    make_optimizer,
    train,
    train_epoch,
)

__all__ = [
    "CHECKPOINT",
    "RESULTS",
    "RUNTIME_FIELDS",
    "WEIGHTS",
    "TrainConfig",
    "TrainData",
    "TrainResult",
    "epoch_seed",
    "evaluate",
    "learning_rate",
    "load_data",
    "make_optimizer",
    "train",
    "train_epoch",
]
