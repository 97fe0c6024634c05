"""The training configuration: :class:`TrainConfig`, everything that decides a run, and its checks.

Every field is checked at construction (a ValueError or TypeError naming the field and what it allows);
``check_amp`` checks the mixed precision against the device it is to run on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from gatepool.train.schedule import DEFAULT_WARMUP, SCHEDULES
from gatepool.utils.checks import check_int, check_number
from gatepool.utils.environment import check_device
from gatepool.utils.io import json_copy

OPTIMIZERS = ("adam", "adamw", "sgd")
DEFAULT_LR = {"adam": 3e-3, "adamw": 3e-3, "sgd": 0.1}  # peak learning rates (lr=None)
# Fields that say how to run, not what to compute: they may differ between a run and its resumption.
# The bits depend on the thread count and the device, though: a resume with another count or device
# warns, and every history row records the threads its epoch ran with (the checkpoint, the device).
RUNTIME_FIELDS = ("threads", "data_dir", "device", "compile")
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}  # config.amp -> autocast dtype


@dataclass
class TrainConfig:
    """Everything that decides a training run; stored verbatim in checkpoints and results.json.

    ``lr=None`` and ``warmup=None`` resolve to the optimizer's and the schedule's defaults at
    construction, so the stored config states the numbers used. Subsets (``train_size``,
    ``test_size``) are the first n of ``randperm(N)`` seeded by ``subset_seed``: random, deterministic,
    independent of ``seed``, and nested (the 1k subset lies inside the 4k one). Fields added later
    (``steps_per_epoch``, ``betas``, ``grad_clip``) default to what the trainer did before them, so a run
    saved before they existed still loads (a missing field compares as its default).
    """

    model: str = "residual_cnn"  # registry name (gatepool.list_models())
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"pool": "soft"}
    data: str = "mnist"  # gatepool.data.dataset_names() (a label only when train(data=...) is given)
    data_dir: str | None = None  # None: gatepool.data's search order
    train_size: int | None = None  # None: all 60,000
    test_size: int | None = None  # None: all 10,000
    subset_seed: int = 0
    epochs: int = 6
    batch_size: int = 128
    steps_per_epoch: int | None = None  # None: one pass over the training set; needed with train(batches=)
    eval_batch_size: int = 1000
    optimizer: str = "adam"  # adam | adamw | sgd
    lr: float | None = None  # peak learning rate; None: DEFAULT_LR[optimizer]
    momentum: float = 0.9  # SGD only
    betas: tuple[float, float] = (0.9, 0.999)  # Adam and AdamW only (torch's default)
    weight_decay: float = 0.0
    grad_clip: float | None = None  # clip the gradients' global L2 norm to this; None: no clipping
    schedule: str = "onecycle"  # onecycle | cosine | constant
    warmup: float | None = None  # share of all steps; None: DEFAULT_WARMUP[schedule]
    label_smoothing: float = 0.0
    seed: int = 0  # weights, batch order, dropout
    threads: int | None = None  # None: torch's default (all cores); the bits depend on it
    channels_last: bool | str = "auto"  # "auto": on for models with a Conv2d
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps; "auto": CUDA, else MPS, else CPU
    amp: str | None = None  # None: float32; "bf16" or "fp16": autocast (fp16: CUDA only, GradScaler)
    compile: bool = False  # train through torch.compile(model) (inductor); evaluation runs the module

    def __post_init__(self) -> None:
        _check_str(self, "model")
        if not isinstance(self.model_kwargs, dict):
            raise TypeError(f"model_kwargs must be a dict, got {type(self.model_kwargs).__name__}")
        self.model_kwargs = dict(self.model_kwargs)
        _check_str(self, "data")
        if self.data_dir is not None:
            self.data_dir = str(self.data_dir)
        for name in ("train_size", "test_size", "threads", "steps_per_epoch"):
            setattr(self, name, check_int(getattr(self, name), name, 1, optional=True))
        self.subset_seed = check_int(self.subset_seed, "subset_seed", 0)
        self.seed = check_int(self.seed, "seed", 0)
        self.epochs = check_int(self.epochs, "epochs", 1)
        self.batch_size = check_int(self.batch_size, "batch_size", 1)
        self.eval_batch_size = check_int(self.eval_batch_size, "eval_batch_size", 1)
        _check_choice(self, "optimizer", OPTIMIZERS)
        _check_choice(self, "schedule", SCHEDULES)
        if self.lr is None:
            self.lr = DEFAULT_LR[self.optimizer]
        if self.warmup is None:
            self.warmup = DEFAULT_WARMUP[self.schedule]
        self.lr = check_number(self.lr, "lr", 0.0, low_open=True)
        self.momentum = check_number(self.momentum, "momentum", 0.0, 1.0, high_open=True)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        b1, b2 = (check_number(b, f"betas[{i}]", 0.0, 1.0, high_open=True) for i, b in enumerate(self.betas))
        self.betas = (b1, b2)
        self.weight_decay = check_number(self.weight_decay, "weight_decay", 0.0)
        self.grad_clip = check_number(self.grad_clip, "grad_clip", 0.0, low_open=True, optional=True)
        self.warmup = check_number(self.warmup, "warmup", 0.0, 1.0, high_open=True)
        self.label_smoothing = check_number(self.label_smoothing, "label_smoothing", 0.0, 1.0, high_open=True)
        if not (isinstance(self.channels_last, bool) or self.channels_last == "auto"):
            raise ValueError(f"channels_last must be True, False or 'auto', got {self.channels_last!r}")
        self.device = check_device(self.device)
        if not isinstance(self.compile, bool):
            raise TypeError(f"compile must be True or False, got {self.compile!r}")
        if self.amp is not None and self.amp not in AMP:
            raise ValueError(f"amp must be None, 'bf16' or 'fp16', got {self.amp!r}")

    def to_dict(self) -> dict[str, Any]:
        """The config as results.json holds it (tuples as lists)."""
        return json_copy(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; known: {sorted(known)}")
        return cls(**d)


def _check_str(cfg: TrainConfig, name: str) -> None:
    v = getattr(cfg, name)
    if not isinstance(v, str) or not v:
        raise ValueError(f"{name} must be a non-empty string, got {v!r}")


def _check_choice(cfg: TrainConfig, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(cfg, name)
    if v not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {v!r}")


def check_amp(amp: str | None, device: torch.device) -> None:
    """A ValueError naming ``amp`` unless mixed precision ``amp`` runs on ``device`` (see the module doc)."""
    if amp is None:
        return
    if amp == "fp16" and device.type != "cuda":
        raise ValueError(f"amp 'fp16' needs a CUDA device (float16 autocast with a GradScaler), and the "
                         f"device is {device}; use amp 'bf16' or None here")  # fmt: skip
    if amp == "bf16" and device.type not in ("cuda", "cpu"):
        raise ValueError(f"amp 'bf16' runs on cuda or cpu, and the device is {device}; use amp None there")
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"amp 'bf16': {torch.cuda.get_device_name(device)} has no bfloat16; use amp 'fp16'")
