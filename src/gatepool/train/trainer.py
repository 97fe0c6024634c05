"""The trainer: deterministic, checkpointed every epoch, resumable; one loop for every model of the package.

One epoch e (1-based) of ``TrainConfig`` is

    s_e  = SeedSequence([seed, e])                       # the epoch's seed: a function of (seed, e) only
    g    = Generator(s_e)                                # draws the epoch's batches
    for each batch (x_b, y_b) of batches(g):             # default: every training image once, in the
                                                         #   order randperm(N, g), one index_select each
        lr_t = get_lr(t, T, ...)                         # a pure function of the global step t (schedule.py)
        L    = loss_fn(f, x_b, y_b)                      # default (1 − ε)·CE(f(x_b), y_b) + ε·mean(−log p)
        θ    ← optimizer(θ, clip(∇_θ L), lr_t)           # Adam, AdamW or SGD with momentum

then an evaluation (default: loss and accuracy on the test set) and a checkpoint. Since the batches,
the global RNG (reseeded from s_e at the start of each epoch, e.g. for dropout) and the learning rate
all depend only on (seed, epoch, step), a checkpoint needs only the model, the optimizer and the history
to resume *exactly*: a run killed at any point (``kill -9`` included) and restarted with the same
command ends with the same bits as one that was never interrupted (on CPU, with the same thread count).

Where trainings differ, ``train`` takes a hook instead of a copy of the loop:

    batches(g) -> iterable of (x, y)   the epoch's batches drawn from g (e.g. freshly generated token
                                       sequences); ``config.steps_per_epoch`` of them are taken
    loss_fn(model, x, y) -> (loss, logits)   e.g. per-token cross-entropy; accuracy is
                                       mean(argmax(logits, −1) == y) over all of y's elements
    eval_fn(model) -> dict             the epoch's evaluation (e.g. greedy decoding), into the history
    stop_fn(row) -> bool               stop after an epoch whose history row says so (e.g. a target met)
    on_epoch_end(model, epoch) -> dict extras for the history (e.g. learned temperatures)
    on_step(step, loss)                after every update (``train_epoch``; e.g. timing steps)

Speed: the data are tensors, a batch is one ``index_select`` (no DataLoader, no per-image Python),
convolutional models run in ``channels_last`` (oneDNN's fast layout on CPU; measured 1.2-1.4× here for
ResidualCNN), and torch uses all cores unless told otherwise.

Devices: ``config.device`` (``auto``: CUDA when present, else MPS, else the CPU;
:func:`gatepool.utils.environment.resolve_device`). The model goes there, and so does the whole data
set, once, at the start, when it takes at most half the free device memory (MNIST: 188 MB); otherwise it
stays in CPU memory and each batch is copied with ``non_blocking=True``. ``train_epoch`` and
``evaluate`` run on the model's device and copy to it whatever batches they get. ``config.amp``
(``bf16`` | ``fp16``) runs the training steps under ``torch.autocast`` with that dtype (weights and the
optimizer stay float32; the evaluation runs in float32): ``fp16`` on CUDA only, with a
``torch.amp.GradScaler`` (kept in the checkpoint), ``bf16`` on CUDA and, for tests or CPUs with bf16
units, on the CPU; MPS runs without it. Checkpoints are read onto the CPU (``map_location="cpu"``)
and copied into the model wherever it lives, so a run saved on a GPU resumes on a CPU and the other
way round (with a warning: the bits differ between devices; they are reproducible on the CPU only).

Processes: under ``torchrun --nproc-per-node N`` (``WORLD_SIZE`` > 1) one training runs data-parallel
over the N ranks, each on its slice of every global batch, with the single process's updates up to
float32 reduction order (``gatepool.train.distributed``; rank 0 writes the files).

Usage::

    from gatepool.train import TrainConfig, train
    result = train(TrainConfig(model_kwargs={"pool": "soft"}, epochs=6, seed=0), out="runs/soft-s0")
    result.model            # the trained nn.Module
    result.record["final"]  # {"train_loss", "train_acc", "test_loss", "test_acc"}

Files in ``out``: ``checkpoint.pt`` (after every epoch; the one before it is kept as
``checkpoint.prev.pt``), then ``model.safetensors`` and ``results.json`` (the exact config, the history,
the final metrics, the weights' SHA-256, machine and torch version). A finished run called again loads
and returns them without training.

Damage is found, not loaded: a checkpoint carries its SHA-256 (``gatepool.utils.io.load_checked``). One
that fails it is renamed ``*.corrupt`` and the run resumes from the other one (an epoch earlier: the
same bits in the end, since an epoch depends only on (seed, epoch)), or starts over when neither is good;
it says which on stderr. Weights that do not match results.json's digest, or a results.json that does
not parse, are rebuilt from the last checkpoint the same way.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.train import distributed
from gatepool.train.schedule import DEFAULT_WARMUP, SCHEDULES, get_lr
from gatepool.utils.environment import check_device, device_info, machine, resolve_device
from gatepool.utils.io import (
    CorruptFileError,
    atomic_torch_save,
    atomic_write_bytes,
    atomic_write_json,
    json_copy,
    load_checked,
    read_json,
)
from gatepool.utils.threads import num_threads

OPTIMIZERS = ("adam", "adamw", "sgd")
DEFAULT_LR = {"adam": 3e-3, "adamw": 3e-3, "sgd": 0.1}  # peak learning rates (lr=None)
Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets)
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# Fields that say how to run, not what to compute: they may differ between a run and its resumption.
# The bits depend on the thread count and the device, though: a resume with another count or device
# warns, and every history row records the threads its epoch ran with (the checkpoint, the device).
RUNTIME_FIELDS = ("threads", "data_dir", "device", "compile")
CHECKPOINT, RESULTS, WEIGHTS = "checkpoint.pt", "results.json", "model.safetensors"
PREVIOUS = "checkpoint.prev.pt"  # the checkpoint before the newest one
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}  # config.amp -> autocast dtype


# ----------------------------------------------------------------------------- configuration


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
            _check_int(self, name, 1, optional=True)
        _check_int(self, "subset_seed", 0)
        _check_int(self, "seed", 0)
        _check_int(self, "epochs", 1)
        _check_int(self, "batch_size", 1)
        _check_int(self, "eval_batch_size", 1)
        _check_choice(self, "optimizer", OPTIMIZERS)
        _check_choice(self, "schedule", SCHEDULES)
        if self.lr is None:
            self.lr = DEFAULT_LR[self.optimizer]
        if self.warmup is None:
            self.warmup = DEFAULT_WARMUP[self.schedule]
        _check_float(self, "lr", 0.0, math.inf, low_open=True)
        _check_float(self, "momentum", 0.0, 1.0)
        betas = self.betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        for i, b in enumerate(betas):
            if isinstance(b, bool) or not isinstance(b, (int, float, np.floating)) or not 0.0 <= b < 1.0:
                raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r} (betas[{i}])")
        self.betas = (float(betas[0]), float(betas[1]))
        _check_float(self, "weight_decay", 0.0, math.inf)
        if self.grad_clip is not None:
            _check_float(self, "grad_clip", 0.0, math.inf, low_open=True)
        _check_float(self, "warmup", 0.0, 1.0)
        _check_float(self, "label_smoothing", 0.0, 1.0)
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


def _check_int(cfg: TrainConfig, name: str, low: int, *, optional: bool = False) -> None:
    v = getattr(cfg, name)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be an integer >= {low}{none}, got {v!r}")
    setattr(cfg, name, int(v))


def _check_float(cfg: TrainConfig, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    v = getattr(cfg, name)
    ok = isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > low if low_open else v >= low) and v < high
    if not ok:
        lo = "(" if low_open else "["
        raise ValueError(f"{name} must be a number in {lo}{low}, {high}), got {v!r}")
    setattr(cfg, name, float(v))


def _check_choice(cfg: TrainConfig, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(cfg, name)
    if v not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {v!r}")


# ----------------------------------------------------------------------------- data


class TrainData(NamedTuple):
    """In-memory tensors: images (N, C, H, W) float32, already normalized; labels (N,) int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_data(config: TrainConfig, data: TrainData | None = None) -> TrainData:
    """The normalized train and test tensors of ``config.data`` (or ``data``), cut to the subsets."""
    if data is None:
        from gatepool.data import dataset_names, load

        if config.data not in dataset_names():
            known = sorted(dataset_names())
            raise ValueError(f"data must be one of {known} (or pass train(data=...)), got {config.data!r}")
        train_ds = load(config.data, "train", data_dir=config.data_dir)
        test_ds = load(config.data, "test", data_dir=config.data_dir)
        data = TrainData(train_ds.images, train_ds.labels, test_ds.images, test_ds.labels)  # uint8 (N, H, W)
        normalize = lambda images: _normalize(images, train_ds.mean, train_ds.std)  # noqa: E731
    else:
        data = TrainData(*data)  # a plain 4-tuple works too
        normalize = lambda x: x.float()  # noqa: E731
    if len(data.train_x) != len(data.train_y) or len(data.test_x) != len(data.test_y):
        raise ValueError("data: images and labels must have the same length")
    train_idx = _subset(len(data.train_y), config.train_size, config.subset_seed, "train_size")
    test_idx = _subset(len(data.test_y), config.test_size, config.subset_seed, "test_size")
    return TrainData(
        normalize(_pick(data.train_x, train_idx)).contiguous(),
        _pick(data.train_y, train_idx).long().contiguous(),
        normalize(_pick(data.test_x, test_idx)).contiguous(),
        _pick(data.test_y, test_idx).long().contiguous(),
    )


def _normalize(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """uint8 (N, H, W) -> float32 (N, 1, H, W): (x/255 − mean)/std, the training set's mean and std."""
    x = images.unsqueeze(1).to(torch.float32).div_(255.0)
    return x.sub_(mean).div_(std)


def _pick(t: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    return t if idx is None else t.index_select(0, idx)


def _subset(n: int, size: int | None, seed: int, name: str) -> torch.Tensor | None:
    if size is None or size == n:
        return None
    if size > n:
        raise ValueError(f"{name} must be <= {n} (the split's size), got {size}")
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:size]


def data_to_device(data: TrainData, device: torch.device) -> TrainData:
    """``data`` moved to ``device`` once, when it fits (at most half the free memory of a GPU); else as it
    is, and each batch is copied on its way (``train_epoch``, ``evaluate``)."""
    if all(t.device == device for t in data):
        return data
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if sum(t.numel() * t.element_size() for t in data) > free // 2:
            return data
    return TrainData(*(t.to(device) for t in data))


# ----------------------------------------------------------------------------- device and precision


def model_device(model: nn.Module) -> torch.device:
    """Where ``model``'s first parameter (or buffer) lives; the CPU for a model without either."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


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


def _autocast(device: torch.device, amp: str | None):
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AMP[amp])


# ----------------------------------------------------------------------------- optimizer, seeds, batches


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    lr, wd = config.lr, config.weight_decay
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=config.betas, weight_decay=wd)
    return torch.optim.Adam(params, lr=lr, betas=config.betas, weight_decay=wd)


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for epoch ``epoch`` that depends on (seed, epoch) only."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def data_batches(data: TrainData, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
    """Every training example once, in the order ``randperm(N, generator)``: ((B, ...), (B,)) per batch."""
    x, y = data.train_x, data.train_y
    perm = torch.randperm(len(y), generator=generator).to(x.device)  # drawn on the CPU: one order anywhere
    for i in range(0, len(y), batch_size):
        idx = perm[i : i + batch_size]  # (B,)
        yield x.index_select(0, idx), y.index_select(0, idx)


def _epoch_steps(config: TrainConfig, data: TrainData | None, drawn: bool) -> int:
    """Batches per epoch: ``config.steps_per_epoch``, or (for the data set's batches) one pass over it."""
    if drawn:
        if config.steps_per_epoch is None:
            raise ValueError("steps_per_epoch must be set (an integer >= 1) when train(batches=...) draws "
                             "the batches: it fixes the schedule's length")  # fmt: skip
        return config.steps_per_epoch
    full = math.ceil(len(data.train_y) / config.batch_size)
    if config.steps_per_epoch is not None and config.steps_per_epoch > full:
        raise ValueError(f"steps_per_epoch must be <= {full} (one pass over {len(data.train_y)} training "
                         f"examples in batches of {config.batch_size}), got {config.steps_per_epoch}")
    return full if config.steps_per_epoch is None else config.steps_per_epoch


# ----------------------------------------------------------------------------- one step, one epoch


def cross_entropy_loss(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The default ``loss_fn``: cross-entropy of ``model(x)`` (B, classes) against labels y (B,).

    Returns (loss, logits); any ``loss_fn(model, x, y)`` returns the same pair, logits (..., classes)
    lined up with the targets y (...), e.g. (B, L, V) against (B, L) for per-token cross-entropy.
    """
    logits = model(x)  # (B, classes)
    return F.cross_entropy(logits, y, label_smoothing=label_smoothing), logits


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss_fn: LossFn = cross_entropy_loss,
    grad_clip: float | None = None,
    amp: str | None = None,
    scaler: torch.amp.GradScaler | None = None,
    loss_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One update: loss → zero_grad → backward → clip the global gradient norm → step.

    ``amp`` (``bf16`` | ``fp16``): the forward pass and loss under ``torch.autocast`` on x's device;
    ``scaler`` (for fp16): the loss is scaled for the backward pass and the gradients unscaled before
    clipping and the step (which the scaler skips when they overflowed). ``loss_scale``: the backward
    pass differentiates ``loss · loss_scale`` (a rank's share under DDP; see distributed.py). Returns the
    detached (unscaled) loss and logits.
    """
    with _autocast(x.device, amp):
        loss, logits = loss_fn(model, x, y)
    optimizer.zero_grad(set_to_none=True)
    scaled = loss if loss_scale == 1.0 else loss * loss_scale
    if scaler is None:
        scaled.backward()
    else:
        scaler.scale(scaled).backward()
        scaler.unscale_(optimizer)
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    return loss.detach(), logits.detach()


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: TrainData | None,
    config: TrainConfig,
    epoch: int,
    *,
    channels_last: bool = False,
    progress: bool = False,
    batches: Callable[[torch.Generator], Iterable[Batch]] | None = None,
    loss_fn: LossFn | None = None,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
    scaler: torch.amp.GradScaler | None = None,
    ranks: distributed.Ranks | None = None,
) -> dict[str, float]:
    """Train one epoch (1-based ``epoch``; see the module doc for the hooks).

    Returns ``train_loss`` and ``train_acc`` (means over every target of the epoch's batches, as they were
    trained) and ``examples`` (how many inputs it trained on). ``data`` may be None when ``batches``
    draws the batches. It runs on the model's device (batches found elsewhere are copied there) with
    ``config.amp``; ``scaler``: the run's GradScaler for fp16 (None: a fresh one for this epoch).
    ``ranks`` (DDP, ``model`` wrapped): this rank trains on its slice of every batch, and the returned
    metrics and ``examples`` are summed over all ranks (``gatepool.train.distributed``).
    """
    ranks = ranks or distributed.Ranks()
    steps = _epoch_steps(config, data, batches is not None)
    total = steps * config.epochs
    s = epoch_seed(config.seed, epoch)
    torch.manual_seed(s)  # the global RNG (dropout, stochastic layers) restarts each epoch
    generator = torch.Generator().manual_seed(s)
    drawn = batches(generator) if batches is not None else data_batches(data, config.batch_size, generator)
    source = iter(drawn)
    if loss_fn is None:
        loss_fn = functools.partial(cross_entropy_loss, label_smoothing=config.label_smoothing)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    device = model_device(model)
    check_amp(config.amp, device)
    if scaler is None and config.amp == "fp16":
        scaler = torch.amp.GradScaler(device.type)
    model.train()
    loss_sum = torch.zeros((), dtype=_sum_dtype(device), device=device)  # on the device: no sync per step
    correct = torch.zeros((), dtype=torch.int64, device=device)
    targets = examples = 0
    bar = _bar(steps, f"epoch {epoch}/{config.epochs}", progress)
    for i in range(steps):
        t = (epoch - 1) * steps + i  # the global step
        lr = get_lr(t, total, lr=config.lr, schedule=config.schedule, warmup=config.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = next(source, None)
        if batch is None:
            raise ValueError(f"batches gave {i} batches in epoch {epoch}; steps_per_epoch = {steps} needs "
                             "that many")  # fmt: skip
        xb, yb, share = distributed.shard(*batch, ranks)  # e.g. (B, C, H, W) and (B,); a rank's rows of them
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)  # no-op when there
        if xb.dim() == 4:
            xb = xb.contiguous(memory_format=memory_format)
        loss, logits = train_step(model, optimizer, xb, yb, loss_fn=loss_fn, grad_clip=config.grad_clip,
                                  amp=config.amp, scaler=scaler, loss_scale=share)  # fmt: skip
        loss_sum += loss.detach().to(loss_sum.dtype) * yb.numel()  # float64 where the device has it
        correct += (logits.argmax(-1) == yb).sum()
        targets += yb.numel()
        examples += len(xb)
        if on_step is not None:
            on_step(t, loss)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    loss_total, right, targets, examples = distributed.all_sum([float(loss_sum), int(correct), targets,
                                                                 examples], device, ranks)  # fmt: skip
    return {"train_loss": loss_total / targets, "train_acc": int(right) / targets, "examples": int(examples)}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1000,
    channels_last: bool = False,
) -> dict[str, float]:
    """Mean cross-entropy (no smoothing) and accuracy of ``model`` on (x, y), in eval mode, in float32,
    on the model's device (batches of x and y found elsewhere are copied there)."""
    was_training = model.training
    model.eval()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    device = model_device(model)
    loss_sum = torch.zeros((), dtype=_sum_dtype(device), device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(0, len(y), batch_size):
        xb, yb = x[i : i + batch_size].to(device, non_blocking=True), y[i : i + batch_size].to(device)
        if xb.dim() == 4:
            xb = xb.contiguous(memory_format=memory_format)
        logits = model(xb)  # (B, classes)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").to(loss_sum.dtype)
        correct += (logits.argmax(1) == yb).sum()
    model.train(was_training)
    return {"loss": float(loss_sum) / len(y), "acc": int(correct) / len(y)}


def _sum_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


# ----------------------------------------------------------------------------- the run


@dataclass
class TrainResult:
    """The trained ``model`` and the results ``record`` (what results.json holds)."""

    model: nn.Module
    record: dict[str, Any]

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.record["history"]

    @property
    def final(self) -> dict[str, float]:
        return self.record["final"]


TEST_METRICS = ["test_loss", "test_acc"]  # the default evaluation's history fields
_OWN_FIELDS = ("epoch", "train_loss", "train_acc", "lr", "images_per_s", "seconds", "threads")


def train(
    config: TrainConfig,
    *,
    out: str | os.PathLike | None = None,
    progress: bool = True,
    verbose: bool = True,
    on_epoch_end: Callable[[nn.Module, int], dict[str, Any] | None] | None = None,
    model: nn.Module | None = None,
    data: TrainData | None = None,
    batches: Callable[[torch.Generator], Iterable[Batch]] | None = None,
    loss_fn: LossFn | None = None,
    eval_fn: Callable[[nn.Module], dict[str, Any]] | None = None,
    stop_fn: Callable[[dict[str, Any]], bool] | None = None,
) -> TrainResult:
    """Train ``config``; return :class:`TrainResult` (``.model``, ``.record``).

    Args:
        out: run folder. With it, a checkpoint is written after every epoch, a run found there resumes
            from its last complete epoch, and a finished one is loaded and returned without training.
            A folder holding a run of another configuration is an error (only ``threads`` and
            ``data_dir`` may differ; a resume with another thread count warns on stderr, since the
            bits depend on it).
        progress: a tqdm bar per epoch (only when stdout is a terminal).
        verbose: print one summary line per epoch.
        on_epoch_end: ``f(model, epoch) -> dict | None``, called with epoch 0 before training (its dict
            is stored as ``record["initial"]``) and after every epoch's evaluation (its dict is merged
            into that epoch's history entry). Values must be JSON-able (tensors become lists).
            Checkpoints keep them, so they survive a resume.
        model: train this module instead of ``create_model(config.model, **config.model_kwargs)``
            (``config.model`` should still name it, for the record).
        data: in-memory tensors instead of loading ``config.data`` (e.g. shuffled pixels).
        batches: ``f(generator) -> iterable of (x, y)``: the epoch's batches, drawn from the epoch's
            seeded generator (and nothing else, or a resume is not exact); ``config.steps_per_epoch``
            of them are taken. Default: the training set's, one pass in a seeded order.
        loss_fn: ``f(model, x, y) -> (loss, logits)`` (see :func:`cross_entropy_loss`, the default, which
            applies ``config.label_smoothing``).
        eval_fn: ``f(model) -> dict``: the epoch's metrics, after its training (JSON-able; the model is in
            train mode, put it in eval mode inside). Default: ``test_loss`` and ``test_acc`` on the test
            set. They go into the epoch's history entry and the last epoch's into ``record["final"]``.
        stop_fn: ``f(row) -> bool``: True stops the training after the epoch whose history entry is
            ``row`` (e.g. a target accuracy reached); the record is written as for a finished run.

    The data set is loaded only for the default batches or evaluation. The record: ``config``,
    ``history`` (per epoch: epoch, train_loss, train_acc, the evaluation's metrics, lr at the epoch's
    last step, images_per_s (inputs per second, for any input), seconds, threads, and the extras),
    ``initial``, ``final`` (train_loss, train_acc and the metrics), ``parameters``, ``threads`` (of the
    last session), ``channels_last``, ``device`` (where it ran: ``cpu``, ``cuda:0``, ...), for CUDA
    ``device_name`` (``torch.cuda.get_device_name``), ``seconds`` (all epochs), ``machine``, ``torch``.
    ``result.model`` is on ``config.device``.
    ``train_loss`` is the optimized (smoothed) loss averaged over the epoch's batches as they were
    trained; ``test_loss`` is the plain cross-entropy. images_per_s and seconds are timings: the only
    history fields that differ between reruns.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if batches is not None and config.steps_per_epoch is None:
        _epoch_steps(config, None, True)  # raises: the schedule needs the epoch's length
    out = Path(out) if out is not None else None
    ranks = distributed.from_env()  # rank 0 of 1, unless torchrun started this process
    device = distributed.rank_device(resolve_device(config.device), ranks)
    check_amp(config.amp, device)
    progress, verbose = progress and ranks.main, verbose and ranks.main  # rank 0 speaks
    with num_threads(config.threads), distributed.process_group(device, ranks):
        finished = None
        with distributed.main_first(ranks):  # rank 0 reads (and repairs) the folder before the others
            if out is not None and (out / RESULTS).exists():
                finished = _load_finished(config, out, model, device)
        if finished is not None:
            return finished
        if model is None:
            from gatepool.models import create_model

            torch.manual_seed(config.seed)
            model = create_model(config.model, **config.model_kwargs)  # on the CPU: the same init anywhere
        model = model.to(device)
        data = load_data(config, data) if batches is None or eval_fn is None else None
        channels_last = cl = _use_channels_last(config, model, None if data is None else data.train_x)
        if data is not None:
            data = data_to_device(data, device)  # once: a batch is then an index_select on the device
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        if eval_fn is None:
            eval_fn = functools.partial(_test_metrics, data=data, config=config, channels_last=cl)
        if batches is None:
            distributed.check_batches(len(data.train_y), config.batch_size, ranks)
        optimizer = make_optimizer(config, model)
        step_model = distributed.wrap(model, device, ranks)  # DDP under torchrun; the same parameters
        step_model = torch.compile(step_model) if config.compile else step_model
        scaler = torch.amp.GradScaler(device.type) if config.amp == "fp16" else None
        history: list[dict[str, Any]] = []
        initial: dict[str, Any] = {}
        metrics = TEST_METRICS  # the evaluation's fields, for record["final"]
        start = 0
        with distributed.main_first(ranks):  # every rank resumes from the checkpoint rank 0 settled on
            ckpt = _load_checkpoint(config, out)
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])  # its state goes to the parameters' device
            if scaler is not None and "scaler" in ckpt:
                scaler.load_state_dict(ckpt["scaler"])
            history, initial, start = ckpt["history"], ckpt["initial"], ckpt["epoch"]
            metrics = ckpt.get("metrics", TEST_METRICS)  # checkpoints from before eval_fn: the test set's
            _warn_other_threads(ckpt.get("threads"), out, start, config.epochs)
            _warn_other_device(ckpt.get("device", "cpu"), device, out, start, config.epochs)
            if verbose and start < config.epochs:
                print(f"resuming {out} after epoch {start}/{config.epochs}", flush=True)
        elif on_epoch_end is not None:
            initial = json_copy(on_epoch_end(model, 0) or {})

        bar = progress and sys.stdout.isatty()
        for epoch in range(start + 1, config.epochs + 1):
            if history and stop_fn is not None and stop_fn(history[-1]):
                break  # the last epoch met the stop condition (also when resuming after it)
            t0 = time.perf_counter()
            stats = train_epoch(step_model, optimizer, data, config, epoch, channels_last=cl, progress=bar,
                                batches=batches, loss_fn=loss_fn, scaler=scaler, ranks=ranks)  # fmt: skip
            examples = stats.pop("examples")
            t_train = time.perf_counter() - t0
            row: dict[str, Any] = {"epoch": epoch, **stats}
            scores = _merge(row, json_copy(eval_fn(model)), "eval_fn")
            metrics = list(scores)
            row.update(lr=optimizer.param_groups[0]["lr"])
            row.update(images_per_s=examples / t_train, seconds=time.perf_counter() - t0)
            row.update(threads=torch.get_num_threads())
            if on_epoch_end is not None:
                _merge(row, json_copy(on_epoch_end(model, epoch) or {}), "on_epoch_end")
            history.append(row)
            if verbose:
                print(_summary(row, config.epochs, metrics), flush=True)
            if out is not None and ranks.main:
                atomic_torch_save(
                    out / CHECKPOINT,
                    {
                        "config": config.to_dict(),
                        "epoch": epoch,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "history": history,
                        "initial": initial,
                        "metrics": metrics,
                        "threads": torch.get_num_threads(),
                        "device": str(device),
                        **({"scaler": scaler.state_dict()} if scaler is not None else {}),
                    },
                    keep=out / PREVIOUS,
                )

        record = _record(config, model, history, initial, channels_last, metrics, device)
        if ranks.parallel:
            record["processes"] = ranks.world  # data-parallel: images_per_s and the metrics are global
        if out is not None and ranks.main:
            weights = _safetensors_bytes(model)
            record["weights_sha256"] = hashlib.sha256(weights).hexdigest()
            atomic_write_bytes(out / WEIGHTS, weights)
            atomic_write_json(out / RESULTS, record)  # last: its presence marks a finished run
        return TrainResult(model, record)


def _test_metrics(model: nn.Module, *, data: TrainData, config: TrainConfig, channels_last: bool) -> dict:
    """The default evaluation: cross-entropy and accuracy on the test set."""
    test = evaluate(model, data.test_x, data.test_y, batch_size=config.eval_batch_size,
                    channels_last=channels_last)  # fmt: skip
    return {"test_loss": test["loss"], "test_acc": test["acc"]}


def _merge(row: dict[str, Any], new: dict[str, Any], source: str) -> dict[str, Any]:
    """Add ``new`` (a hook's dict) to the history ``row``; a key the row already uses is an error."""
    if not isinstance(new, dict):
        raise TypeError(f"{source} must return a dict, got {type(new).__name__}")
    clash = sorted(set(new) & (set(row) | set(_OWN_FIELDS)))
    if clash:
        raise ValueError(f"{source} returned keys {clash} that the history already uses")
    row.update(new)
    return new


def _record(
    config: TrainConfig,
    model: nn.Module,
    history: list[dict[str, Any]],
    initial: dict[str, Any],
    channels_last: bool,
    metrics: list[str],
    device: torch.device,
) -> dict[str, Any]:
    last = history[-1]
    return {
        "config": config.to_dict(),
        "final": {k: last[k] for k in ("train_loss", "train_acc", *metrics)},
        "history": history,
        "initial": initial,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "channels_last": channels_last,
        **device_info(device),  # device, and for CUDA device_name
        "seconds": sum(row["seconds"] for row in history),
        "machine": machine(),
        "torch": torch.__version__,
    }


def _summary(row: dict[str, Any], epochs: int, metrics: list[str]) -> str:
    numbers = [k for k in metrics if isinstance(row[k], (int, float))]
    scores = "  ".join(f"{k.replace('_', ' ')} {row[k]:.4f}" for k in numbers)
    return (
        f"epoch {row['epoch']}/{epochs}  train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f}"
        f"  {scores}  {row['images_per_s']:.0f} inputs/s  {row['seconds']:.1f} s"
    )


# ----------------------------------------------------------------------------- resume and files


def _config_diff(saved: dict[str, Any], config: TrainConfig) -> list[str]:
    # compared as results.json holds them (a tuple comes back from JSON as a list); a field the saved
    # config lacks was added since, and compares as its default (what the trainer did before it)
    defaults = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(config)}
    saved, now = json_copy({**defaults, **saved}), config.to_dict()
    keys = sorted((set(saved) | set(now)) - set(RUNTIME_FIELDS))
    return [f"{k}: {saved.get(k)!r} there, {now.get(k)!r} now" for k in keys if saved.get(k) != now.get(k)]


def _check_same(saved: dict[str, Any], config: TrainConfig, path: Path) -> None:
    diff = _config_diff(saved, config)
    if diff:
        raise ValueError(
            f"out={str(path.parent)!r} holds a run of another configuration ({'; '.join(diff)}); "
            "use another out folder, or delete this one to start over"
        )


def _warn_other_threads(saved: int | None, out: Path | None, start: int, epochs: int) -> None:
    now = torch.get_num_threads()
    if saved is not None and saved != now and start < epochs:
        _warn(
            f"warning: {out} ran with {saved} torch threads and resumes with {now}: the results will "
            f"not be bit-identical to an uninterrupted run (pass threads={saved} for that)"
        )


def _warn_other_device(saved: str, now: torch.device, out: Path | None, start: int, epochs: int) -> None:
    if saved != str(now) and start < epochs:
        _warn(f"warning: {out} ran on {saved} and resumes on {now}: the results will not be bit-identical "
              "to an uninterrupted run")  # fmt: skip


def _load_checkpoint(config: TrainConfig, out: Path | None) -> dict[str, Any] | None:
    """The newest good checkpoint in ``out`` (``checkpoint.pt``, else ``checkpoint.prev.pt``), or None.

    A file that fails its checksum is renamed ``<name>.corrupt`` (so no later write keeps it as the
    previous one) and the other is tried; each step is said on stderr.
    """
    if out is None:
        return None
    damaged = False
    for name in (CHECKPOINT, PREVIOUS):
        path = out / name
        if not path.exists():
            continue
        try:
            ckpt = load_checked(path)
        except CorruptFileError as e:
            path.replace(path.with_name(name + ".corrupt"))
            _warn(f"warning: {e}; moved it to {name}.corrupt")
            damaged = True
            continue
        _check_same(ckpt["config"], config, path)
        if name == PREVIOUS:
            why = "it is damaged" if damaged else "it is missing (a write was interrupted)"
            _warn(f"warning: {out / CHECKPOINT}: {why}; resuming from {name} (epoch {ckpt['epoch']})")
        return ckpt
    if damaged:
        _warn(f"warning: {out}: no good checkpoint left; the training starts over from epoch 1")
    return None


def _load_finished(
    config: TrainConfig, out: Path, model: nn.Module | None, device: torch.device
) -> TrainResult | None:
    """The finished run in ``out``; None (said on stderr) when its files are damaged: rebuild them."""
    from safetensors.torch import load

    try:
        record = read_json(out / RESULTS)
    except ValueError as e:  # not JSON: a damaged file
        return _damaged(out, RESULTS, f"does not parse ({e})")
    _check_same(record["config"], config, out / RESULTS)
    weights = (out / WEIGHTS).read_bytes() if (out / WEIGHTS).exists() else b""
    digest = record.get("weights_sha256")  # runs saved before the digest was recorded have none
    if not weights:
        return _damaged(out, WEIGHTS, "is missing")
    if digest is not None and hashlib.sha256(weights).hexdigest() != digest:
        return _damaged(out, WEIGHTS, "does not match results.json's SHA-256")
    if model is None:
        from gatepool.models import create_model

        model = create_model(config.model, **config.model_kwargs)
    model = model.to(device)
    model.load_state_dict(load(weights))  # CPU tensors, copied to the model's device
    if record["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    return TrainResult(model, record)


def _damaged(out: Path, name: str, why: str) -> None:
    """Move a finished run's damaged file aside, so that the run is rebuilt from its last checkpoint."""
    if (out / name).exists():
        (out / name).replace(out / (name + ".corrupt"))
    (out / RESULTS).unlink(missing_ok=True)  # no longer finished
    _warn(f"warning: {out / name} {why}; moved aside, rebuilding the run from its last checkpoint "
          "(from the start if it has none)")
    return None


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _safetensors_bytes(model: nn.Module) -> bytes:
    from safetensors.torch import save

    # safetensors wants contiguous, unshared tensors; channels_last weights are neither by default.
    return save({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()})


# ----------------------------------------------------------------------------- speed knobs


def _use_channels_last(config: TrainConfig, model: nn.Module, x: torch.Tensor | None) -> bool:
    """``x``: the training inputs, or None when a batch function draws them (then the model decides)."""
    if config.channels_last == "auto":
        return (x is None or x.dim() == 4) and any(isinstance(m, nn.Conv2d) for m in model.modules())
    if config.channels_last and x is not None and x.dim() != 4:
        raise ValueError(f"channels_last=True needs 4-D images (N, C, H, W), got shape {tuple(x.shape)}")
    return bool(config.channels_last)


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False, unit="batch", dynamic_ncols=True)
