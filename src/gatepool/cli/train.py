"""``gatepool train``: train a model on MNIST (or Fashion-MNIST) with :func:`gatepool.train.train`.

    gatepool train --model residual_cnn --pool max --epochs 6 --seed 0 --data mnist --out runs/max-s0

Writes ``OUT/checkpoint.pt`` after every epoch, ``OUT/results.json`` (the exact configuration, the
per-epoch history, the final metrics) and ``OUT/model.safetensors`` at the end. Running the same
command again resumes an interrupted run from its last complete epoch, or, for a finished run, prints
the saved results without training.
"""

from __future__ import annotations

import argparse
import json


def _size(text: str) -> int | str:
    return "all" if text.lower() == "all" else int(text)


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
    p.add_argument("--data", default=None, help="mnist or fashion-mnist")
    p.add_argument("--data-dir", default=None, help="folder with the IDX files (default: search order)")
    p.add_argument("--train-size", type=_size, default=None, help="a random subset of N training digits")
    p.add_argument("--test-size", type=_size, default=None, help="a random subset of N test digits")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--optimizer", default=None, choices=["adam", "adamw", "sgd"])
    p.add_argument("--lr", type=float, default=None, help="peak learning rate")
    p.add_argument("--momentum", type=float, default=None, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=None)
    p.add_argument("--grad-clip", type=float, default=None, help="clip the gradients' global norm to this")
    p.add_argument("--schedule", default=None, choices=["onecycle", "cosine", "constant"])
    p.add_argument("--warmup", type=float, default=None, help="share of the steps spent warming up")
    p.add_argument("--label-smoothing", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument(
        "--channels-last",
        type=_bool_or_auto,
        default=None,
        help="auto (conv nets), true or false",
    )
    p.add_argument("--out", default=None, help="run folder: checkpoint, results.json, model.safetensors")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-epoch lines")
    p.add_argument("--json", action="store_true", help="print the results record as JSON")
    p.set_defaults(func=_run)


# argparse dest -> TrainConfig field (the same name everywhere except pool/model_kwargs)
_FIELDS = [
    "model", "data", "data_dir", "train_size", "test_size", "epochs", "batch_size", "optimizer", "lr",
    "momentum", "weight_decay", "grad_clip", "schedule", "warmup", "label_smoothing", "seed", "threads",
    "channels_last",
]  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    import sys

    from gatepool.data import DataError
    from gatepool.train import TrainConfig, train

    model_kwargs = {}
    if args.model_kwargs:
        try:
            model_kwargs = json.loads(args.model_kwargs)
        except json.JSONDecodeError as e:
            raise SystemExit(f"gatepool train: --model-kwargs must be a JSON object: {e}") from None
        if not isinstance(model_kwargs, dict):
            raise SystemExit(f"gatepool train: --model-kwargs must be a JSON object, got {model_kwargs!r}")
    if args.pool is not None:
        model_kwargs["pool"] = args.pool
    given = {name: getattr(args, name) for name in _FIELDS if getattr(args, name) is not None}
    if "train_size" in given and given["train_size"] == "all":
        given["train_size"] = None
    if "test_size" in given and given["test_size"] == "all":
        given["test_size"] = None
    try:
        config = TrainConfig(model_kwargs=model_kwargs, **given)
        result = train(config, out=args.out, progress=not args.quiet, verbose=not (args.quiet or args.json))
    except ValueError as e:
        raise SystemExit(f"gatepool train: {e}") from None
    except DataError as e:  # a missing or corrupt data file: the message names it and how to get it
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.record, indent=2))
    elif args.quiet:
        final = result.record["final"]
        print(f"test_acc {final['test_acc']:.4f}  test_loss {final['test_loss']:.4f}")
    return 0
