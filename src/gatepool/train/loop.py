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
                                       (logits None: a loss without classes, e.g. contrastive
                                       or denoising; train_acc is then None)
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
units, on the CPU; MPS runs without it. Both go through ``torch.autocast(enabled=...)`` and
``torch.amp.GradScaler(enabled=...)``, off for float32: one step for every precision.

Processes: under ``torchrun --nproc-per-node N`` (``WORLD_SIZE`` > 1) one training runs data-parallel
over the N ranks, each on its slice of every global batch, with the single process's updates up to
float32 reduction order (``gatepool.train.distributed``; rank 0 writes the files).

Usage::

    from gatepool.train import TrainConfig, train
    result = train(TrainConfig(model_kwargs={"pool": "soft"}, epochs=6, seed=0), out="runs/soft-s0")
    result.model            # the trained nn.Module
    result.record["final"]  # {"train_loss", "train_acc", "test_loss", "test_acc"}

The run's files (checkpoints, resume, finished runs, damage) are ``checkpoint.py``'s; the config and its
checks ``config.py``'s; the data and the epoch's batches ``batches.py``'s.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.train import distributed
from gatepool.train.batches import (
    Batch,
    TrainData,
    data_batches,
    data_to_device,
    epoch_seed,
    epoch_steps,
    load_data,
    model_device,
)
from gatepool.train.checkpoint import (
    TEST_METRICS,
    TrainResult,
    load_checkpoint,
    load_finished,
    make_record,
    resume,
    save_checkpoint,
    save_finished,
)
from gatepool.train.config import AMP, TrainConfig, check_amp
from gatepool.train.schedule import get_lr
from gatepool.utils.environment import cpu_model, resolve_device
from gatepool.utils.io import json_copy
from gatepool.utils.threads import num_threads

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
OWN_FIELDS = ("epoch", "train_loss", "train_acc", "lr", "images_per_s", "seconds", "threads")  # a row's


# ----------------------------------------------------------------------------- the run


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
            applies ``config.label_smoothing``); logits None for a loss without classes (train_acc None).
        eval_fn: ``f(model) -> dict``: the epoch's metrics, after its training (JSON-able; the model is in
            train mode, put it in eval mode inside). Default: ``test_loss`` and ``test_acc`` on the test
            set. They go into the epoch's history entry and the last epoch's into ``record["final"]``.
        stop_fn: ``f(row) -> bool``: True stops the training after the epoch whose history entry is
            ``row`` (e.g. a target accuracy reached); the record is written as for a finished run.

    The data set is loaded only for the default batches or evaluation. The record: ``config``,
    ``history`` (per epoch: epoch, train_loss, train_acc, the evaluation's metrics, lr at the epoch's
    last step, images_per_s (inputs per second, for any input), seconds, threads, cpu (the processor the
    epoch ran on: a run resumed on another machine says which epochs ran where), and the extras),
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
    if batches is not None:
        epoch_steps(config, None, drawn=True)  # raises without steps_per_epoch: the schedule needs it
    out = None if out is None else Path(out)
    ranks = distributed.from_env()  # rank 0 of 1, unless torchrun started this process
    device = distributed.rank_device(resolve_device(config.device), ranks)
    check_amp(config.amp, device)
    bar, verbose = progress and ranks.main and sys.stdout.isatty(), verbose and ranks.main  # rank 0 speaks
    with num_threads(config.threads), distributed.process_group(device, ranks):
        finished, ckpt = _read_folder(config, out, model, device, ranks)
        if finished is not None:
            return finished

        # the model, the data and the hooks (their defaults: the data set's batches and test set)
        model = _new_model(config) if model is None else model
        data = load_data(config, data) if batches is None or eval_fn is None else None
        channels_last = _use_channels_last(config, model, None if data is None else data.train_x)
        model = model.to(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        if data is not None:
            data = data_to_device(data, device)  # once: a batch is then an index_select on the device
        if batches is None:
            distributed.check_batches(len(data.train_y), config.batch_size, ranks)
        if eval_fn is None:
            eval_fn = functools.partial(_test_metrics, data=data, config=config, channels_last=channels_last)
        on_epoch_end = on_epoch_end or _no_extras
        stop_fn = stop_fn or _never

        # the optimizer, fp16's loss scaler (off for other precisions), the model as the steps call it
        optimizer = make_optimizer(config, model)
        scaler = torch.amp.GradScaler(device.type, enabled=config.amp == "fp16")
        step_model = distributed.wrap(model, device, ranks)  # DDP under torchrun; the same parameters
        step_model = torch.compile(step_model) if config.compile else step_model

        # where to start: after the checkpoint's epoch, or at the beginning
        if ckpt is not None:
            start, history, initial, metrics = resume(ckpt, model, optimizer, scaler, out=out, device=device,
                                                      epochs=config.epochs)  # fmt: skip
            if verbose and start < config.epochs:
                print(f"resuming {out} after epoch {start}/{config.epochs}", flush=True)
        else:
            start, history, metrics = 0, [], TEST_METRICS
            initial = json_copy(on_epoch_end(model, 0) or {})

        cpu = cpu_model()  # this session's processor, in each epoch's row
        for epoch in range(start + 1, config.epochs + 1):
            if history and stop_fn(history[-1]):
                break  # the last epoch met the stop condition (also when resuming after it)
            t0 = time.perf_counter()
            stats = train_epoch(step_model, optimizer, data, config, epoch, channels_last=channels_last,
                                progress=bar, batches=batches, loss_fn=loss_fn, scaler=scaler,
                                ranks=ranks)  # fmt: skip
            t_train, examples = time.perf_counter() - t0, stats.pop("examples")
            scores = _hook_fields(json_copy(eval_fn(model)), "eval_fn")
            row = {"epoch": epoch, **stats, **scores}  # train_loss, train_acc, the evaluation's metrics
            row.update(lr=optimizer.param_groups[0]["lr"], images_per_s=examples / t_train,
                       seconds=time.perf_counter() - t0, threads=torch.get_num_threads(),
                       cpu=cpu)  # fmt: skip
            row.update(_hook_fields(json_copy(on_epoch_end(model, epoch) or {}), "on_epoch_end", row))
            history.append(row)
            metrics = list(scores)
            if verbose:
                print(_summary(row, config.epochs, metrics), flush=True)
            if out is not None and ranks.main:
                save_checkpoint(out, config, epoch, model, optimizer, scaler, history, initial, metrics,
                                device)  # fmt: skip

        record = make_record(config, model, history, initial, channels_last, metrics, device, ranks.world)
        if out is not None and ranks.main:
            save_finished(out, model, record)
        return TrainResult(model, record)


def _read_folder(
    config: TrainConfig,
    out: Path | None,
    model: nn.Module | None,
    device: torch.device,
    ranks: distributed.Ranks,
) -> tuple[TrainResult | None, dict[str, Any] | None]:
    """The finished run in ``out``, else the checkpoint to resume from (None where there is none). Rank 0
    reads (and repairs) the folder before the other ranks, so that every rank resumes from one epoch."""
    if out is None:
        return None, None
    with distributed.main_first(ranks):
        finished = load_finished(config, out, model, device)
        return finished, None if finished is not None else load_checkpoint(config, out)


def _new_model(config: TrainConfig) -> nn.Module:
    from gatepool.models import create_model

    torch.manual_seed(config.seed)
    return create_model(config.model, **config.model_kwargs)  # on the CPU: the same init anywhere


def _use_channels_last(config: TrainConfig, model: nn.Module, x: torch.Tensor | None) -> bool:
    """``x``: the training inputs, or None when a batch function draws them (then the model decides)."""
    if config.channels_last == "auto":
        return (x is None or x.dim() == 4) and any(isinstance(m, nn.Conv2d) for m in model.modules())
    if config.channels_last and x is not None and x.dim() != 4:
        raise ValueError(f"channels_last=True needs 4-D images (N, C, H, W), got shape {tuple(x.shape)}")
    return bool(config.channels_last)


def _test_metrics(model: nn.Module, *, data: TrainData, config: TrainConfig, channels_last: bool) -> dict:
    """The default evaluation: cross-entropy and accuracy on the test set."""
    test = evaluate(model, data.test_x, data.test_y, batch_size=config.eval_batch_size,
                    channels_last=channels_last)  # fmt: skip
    return {"test_loss": test["loss"], "test_acc": test["acc"]}


def _hook_fields(new: dict[str, Any], source: str, row: dict[str, Any] | None = None) -> dict[str, Any]:
    """``new`` (a hook's dict) checked for the history ``row``: a key the row uses already is an error."""
    if not isinstance(new, dict):
        raise TypeError(f"{source} must return a dict, got {type(new).__name__}")
    clash = sorted(set(new) & (set(row or {}) | set(OWN_FIELDS)))
    if clash:
        raise ValueError(f"{source} returned keys {clash} that the history already uses")
    return new


def _no_extras(model: nn.Module, epoch: int) -> None:
    return None


def _never(row: dict[str, Any]) -> bool:
    return False


def _summary(row: dict[str, Any], epochs: int, metrics: list[str]) -> str:
    numbers = [k for k in metrics if isinstance(row[k], (int, float))]
    scores = "  ".join(f"{k.replace('_', ' ')} {row[k]:.4f}" for k in numbers)
    acc = "" if row["train_acc"] is None else f" acc {row['train_acc']:.4f}"
    return (
        f"epoch {row['epoch']}/{epochs}  train loss {row['train_loss']:.4f}{acc}"
        f"  {scores}  {row['images_per_s']:.0f} inputs/s  {row['seconds']:.1f} s"
    )


# ----------------------------------------------------------------------------- one epoch, one step


def cross_entropy_loss(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The default ``loss_fn``: cross-entropy of ``model(x)`` (B, classes) against labels y (B,).

    Returns (loss, logits); any ``loss_fn(model, x, y)`` returns the same pair, logits (..., classes)
    lined up with the targets y (...), e.g. (B, L, V) against (B, L) for per-token cross-entropy.
    """
    logits = model(x)  # (B, classes)
    return F.cross_entropy(logits, y, label_smoothing=label_smoothing), logits


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
    trained; train_acc None when ``loss_fn`` gives no logits) and ``examples`` (how many inputs it trained
    on). ``data`` may be None when ``batches`` draws the batches. It runs on the model's device (batches
    found elsewhere are copied there) with ``config.amp``; ``scaler``: the run's GradScaler for fp16
    (None: a fresh one for this epoch).
    ``ranks`` (DDP, ``model`` wrapped): this rank trains on its slice of every batch, and the returned
    metrics and ``examples`` are summed over all ranks (``gatepool.train.distributed``).
    """
    ranks = ranks or distributed.Ranks()
    steps = epoch_steps(config, data, batches is not None)
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
    if scaler is None:
        scaler = torch.amp.GradScaler(device.type, enabled=config.amp == "fp16")
    model.train()
    loss_sum = torch.zeros((), dtype=_sum_dtype(device), device=device)  # on the device: no sync per step
    correct = torch.zeros((), dtype=torch.int64, device=device)
    targets = scored = examples = 0  # scored: the targets with logits (for the accuracy)
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
        if logits is not None:
            correct += (logits.argmax(-1) == yb).sum()
            scored += yb.numel()
        targets += yb.numel()
        examples += len(xb)
        if on_step is not None:
            on_step(t, loss)
        bar.update(1)
    bar.close()
    loss_total, right, targets, scored, examples = distributed.all_sum(
        [float(loss_sum), int(correct), targets, scored, examples], device, ranks)  # fmt: skip
    acc = int(right) / scored if scored else None
    return {"train_loss": loss_total / targets, "train_acc": acc, "examples": int(examples)}


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

    The norm is that of the gradients the optimizer steps with (its parameters'; a frozen parameter's
    leftover gradient from an earlier training does not count).

    ``amp`` (``bf16`` | ``fp16``): the forward pass and loss under ``torch.autocast`` on x's device;
    ``scaler`` (for fp16): the loss is scaled for the backward pass and the gradients unscaled before
    clipping and the step (which the scaler skips when they overflowed). ``loss_scale``: the backward
    pass differentiates ``loss · loss_scale`` (a rank's share under DDP; see distributed.py). Returns the
    detached (unscaled) loss and logits (None where ``loss_fn`` gives none).
    """
    with torch.autocast(x.device.type, dtype=AMP[amp] if amp else None, enabled=amp is not None):
        loss, logits = loss_fn(model, x, y)
    if scaler is None:
        scaler = torch.amp.GradScaler(x.device.type, enabled=False)  # off: scale() and the rest are no-ops
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss if loss_scale == 1.0 else loss * loss_scale).backward()
    scaler.unscale_(optimizer)
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(_stepped(optimizer), grad_clip)
    scaler.step(optimizer)  # optimizer.step(), unless fp16's gradients overflowed
    scaler.update()
    return loss.detach(), None if logits is None else logits.detach()


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


def make_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """``config.optimizer`` over the model's trainable parameters (the rate is set before every step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr, wd = config.lr, config.weight_decay
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=wd)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=config.betas, weight_decay=wd)
    return torch.optim.Adam(params, lr=lr, betas=config.betas, weight_decay=wd)


def _stepped(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters ``optimizer`` updates, in its order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _sum_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False, unit="batch", dynamic_ncols=True, disable=not enabled)
