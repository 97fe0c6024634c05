"""A run's files: checkpoints after every epoch, the finished run's weights and record, and their repair.

Files in ``out``: ``checkpoint.pt`` (after every epoch; the one before it is kept as
``checkpoint.prev.pt``), then ``model.safetensors`` and ``results.json`` (the exact config, the history,
the final metrics, the weights' SHA-256, machine and torch version). A finished run called again loads
and returns them without training.

Damage is found, not loaded: a checkpoint carries its SHA-256 (``gatepool.utils.io.load_checked``). One
that fails it is renamed ``*.corrupt`` and the run resumes from the other one (an epoch earlier: the
same bits in the end, since an epoch depends only on (seed, epoch)), or starts over when neither is good;
it says which on stderr. Weights that do not match results.json's digest, or a results.json that does
not parse, are rebuilt from the last checkpoint the same way.

Checkpoints are read onto the CPU (``map_location="cpu"``) and copied into the model wherever it lives,
so a run saved on a GPU resumes on a CPU and the other way round (with a warning: the bits differ
between devices; they are reproducible on the CPU only).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gatepool.train.config import RUNTIME_FIELDS, TrainConfig
from gatepool.utils.environment import device_info, machine
from gatepool.utils.io import (
    CorruptFileError,
    atomic_torch_save,
    atomic_write_bytes,
    atomic_write_json,
    json_copy,
    load_checked,
    read_json,
)

CHECKPOINT, RESULTS, WEIGHTS = "checkpoint.pt", "results.json", "model.safetensors"
PREVIOUS = "checkpoint.prev.pt"  # the checkpoint before the newest one
TEST_METRICS = ["test_loss", "test_acc"]  # the default evaluation's history fields


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


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    out: Path,
    config: TrainConfig,
    epoch: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    history: list[dict[str, Any]],
    initial: dict[str, Any],
    metrics: list[str],
    device: torch.device,
) -> None:
    """``out/checkpoint.pt`` after epoch ``epoch`` (written atomically; the one before it kept as
    ``checkpoint.prev.pt``): what a resume loads (the weights, the optimizer, the fp16 scaler when it is
    on, the history) and what it checks (the config, the thread count, the device)."""
    state = {
        "config": config.to_dict(),
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "history": history,
        "initial": initial,
        "metrics": metrics,
        "threads": torch.get_num_threads(),
        "device": str(device),
        **({"scaler": scaler.state_dict()} if scaler.is_enabled() else {}),
    }
    atomic_torch_save(out / CHECKPOINT, state, keep=out / PREVIOUS)


def load_checkpoint(config: TrainConfig, out: Path) -> dict[str, Any] | None:
    """The newest good checkpoint in ``out`` (``checkpoint.pt``, else ``checkpoint.prev.pt``), or None.

    A file that fails its checksum is renamed ``<name>.corrupt`` (so no later write keeps it as the
    previous one) and the other is tried; each step is said on stderr.
    """
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


def resume(
    ckpt: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    *,
    out: Path,
    device: torch.device,
    epochs: int,
) -> tuple[int, list[dict[str, Any]], dict[str, Any], list[str]]:
    """Load checkpoint ``ckpt`` into the model, the optimizer and the scaler; return its (epoch, history,
    initial, metrics). A resume with another thread count or on another device warns on stderr."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])  # its state goes to the parameters' device
    if scaler.is_enabled() and "scaler" in ckpt:
        scaler.load_state_dict(ckpt["scaler"])
    start = ckpt["epoch"]
    _warn_other_threads(ckpt.get("threads"), out, start, epochs)
    _warn_other_device(ckpt.get("device", "cpu"), device, out, start, epochs)
    metrics = ckpt.get("metrics", TEST_METRICS)  # checkpoints from before eval_fn: the test set's
    return start, ckpt["history"], ckpt["initial"], metrics


# ----------------------------------------------------------------------------- the finished run


def make_record(
    config: TrainConfig,
    model: nn.Module,
    history: list[dict[str, Any]],
    initial: dict[str, Any],
    channels_last: bool,
    metrics: list[str],
    device: torch.device,
    processes: int = 1,
) -> dict[str, Any]:
    """The results record (see :func:`gatepool.train.train`); ``processes`` > 1: data-parallel, and
    images_per_s and the metrics are the global ones."""
    last = history[-1]
    record = {
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
    if processes > 1:
        record["processes"] = processes
    return record


def save_finished(out: Path, model: nn.Module, record: dict[str, Any]) -> None:
    """The weights (``model.safetensors``) and the record with their SHA-256 (``results.json``, written
    last: its presence marks a finished run)."""
    weights = _safetensors_bytes(model)
    record["weights_sha256"] = hashlib.sha256(weights).hexdigest()
    atomic_write_bytes(out / WEIGHTS, weights)
    atomic_write_json(out / RESULTS, record)


def load_finished(
    config: TrainConfig, out: Path, model: nn.Module | None, device: torch.device
) -> TrainResult | None:
    """The finished run in ``out``; None when there is none, or when its files are damaged (said on stderr;
    moved aside, so that the run is rebuilt from its last checkpoint)."""
    from safetensors.torch import load

    if not (out / RESULTS).exists():
        return None
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


def _safetensors_bytes(model: nn.Module) -> bytes:
    from safetensors.torch import save

    # safetensors wants contiguous, unshared tensors; channels_last weights are neither by default.
    return save({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()})


# ----------------------------------------------------------------------------- resuming the same run


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


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
