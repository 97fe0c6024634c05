"""The trainer: whole data set in memory, deterministic, checkpointed every epoch, resumable.

One epoch e (1-based) of ``TrainConfig`` is

    s_e  = SeedSequence([seed, e])                       # the epoch's seed: a function of (seed, e) only
    perm = randperm(N, generator=s_e)                    # every training image once, in a seeded order
    for each batch b = perm[i·B : (i+1)·B]:              # (B,) indices into the in-memory tensors
        lr_t = schedule(t)                               # a pure function of the global step t
        L    = (1 − ε)·CE(f(x_b), y_b) + ε·mean_k(−log p_k)   # label smoothing ε
        θ    ← optimizer(θ, ∇_θ L, lr_t)                 # Adam, AdamW or SGD with momentum

then an evaluation on the test set and a checkpoint. Since the order, the global RNG (reseeded from s_e
at the start of each epoch, e.g. for dropout) and the learning rate all depend only on (seed, epoch,
step), a checkpoint needs only the model, the optimizer and the history to resume *exactly*: a run
killed at any point (``kill -9`` included) and restarted with the same command ends with the same
bits as one that was never interrupted (on CPU, with the same thread count).

The schedules, over T = epochs · steps_per_epoch steps with w = warmup · T warm-up steps:

    constant   lr_t = lr · min(1, (t + 1) / w)                        (linear warm-up, then flat)
    cosine     lr_t = lr · (t + 1) / w                                for t < w (linear warm-up)
               lr_t = lr · ½ (1 + cos(π (t − w) / (T − w)))           after, down to 0
    onecycle   lr_t = lr/25 + (lr − lr/25) · ½ (1 − cos(π t / p))     for t ≤ p = warmup·T − 1, then
               lr_t = lr/25e4 + (lr − lr/25e4) · ½ (1 + cos(π (t − p) / (T − 1 − p)))
                                                           (= torch's OneCycleLR with anneal_strategy="cos")

Speed: the data are tensors, a batch is one ``index_select`` (no DataLoader, no per-image Python),
convolutional models run in ``channels_last`` (oneDNN's fast layout on CPU; measured 1.2-1.4× here for
ResidualCNN), and torch uses all cores unless told otherwise.

Usage::

    from gatepool.train import TrainConfig, train
    result = train(TrainConfig(model_kwargs={"pool": "soft"}, epochs=6, seed=0), out="runs/soft-s0")
    result.model            # the trained nn.Module
    result.record["final"]  # {"train_loss", "train_acc", "test_loss", "test_acc"}

Files in ``out``: ``checkpoint.pt`` (after every epoch), then ``model.safetensors`` and ``results.json``
(the exact config, the history, the final metrics, machine and torch version). A finished run called
again loads and returns them without training.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.utils.environment import machine
from gatepool.utils.io import atomic_torch_save, atomic_write_bytes, atomic_write_json, read_json

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("onecycle", "cosine", "constant")
DEFAULT_LR = {"adam": 3e-3, "adamw": 3e-3, "sgd": 0.1}  # peak learning rates (lr=None)
DEFAULT_WARMUP = {"onecycle": 0.3, "cosine": 0.05, "constant": 0.0}  # share of all steps (warmup=None)
# Fields that say how to run, not what to compute: they may differ between a run and its resumption.
# The bits depend on the thread count, though: a resume with another count warns, and every history
# row records the threads its epoch ran with.
RUNTIME_FIELDS = ("threads", "data_dir")
CHECKPOINT, RESULTS, WEIGHTS = "checkpoint.pt", "results.json", "model.safetensors"


# ----------------------------------------------------------------------------- configuration


@dataclass
class TrainConfig:
    """Everything that decides a training run; stored verbatim in checkpoints and results.json.

    ``lr=None`` and ``warmup=None`` resolve to the optimizer's and the schedule's defaults at
    construction, so the stored config states the numbers used. Subsets (``train_size``,
    ``test_size``) are the first n of ``randperm(N)`` seeded by ``subset_seed``: random, deterministic,
    independent of ``seed``, and nested (the 1k subset lies inside the 4k one).
    """

    model: str = "residual_cnn"  # registry name (gatepool.list_models())
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"pool": "soft"}
    data: str = "mnist"  # "mnist" or "fashion-mnist" (a label only when train(data=...) is given)
    data_dir: str | None = None  # None: gatepool.data's search order
    train_size: int | None = None  # None: all 60,000
    test_size: int | None = None  # None: all 10,000
    subset_seed: int = 0
    epochs: int = 6
    batch_size: int = 128
    eval_batch_size: int = 1000
    optimizer: str = "adam"  # adam | adamw | sgd
    lr: float | None = None  # peak learning rate; None: DEFAULT_LR[optimizer]
    momentum: float = 0.9  # SGD only
    weight_decay: float = 0.0
    schedule: str = "onecycle"  # onecycle | cosine | constant
    warmup: float | None = None  # share of all steps; None: DEFAULT_WARMUP[schedule]
    label_smoothing: float = 0.0
    seed: int = 0  # weights, batch order, dropout
    threads: int | None = None  # None: torch's default (all cores); the bits depend on it
    channels_last: bool | str = "auto"  # "auto": on for models with a Conv2d

    def __post_init__(self) -> None:
        _check_str(self, "model")
        if not isinstance(self.model_kwargs, dict):
            raise TypeError(f"model_kwargs must be a dict, got {type(self.model_kwargs).__name__}")
        self.model_kwargs = dict(self.model_kwargs)
        _check_str(self, "data")
        if self.data_dir is not None:
            self.data_dir = str(self.data_dir)
        for name in ("train_size", "test_size", "threads"):
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
        _check_float(self, "weight_decay", 0.0, math.inf)
        _check_float(self, "warmup", 0.0, 1.0)
        _check_float(self, "label_smoothing", 0.0, 1.0)
        if not (isinstance(self.channels_last, bool) or self.channels_last == "auto"):
            raise ValueError(f"channels_last must be True, False or 'auto', got {self.channels_last!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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
        from gatepool.data import DATASETS, load_dataset

        if config.data not in DATASETS:
            known = sorted(DATASETS)
            raise ValueError(f"data must be one of {known} (or pass train(data=...)), got {config.data!r}")
        train_ds = load_dataset(config.data, "train", data_dir=config.data_dir)
        test_ds = load_dataset(config.data, "test", data_dir=config.data_dir)
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


# ----------------------------------------------------------------------------- schedule


def learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    """The learning rate at global step ``step`` (0-based) of ``total_steps`` (see the module doc)."""
    lr, T, warmup = config.lr, total_steps, config.warmup
    if config.schedule == "onecycle":  # torch.optim.lr_scheduler.OneCycleLR, anneal_strategy="cos"
        start, end = lr / 25.0, lr / 25.0 / 1e4  # div_factor=25, final_div_factor=1e4
        peak = warmup * T - 1  # the step at which lr is reached (a float, as in torch)
        if step <= peak and peak > 0:
            return _cos_anneal(start, lr, step / peak)
        return _cos_anneal(lr, end, (step - peak) / (T - 1 - peak))  # T − 1 − p = (1 − warmup)·T > 0
    w = int(round(warmup * T))
    if step < w:  # linear warm-up, reaching lr at step w − 1
        return lr * (step + 1) / w
    if config.schedule == "constant":
        return lr
    return _cos_anneal(lr, 0.0, (step - w) / max(T - w, 1))  # cosine: torch's CosineAnnealingLR


def _cos_anneal(start: float, end: float, pct: float) -> float:
    """From ``start`` at pct = 0 to ``end`` at pct = 1 along half a cosine."""
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    lr, wd = config.lr, config.weight_decay
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    return torch.optim.Adam(params, lr=lr, weight_decay=wd)


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed for epoch ``epoch`` that depends on (seed, epoch) only."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0] >> np.uint64(1))


# ----------------------------------------------------------------------------- one epoch


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: TrainData,
    config: TrainConfig,
    epoch: int,
    *,
    channels_last: bool = False,
    progress: bool = False,
) -> dict[str, float]:
    """Train one epoch (1-based ``epoch``); return the mean loss and accuracy over its batches."""
    x, y = data.train_x, data.train_y
    n, B = len(y), config.batch_size
    steps = math.ceil(n / B)
    total = steps * config.epochs
    s = epoch_seed(config.seed, epoch)
    torch.manual_seed(s)  # the global RNG (dropout, stochastic layers) restarts each epoch
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(s))
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.int64)
    bar = _bar(steps, f"epoch {epoch}/{config.epochs}", progress)
    for i in range(steps):
        lr = learning_rate(config, (epoch - 1) * steps + i, total)
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = perm[i * B : (i + 1) * B]  # (B,)
        xb = x.index_select(0, idx)  # (B, C, H, W)
        if xb.dim() == 4:
            xb = xb.contiguous(memory_format=memory_format)
        yb = y.index_select(0, idx)  # (B,)
        logits = model(xb)  # (B, classes)
        loss = F.cross_entropy(logits, yb, label_smoothing=config.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach().double() * len(idx)
        correct += (logits.detach().argmax(1) == yb).sum()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return {"train_loss": float(loss_sum) / n, "train_acc": int(correct) / n}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 1000,
    channels_last: bool = False,
) -> dict[str, float]:
    """Mean cross-entropy (no smoothing) and accuracy of ``model`` on (x, y), in eval mode."""
    was_training = model.training
    model.eval()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.int64)
    for i in range(0, len(y), batch_size):
        xb, yb = x[i : i + batch_size], y[i : i + batch_size]
        if xb.dim() == 4:
            xb = xb.contiguous(memory_format=memory_format)
        logits = model(xb)  # (B, classes)
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
    model.train(was_training)
    return {"loss": float(loss_sum) / len(y), "acc": int(correct) / len(y)}


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


def train(
    config: TrainConfig,
    *,
    out: str | os.PathLike | None = None,
    progress: bool = True,
    verbose: bool = True,
    on_epoch_end: Callable[[nn.Module, int], dict[str, Any] | None] | None = None,
    model: nn.Module | None = None,
    data: TrainData | None = None,
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

    The record: ``config``, ``history`` (per epoch: epoch, train_loss, train_acc, test_loss, test_acc,
    images_per_s, seconds, lr at the epoch's last step, threads, and the extras), ``initial``, ``final``,
    ``parameters``, ``threads`` (of the last session), ``channels_last``, ``seconds`` (all epochs),
    ``machine``, ``torch``.
    ``train_loss`` is the optimized (smoothed) loss averaged over the epoch's batches as they were
    trained; ``test_loss`` is the plain cross-entropy. images_per_s and seconds are timings: the only
    history fields that differ between reruns.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    out = Path(out) if out is not None else None
    with _threads(config.threads):
        if out is not None and (out / RESULTS).exists():
            return _load_finished(config, out, model)
        if model is None:
            from gatepool.models import create_model

            torch.manual_seed(config.seed)
            model = create_model(config.model, **config.model_kwargs)
        data = load_data(config, data)
        channels_last = cl = _use_channels_last(config, model, data.train_x)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        optimizer = make_optimizer(config, model)
        history: list[dict[str, Any]] = []
        initial: dict[str, Any] = {}
        start = 0
        ckpt = _load_checkpoint(config, out)
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            history, initial, start = ckpt["history"], ckpt["initial"], ckpt["epoch"]
            _warn_other_threads(ckpt.get("threads"), out, start, config.epochs)
            if verbose and start < config.epochs:
                print(f"resuming {out} after epoch {start}/{config.epochs}", flush=True)
        elif on_epoch_end is not None:
            initial = _plain(on_epoch_end(model, 0) or {})

        bar = progress and sys.stdout.isatty()
        for epoch in range(start + 1, config.epochs + 1):
            t0 = time.perf_counter()
            row: dict[str, Any] = {"epoch": epoch}
            row.update(train_epoch(model, optimizer, data, config, epoch, channels_last=cl, progress=bar))
            t_train = time.perf_counter() - t0
            test = evaluate(model, *data[2:], batch_size=config.eval_batch_size, channels_last=cl)
            row.update(test_loss=test["loss"], test_acc=test["acc"])
            row.update(lr=optimizer.param_groups[0]["lr"])
            row.update(images_per_s=len(data.train_y) / t_train, seconds=time.perf_counter() - t0)
            row.update(threads=torch.get_num_threads())
            if on_epoch_end is not None:
                extras = _plain(on_epoch_end(model, epoch) or {})
                clash = sorted(set(extras) & set(row))
                if clash:
                    raise ValueError(f"on_epoch_end returned keys {clash} that the history already uses")
                row.update(extras)
            history.append(row)
            if verbose:
                print(_summary(row, config.epochs), flush=True)
            if out is not None:
                atomic_torch_save(
                    out / CHECKPOINT,
                    {
                        "config": config.to_dict(),
                        "epoch": epoch,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "history": history,
                        "initial": initial,
                        "threads": torch.get_num_threads(),
                    },
                )

        record = _record(config, model, history, initial, channels_last)
        if out is not None:
            atomic_write_bytes(out / WEIGHTS, _safetensors_bytes(model))
            atomic_write_json(out / RESULTS, record)  # last: its presence marks a finished run
        return TrainResult(model, record)


def _record(
    config: TrainConfig,
    model: nn.Module,
    history: list[dict[str, Any]],
    initial: dict[str, Any],
    channels_last: bool,
) -> dict[str, Any]:
    last = history[-1]
    return {
        "config": config.to_dict(),
        "final": {k: last[k] for k in ("train_loss", "train_acc", "test_loss", "test_acc")},
        "history": history,
        "initial": initial,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "channels_last": channels_last,
        "seconds": sum(row["seconds"] for row in history),
        "machine": machine(),
        "torch": torch.__version__,
    }


def _summary(row: dict[str, Any], epochs: int) -> str:
    return (
        f"epoch {row['epoch']}/{epochs}  train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f}"
        f"  test loss {row['test_loss']:.4f} acc {row['test_acc']:.4f}"
        f"  {row['images_per_s']:.0f} img/s  {row['seconds']:.1f} s"
    )


# ----------------------------------------------------------------------------- resume and files


def _config_diff(saved: dict[str, Any], config: TrainConfig) -> list[str]:
    # compared as results.json holds them: a tuple in model_kwargs comes back from JSON as a list
    saved, now = (json.loads(json.dumps(d, default=str)) for d in (saved, config.to_dict()))
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
        print(
            f"warning: {out} ran with {saved} torch threads and resumes with {now}: the results will "
            f"not be bit-identical to an uninterrupted run (pass threads={saved} for that)",
            file=sys.stderr,
            flush=True,
        )


def _load_checkpoint(config: TrainConfig, out: Path | None) -> dict[str, Any] | None:
    if out is None or not (out / CHECKPOINT).exists():
        return None
    ckpt = torch.load(out / CHECKPOINT, map_location="cpu", weights_only=True)
    _check_same(ckpt["config"], config, out / CHECKPOINT)
    return ckpt


def _load_finished(config: TrainConfig, out: Path, model: nn.Module | None) -> TrainResult:
    from safetensors.torch import load_file

    record = read_json(out / RESULTS)
    _check_same(record["config"], config, out / RESULTS)
    if model is None:
        from gatepool.models import create_model

        model = create_model(config.model, **config.model_kwargs)
    model.load_state_dict(load_file(out / WEIGHTS))
    if record["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    return TrainResult(model, record)


def _safetensors_bytes(model: nn.Module) -> bytes:
    from safetensors.torch import save

    # safetensors wants contiguous, unshared tensors; channels_last weights are neither by default.
    return save({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()})


def _plain(obj: Any) -> Any:
    """``obj`` with tensors and numpy values turned into JSON's types (lists, floats, ints)."""
    return json.loads(json.dumps(obj, default=_jsonable))


def _jsonable(x: Any) -> Any:
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"on_epoch_end returned a {type(x).__name__}, which is not JSON-able")


# ----------------------------------------------------------------------------- speed knobs


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch threads (None: leave torch's setting), restoring the old count after."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n is not None:
            torch.set_num_threads(old)


def _use_channels_last(config: TrainConfig, model: nn.Module, x: torch.Tensor) -> bool:
    if config.channels_last == "auto":
        return x.dim() == 4 and any(isinstance(m, nn.Conv2d) for m in model.modules())
    if config.channels_last and x.dim() != 4:
        raise ValueError(f"channels_last=True needs 4-D images (N, C, H, W), got shape {tuple(x.shape)}")
    return bool(config.channels_last)


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False, unit="batch", dynamic_ncols=True)
