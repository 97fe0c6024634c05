"""The sequence models (``gatepool.models.seq``) trained on their digit tasks, through the one trainer.

``train_seq_demo(arch=..., task=...)`` is :func:`gatepool.train.train` with four hooks:

    batches   fresh random sequences every step, make_task_batch(task, B, L, g), from the epoch's generator
    loss_fn   the model's teacher-forced per-token cross-entropy, ``model.loss(x, y)``
    eval_fn   greedy decoding of a fixed held-out set (never teacher-forced):
                  token accuracy    = mean over sequences and positions of [ŷ_t = y_t]   (history: test_acc)
                  sequence accuracy = mean over sequences of [ŷ = y]                      (test_seq_acc)
    stop_fn   stop at the first evaluation whose token accuracy reaches ``target_acc``

An epoch is ``eval_every`` steps. AdamW (β = 0.9, 0.98, weight decay 0.01), linear warm-up over
``warmup`` steps then cosine decay (``get_lr(schedule="cosine")``), gradient clipping at norm 1. Either
model reaches ≥ 99 % token accuracy on reversing 8 digits in well under two minutes on two CPU cores.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import torch
import torch.nn as nn

from gatepool.models.seq import ARCHS, SEP, TASKS, make_task_batch
from gatepool.train.batches import model_device
from gatepool.train.config import TrainConfig
from gatepool.train.loop import train
from gatepool.utils.checks import check_int

__all__ = ["format_seq_demo", "greedy_accuracy", "seq_config", "train_seq_demo"]

MODELS = {"decoder": "seq_decoder", "encoder-decoder": "seq_encoder_decoder"}  # arch -> registry name


def seq_config(
    *,
    arch: str,
    task: str = "reverse",
    seed: int = 0,
    length: int = 8,
    steps: int = 2000,
    batch_size: int = 128,
    lr: float = 3e-3,
    warmup: int = 100,
    eval_every: int = 100,
    dim: int = 64,
    depth: int = 2,
    num_heads: int = 4,
    threads: int | None = 1,
    device: str = "auto",
) -> TrainConfig:
    """The :class:`TrainConfig` of a sequence-task training (``steps`` in epochs of ``eval_every``)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    for name, value in (("length", length), ("steps", steps), ("batch_size", batch_size),
                        ("eval_every", eval_every)):  # fmt: skip
        check_int(value, name)
    if steps % eval_every:
        raise ValueError(f"steps must be a multiple of eval_every (an evaluation ends every epoch of "
                         f"eval_every steps), got steps={steps}, eval_every={eval_every}")  # fmt: skip
    check_int(warmup, "warmup", 0, steps - 1)  # [0, steps)
    return TrainConfig(
        model=MODELS[arch],
        model_kwargs=dict(max_len=2 * length + 1, dim=dim, depth=depth, num_heads=num_heads),
        data=f"digits-{task}-{length}", epochs=steps // eval_every, steps_per_epoch=eval_every,
        batch_size=batch_size, optimizer="adamw", lr=lr, betas=(0.9, 0.98), weight_decay=0.01, grad_clip=1.0,
        schedule="cosine", warmup=warmup / steps, seed=seed, threads=threads, device=device,
    )  # fmt: skip


def _task_batches(task: str, batch_size: int, length: int, steps: int, g: torch.Generator) -> Iterator:
    for _ in range(steps):
        yield make_task_batch(task, batch_size, length, g)  # (B, L), (B, L)


def _token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return model.loss(x, y)  # per-token cross-entropy and the logits (B, L, V)


@torch.no_grad()
def greedy_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Token and sequence accuracy of greedy decoding of x (B, L) against y (B, L), in eval mode, on the
    model's device."""
    device = model_device(model)
    was_training = model.training
    model.eval()
    hit = model.generate(x.to(device), y.shape[1]) == y.to(device)  # (B, L)
    model.train(was_training)
    return {"test_acc": hit.float().mean().item(), "test_seq_acc": hit.all(dim=1).float().mean().item()}


def _reached(target_acc: float, row: dict) -> bool:
    return row["test_acc"] >= target_acc


def _digits(t: torch.Tensor) -> str:
    """Token ids as text: digits as themselves, SEP (an untrained model may emit it) as ``_``."""
    return "".join("_" if int(v) == SEP else str(int(v)) for v in t)


def train_seq_demo(
    *,
    arch: str,
    task: str = "reverse",
    seed: int = 0,
    length: int = 8,
    steps: int = 2000,
    batch_size: int = 128,
    lr: float = 3e-3,
    warmup: int = 100,
    eval_every: int = 100,
    eval_size: int = 1000,
    target_acc: float | None = 0.99,
    dim: int = 64,
    depth: int = 2,
    num_heads: int = 4,
    num_examples: int = 5,
    threads: int | None = 1,
    progress: bool = True,
    out: str | os.PathLike | None = None,
    device: str = "auto",
) -> dict:
    """Train ``arch`` (decoder | encoder-decoder) on ``task`` and return the curve and decoded examples.

    Every ``eval_every`` steps (``steps`` must be a multiple) the model decodes a fixed held-out set of
    ``eval_size`` sequences greedily; training stops at the first evaluation whose token accuracy reaches
    ``target_acc`` (None: run all steps). ``threads`` sets torch's intra-op threads for the run and
    restores them after (None: leave them); these models are so small that 1 thread is fastest, and
    several times faster than 2 on a busy 2-core machine. ``out``: a run folder (checkpoints, resume,
    a finished run loaded), as for :func:`gatepool.train.train`. ``device``: auto | cpu | cuda | mps
    (``TrainConfig.device``; the batches are drawn on the CPU and copied there).

    Returns a dict: ``arch, task, seed, length, params, threads, steps_run, time_s, final_token_acc,
    final_seq_acc, reached_target, target_acc, time_to_target_s, step_to_target, curve`` (list of
    ``{step, loss, token_acc, seq_acc, time_s}``; loss is the mean training loss since the last
    evaluation, time_s the seconds of training and evaluation so far) and ``examples``
    (``{input, target, output}`` strings).
    """
    config = seq_config(arch=arch, task=task, seed=seed, length=length, steps=steps, batch_size=batch_size,
                        lr=lr, warmup=warmup, eval_every=eval_every, dim=dim, depth=depth,
                        num_heads=num_heads, threads=threads, device=device)  # fmt: skip
    check_int(eval_size, "eval_size")
    if target_acc is not None and not 0.0 < target_acc <= 1.0:
        raise ValueError(f"target_acc must be in (0, 1] or None, got {target_acc}")
    eval_x, eval_y = make_task_batch(task, eval_size, length, torch.Generator().manual_seed(10_000 + seed))
    if progress:
        print(f"seq-demo: {arch} on {task} of {length} digits, seed {seed}")
    result = train(
        config, out=out, progress=progress, verbose=progress,
        batches=functools.partial(_task_batches, task, batch_size, length, eval_every),
        loss_fn=_token_loss,
        eval_fn=functools.partial(greedy_accuracy, x=eval_x, y=eval_y),
        stop_fn=None if target_acc is None else functools.partial(_reached, target_acc),
    )  # fmt: skip
    record, model = result.record, result.model
    curve, elapsed = [], 0.0
    for row in record["history"]:
        elapsed += row["seconds"]
        curve.append(dict(step=row["epoch"] * eval_every, loss=row["train_loss"], token_acc=row["test_acc"],
                          seq_acc=row["test_seq_acc"], time_s=elapsed))  # fmt: skip
    hit = next((c for c in curve if target_acc is not None and c["token_acc"] >= target_acc), None)
    model.eval()
    with torch.no_grad():
        decoded = model.generate(eval_x[:num_examples].to(model_device(model)), length).cpu()  # (n, L)
    examples = [dict(input=_digits(x), target=_digits(y), output=_digits(o))
                for x, y, o in zip(eval_x, eval_y, decoded)]  # fmt: skip
    out_dict = dict(
        arch=arch, task=task, seed=seed, length=length, params=record["parameters"],
        threads=record["threads"], steps_run=curve[-1]["step"], time_s=record["seconds"],
        final_token_acc=curve[-1]["token_acc"], final_seq_acc=curve[-1]["seq_acc"],
        reached_target=hit is not None, target_acc=target_acc, time_to_target_s=hit and hit["time_s"],
        step_to_target=hit and hit["step"], curve=curve, examples=examples,
    )  # fmt: skip
    if progress:
        print(format_seq_demo(out_dict, curve=False))
    return out_dict


def format_seq_demo(result: dict, *, curve: bool = True) -> str:
    """A human-readable summary of :func:`train_seq_demo`'s result (curve table and decoded examples)."""
    lines = []
    if curve:
        lines.append(f"{result['arch']} on {result['task']}: {result['params']:,} parameters")
        lines.append(f"{'step':>6} {'loss':>8} {'token acc':>10} {'seq acc':>8} {'time s':>7}")
        for row in result["curve"]:
            lines.append(
                f"{row['step']:6d} {row['loss']:8.4f} {row['token_acc']:10.4f} {row['seq_acc']:8.4f} "
                f"{row['time_s']:7.1f}"
            )
    if result["reached_target"]:
        lines.append(
            f"reached {result['target_acc']:.0%} token accuracy at step {result['step_to_target']} "
            f"after {result['time_to_target_s']:.1f} s"
        )
    else:
        lines.append(f"did not reach the target after {result['steps_run']} steps ({result['time_s']:.1f} s)")
    lines.append(f"final greedy token accuracy {result['final_token_acc']:.4f}, "
                 f"sequence accuracy {result['final_seq_acc']:.4f}")  # fmt: skip
    lines.append("examples (input → target | output):")
    for ex in result["examples"]:
        mark = "ok" if ex["output"] == ex["target"] else "WRONG"
        lines.append(f"  {ex['input']} → {ex['target']} | {ex['output']}  {mark}")
    return "\n".join(lines)
