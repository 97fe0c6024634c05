"""``gatepool probe-check``: the correlated probe over torchvision's classifiers and timm's families.

    gatepool probe-check                                # every torchvision classifier, one a timm family
    gatepool probe-check --zoo torchvision --per-family # one torchvision model a family (its module)
    gatepool probe-check --models tv:resnet18 timm:resnet18 --batch 32 --seed 0 --json /tmp/probe.json
    gatepool probe-check --data cluttered-mnist --batch 128     # real images: Tuesday's CNN, ResNet-18

Each model (random weights, nothing downloaded, seed ``--seed``; BatchNorm in train mode) at the smallest
side from ``--size`` (default 64) up that it runs at, on ``--batch`` N(0, 1) images: per model the
rows, those with a correlated prediction, forward within 10%, backward within 15%, the worst row and its
ratio, the first row without a rule and why, whether it meets the issue's target (90% of the rows within
each bound), the seconds (:mod:`gatepool.analysis.probe.check`). Prints the Markdown table under a line
with the command, machine and versions (the docs' table is this output); ``--json`` writes the results
after every model, and a rerun with the same file skips the models it holds (``--budget`` seconds stops a
run before its next model: a long sweep in chunks). Exit 1 when
the probe failed on a model (its line says why), 2 without torchvision / timm (``make test-vision``
builds .venv-vision with both).
``--data NAME`` (a set of :func:`gatepool.data.dataset_names`) instead of N(0, 1) images: ``--batch``
training images chosen by ``--seed`` as ``gatepool probe`` takes them (a torchvision/timm model's resized
to ``--size``, three channels), forward within 15% (the issue's real-data target); ``--models`` may name
gatepool's own (default: Tuesday's CNN, ``residual_cnn_canvas`` on the 60×60 canvases, and ResNet-18).
"""

from __future__ import annotations

import argparse
import sys

from gatepool.cli.args import UsageError, int_at_least
from gatepool.cli.probe import DATA_SETS

_FIX = "make test-vision builds .venv-vision with both (or: pip install gatepool[vision])"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe-check", help="the correlated probe on torchvision's and timm's models: a table")
    p.add_argument(
        "--zoo", choices=["all", "torchvision", "timm"], default="all", help="which zoo (default all)"
    )
    p.add_argument("--models", nargs="+", default=None, help="these models instead (tv:NAME, timm:NAME)")
    p.add_argument(
        "--per-family", action="store_true", help="one torchvision model a family (timm's: always one)"
    )
    p.add_argument("--exclude", nargs="+", default=[], help="leave these models out")
    p.add_argument("--size", type=int_at_least(8), default=64,
                   help="the smallest image side tried (default 64); a model that refuses it gets the "
                        "next of 96, 128, 224, 256 it runs at")  # fmt: skip
    p.add_argument("--batch", type=int_at_least(2), default=32, help="images per model (default 32)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the weights and the images")
    p.add_argument("--json", default=None, help="also write the results here as JSON (after every model); "
                   "a rerun with the same file skips the models it holds")  # fmt: skip
    p.add_argument("--budget", type=int_at_least(1), default=None,
                   help="seconds: start no model after them (the same --json again goes on)")  # fmt: skip
    p.add_argument("--data", default="noise", choices=["noise", *DATA_SETS],
                   help="N(0, 1) images (default), or a data set's training images")  # fmt: skip
    p.set_defaults(func=_run)


def _models(args: argparse.Namespace) -> list[str]:
    from gatepool.analysis.probe.check import zoo_models

    named = args.models
    if args.data != "noise" and not named:  # Tuesday's CNN (its canvas form on 60×60) and ResNet-18
        canvas = args.data in ("translated-mnist", "cluttered-mnist", "distractor-mnist")
        named = ["residual_cnn_canvas" if canvas else "residual_cnn", "tv:resnet18"]
    if named:
        bad = [m for m in named if not m.startswith(("tv:", "timm:")) and args.data == "noise"]
        if bad:
            raise UsageError(f"--models: {bad[0]!r} is not tv:NAME or timm:NAME (gatepool models: --data)")
        libs = {"torchvision" if m.startswith("tv:") else "timm" for m in named if ":" in m}
        for lib in sorted(libs):
            _need(lib)
        models = list(named)
    else:
        zoos = ["torchvision", "timm"] if args.zoo == "all" else [args.zoo]
        models = []
        for z in zoos:
            _need(z)
            models += zoo_models(z, per_family=args.per_family)
    return [m for m in models if m not in args.exclude]


def _need(lib: str) -> None:
    import importlib

    try:
        importlib.import_module(lib)
    except ImportError:
        raise UsageError(f"probe-check needs {lib}, which is not installed here: {_FIX}") from None


def _header(args: argparse.Namespace) -> str:
    import torch

    from gatepool.utils.environment import cpu_model

    cpu = cpu_model()
    images = "N(0, 1) images" if args.data == "noise" else f"{args.data} training images"
    versions = [f"torch {torch.__version__}"]
    for lib in ("torchvision", "timm"):
        try:
            versions.append(f"{lib} {__import__(lib).__version__}")
        except ImportError:
            pass
    import os

    return (f"`{_command(args)}`: {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
            f"CPU; {', '.join(versions)}; seed {args.seed}, batch {args.batch}, {images}, "
            f"BatchNorm in train mode, unit-noise backward.")  # fmt: skip


def _command(args: argparse.Namespace) -> str:
    """The command line of this run (from the parsed arguments, so ``main([...])`` says it too)."""
    parts = ["gatepool probe-check"]
    parts += ["--models", *args.models] if args.models else [] if args.zoo == "all" else ["--zoo", args.zoo]
    parts += ["--per-family"] if args.per_family else []
    parts += ["--exclude", *args.exclude] if args.exclude else []
    parts += [] if args.size == 64 else ["--size", str(args.size)]
    parts += [] if args.data == "noise" else ["--data", args.data]
    parts += ["--batch", str(args.batch), "--seed", str(args.seed)]
    parts += ["--budget", str(args.budget)] if args.budget else []
    return " ".join(parts + (["--json", args.json] if args.json else []))


def _run(args: argparse.Namespace) -> int:
    from gatepool.analysis.probe.check import FORWARD_WITHIN, sweep, table

    models = _models(args)
    header = _header(args)

    def done(c):
        print(f"{c.model:36s} {c.with_rule:4d}/{c.modules:<4d} fwd {c.forward:4d} bwd {c.backward:4d} "
              f"{c.seconds:6.1f}s {c.error or c.no_rule}"[:200], file=sys.stderr, flush=True)  # fmt: skip

    on_data = args.data != "noise"
    check = (lambda name: _check_on_data(name, args)) if on_data else None  # None: N(0, 1) images
    try:
        checks, left = sweep(models, size=args.size, batch=args.batch, seed=args.seed, path=args.json,
                             budget=args.budget, header=header, done=done, data=args.data,
                             check=check)  # fmt: skip
    except ValueError as e:
        raise UsageError(f"--json: {e}") from None
    print(header + "\n\n" + table(checks, 0.15 if on_data else FORWARD_WITHIN))
    if left:
        print(f"\n{len(left)} models left (--budget spent): rerun with the same --json to go on",
              file=sys.stderr)  # fmt: skip
    return 1 if any(c.error for c in checks) else 0


def _check_on_data(name: str, args: argparse.Namespace):
    """``name`` (gatepool's, tv:NAME or timm:NAME; seed ``--seed``) on ``--batch`` images of ``--data``,
    forward within 15%: as ``gatepool probe --model NAME --data DATA`` measures it."""
    import time
    import warnings

    import torch

    from gatepool.analysis.convert_zoo import build
    from gatepool.analysis.probe.check import Check, check_model
    from gatepool.analysis.probe.external_models import resized_digits
    from gatepool.cli.probe import _load_inputs
    from gatepool.models import create_model

    images, _ = _load_inputs(args.data, args.batch, args.seed)  # (B, 1, H, W)
    start = time.perf_counter()
    try:
        torch.manual_seed(args.seed)
        model = build(name, args.seed) if ":" in name else create_model(name)
        x = resized_digits(images, args.size) if ":" in name else images  # (B, 3, S, S) for tv/timm
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return check_model(model, x, name, forward_within=0.15)
    except Exception as e:  # noqa: BLE001 - a model that fails is a line of the table, as check_named's
        text = str(e).splitlines()[0] if str(e) else ""
        return Check(name, seconds=time.perf_counter() - start, error=f"{type(e).__name__}: {text}")
