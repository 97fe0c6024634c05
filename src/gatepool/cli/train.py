"""``gatepool train``: train a model on MNIST (or Fashion-MNIST) with :func:`gatepool.train.train`.

    gatepool train --model residual_cnn --pool max --epochs 6 --seed 0 --data mnist --out runs/max-s0

Writes ``OUT/checkpoint.pt`` after every epoch (keeping the one before as ``checkpoint.prev.pt``, both
with a SHA-256), ``OUT/results.json`` (the exact configuration, the per-epoch history, the final
metrics) and ``OUT/model.safetensors`` at the end. Running the same command again resumes an
interrupted run from its last good epoch, or, for a finished run, prints the saved results without
training. Under ``torchrun --nproc-per-node N -m gatepool train ...`` one training runs data-parallel
over N processes (``gatepool.train.distributed``): rank 0 holds the lock on ``--out``, writes and prints.
``--device auto|cpu|cuda|mps`` (auto: CUDA, else MPS, else CPU) and ``--amp bf16|fp16``
(mixed precision: bf16 on CUDA or the CPU, fp16 on CUDA only; anything else exits 2 in one line).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys

from gatepool.cli.args import UsageError, add_device, device, float_in, int_at_least, out_folder


def _size(text: str) -> int | None:
    if text.lower() == "all":
        return None
    try:
        return int_at_least(1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be 'all' or an integer >= 1, got {text!r}") from None


def _bool_or_auto(text: str) -> bool | str:
    t = text.lower()
    if t in ("auto",):
        return "auto"
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}")


def register(sub: argparse._SubParsersAction) -> None:
    # Defaults live in one place, gatepool.train.TrainConfig: an option left out here is None and
    # TrainConfig's default applies (importing it here would import torch and slow down --help).
    p = sub.add_parser(
        "train",
        help="train a model (checkpointed, resumable, deterministic)",
        description="Train a model; options left out take gatepool.train.TrainConfig's defaults "
        "(residual_cnn, mnist, 6 epochs, batch 128, adam, onecycle, seed 0).",
    )
    p.add_argument("--model", default=None, help="model name (see gatepool.list_models())")
    p.add_argument("--pool", default=None, help="gate of the model's pools (max, avg, soft, ...)")
    p.add_argument(
        "--model-kwargs",
        default=None,
        metavar="JSON",
        help="extra model keyword arguments as JSON, e.g. '{\"width\": 64}'",
    )
    p.add_argument(
        "--data",
        default=None,
        help="mnist, fashion-mnist, or a generated 60×60 set (made on first use): translated-mnist, "
        "cluttered-mnist, distractor-mnist",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="folder with the IDX files, directly or in DIR/NAME/; only it is used (default: search order)",
    )
    p.add_argument("--train-size", type=_size, default=None, help="a random subset of N training images")
    p.add_argument("--test-size", type=_size, default=None, help="a random subset of N test images")
    p.add_argument("--epochs", type=int_at_least(1), default=None)
    p.add_argument("--batch-size", type=int_at_least(1), default=None)
    p.add_argument("--optimizer", default=None, choices=["adam", "adamw", "sgd"])
    p.add_argument("--lr", type=float_in(0, low_open=True), default=None, help="peak learning rate")
    p.add_argument("--momentum", type=float_in(0, 1), default=None, help="SGD momentum")
    p.add_argument("--weight-decay", type=float_in(0), default=None)
    p.add_argument(
        "--grad-clip", type=float_in(0, low_open=True), default=None,
        help="clip the gradients' global norm to this",
    )
    p.add_argument("--schedule", default=None, choices=["onecycle", "cosine", "constant"])
    p.add_argument("--warmup", type=float_in(0, 1), default=None, help="share of the steps spent warming up")
    p.add_argument("--label-smoothing", type=float_in(0, 1), default=None)
    p.add_argument("--seed", type=int_at_least(0), default=None)
    p.add_argument("--threads", type=int_at_least(1), default=None, help="torch threads (default: all cores)")
    p.add_argument(
        "--channels-last",
        type=_bool_or_auto,
        default=None,
        help="auto (conv nets), true or false",
    )
    add_device(p, default=None, amp=True)  # None: TrainConfig's "auto"
    p.add_argument("--compile", action="store_true", default=None,
                   help="train through torch.compile(model) (the first steps pay the compile)")  # fmt: skip
    p.add_argument("--out", default=None, help="run folder: checkpoint, results.json, model.safetensors")
    p.add_argument("--wait", action="store_true", help="if another run writes to --out, wait for it to end")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")
    p.add_argument("--json", action="store_true", help="print the results record as JSON")
    p.set_defaults(func=_run)


# argparse dest -> TrainConfig field (the same name everywhere except pool/model_kwargs)
_FIELDS = [
    "model", "data", "data_dir", "train_size", "test_size", "epochs", "batch_size", "optimizer", "lr",
    "momentum", "weight_decay", "grad_clip", "schedule", "warmup", "label_smoothing", "seed", "threads",
    "channels_last", "device", "amp", "compile",
]  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    from gatepool.data import DataError  # lazy: `gatepool --help` must not import torch
    from gatepool.train import TrainConfig, distributed, train
    from gatepool.utils.lock import RunLock

    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name) is not None}
    try:
        config = TrainConfig(model_kwargs=_model_kwargs(args), **given)
    except (ValueError, TypeError) as e:  # the flags' own types check most of it already
        raise UsageError(str(e)) from None
    progress, verbose = not args.quiet, not (args.quiet or args.json)
    try:
        main = distributed.from_env().main  # under torchrun: rank 0 locks --out and prints, the others train
    except ValueError as e:  # a malformed RANK / WORLD_SIZE / LOCAL_RANK: the message names them
        raise UsageError(f"the torchrun environment: {e}") from None
    try:
        _check(config, args)
        if args.out is None:
            result = train(config, progress=progress, verbose=verbose)
        else:
            lock = RunLock(out_folder(args.out), wait=args.wait) if main else contextlib.nullcontext()
            with lock:
                result = train(config, out=args.out, progress=progress, verbose=verbose)
    except ValueError as e:  # e.g. --out holds a run of another configuration
        raise UsageError(str(e)) from None
    except DataError as e:  # a missing or corrupt data file: the message names it and how to get it
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not main:
        return 0
    if args.json:
        print(json.dumps(result.record, indent=2))
    elif args.quiet:
        final = result.record["final"]
        print(f"test_acc {final['test_acc']:.4f}  test_loss {final['test_loss']:.4f}")
    return 0


def _model_kwargs(args: argparse.Namespace) -> dict:
    example = """like '{"width": 64}'"""
    kwargs = {}
    if args.model_kwargs:
        try:
            kwargs = json.loads(args.model_kwargs)
        except json.JSONDecodeError as e:
            raise UsageError(f"--model-kwargs must be a JSON object {example}: {e}") from None
        if not isinstance(kwargs, dict):
            raise UsageError(f"--model-kwargs must be a JSON object {example}, got {args.model_kwargs}")
    if args.pool is not None:
        kwargs["pool"] = args.pool
    return kwargs


def _check(config, args: argparse.Namespace) -> None:
    """What the flags' types cannot see, each error naming its flag: names, folders, sizes."""
    from gatepool.data import dataset_names, split_size
    from gatepool.models import create_model, list_models
    from gatepool.train import check_amp

    args.device = config.device
    try:
        check_amp(config.amp, device(args))  # device(): a UsageError naming --device if it is not here
    except ValueError as e:
        raise UsageError(f"--amp {config.amp}: {e}") from None

    if config.data not in dataset_names():
        raise UsageError(f"--data {config.data!r} is unknown; choose one of {', '.join(dataset_names())}")
    if config.data_dir is not None and not os.path.isdir(config.data_dir):
        raise UsageError(f"--data-dir {config.data_dir}: no such folder")
    if config.model not in list_models():
        raise UsageError(f"--model {config.model!r} is unknown; choose one of {', '.join(list_models())}")
    try:
        create_model(config.model, **config.model_kwargs)  # cheap, and names the flag at fault
    except (ValueError, TypeError) as e:
        flag = "--pool" if args.pool is not None and "pool" in str(e) else "--model-kwargs"
        takes = (
            f" ({config.model} takes {', '.join(_parameters(config.model))})"
            if isinstance(e, TypeError)
            else ""
        )
        raise UsageError(f"{flag}: {e}{takes}") from None
    sizes = {split: split_size(config.data, split, config.data_dir) for split in ("train", "test")}
    for flag, size, split in [
        ("--train-size", config.train_size, "train"),
        ("--test-size", config.test_size, "test"),
    ]:
        if size is not None and size > sizes[split]:
            raise UsageError(f"{flag} {size} is larger than the {split} split; choose 1 to {sizes[split]}")
    n = config.train_size or sizes["train"]
    if args.batch_size is not None and args.batch_size > n:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the training data; choose 1 to {n}")


def _parameters(model: str) -> list[str]:
    """The keyword arguments of a registered model (of the class a ``**kwargs`` factory returns)."""
    from gatepool.models.registry import model_entrypoint  # lazy: `gatepool --help` must not import torch

    sig = inspect.signature(model_entrypoint(model), eval_str=True)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()) and inspect.isclass(
        sig.return_annotation
    ):
        sig = inspect.signature(sig.return_annotation)
    return [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
