"""``gatepool bench NAME [--json] [--out FILE] [--quick] [--threads N] [--device D]``, NAME one of train,
pool, attention, probe, step (``step`` has options of its own: ``gatepool bench step --help``).

Never part of the test suite. Each ``gatepool/bench/<name>.py`` has ``run(quick, device) -> record`` and
``table(record) -> str``; this command sets the threads, prints the table (or the JSON record) and
saves the record atomically with ``--out``. A bench whose ``REQUIRES`` names a library that is not
installed stops with one line saying so (exit 2). torch's profiler (the benches' peak memory) logs two
``USDT … profiler_start/stop`` lines per use from its C++ side (kineto); the command sets
``KINETO_LOG_LEVEL=6`` (above kineto's USDT level 5, so its errors go too) unless one is set, so that
only the table is printed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os

from gatepool.cli.args import UsageError, add_device, device, float_in, int_at_least

BENCHES = {
    "train": "our trainer vs a pytorch/examples-style loop, and achieved FLOP/s",
    "pool": "forward+backward time of every gate vs F.max_pool2d / F.avg_pool2d",
    "attention": "time and peak memory of our SDPA vs torch's",
    "probe": "time of the correlated probe's prediction for ResNet-18, ResNet-50 and ConvNeXt-T at 64x64 and "
    "ViT-B/16 at 224 (needs torchvision)",
    "step": "a training step of torchvision's ResNet with its pools converted to each gate vs max pool "
    "(needs torchvision)",
}
STEP_HELP = """A training step (bf16 autocast, channels_last, SGD with momentum) of torchvision's ResNet with
its stem's max pool converted to each gate, against the same net with max pool, eager and (--compile)
through torch.compile: median of --steps interleaved steps after --warmup, ratios to the max-pool net.
Defaults on CUDA: resnet50 at 224, batch 128, 20 steps, eager and compiled. Elsewhere: resnet18 at 112,
batch 16, 10 steps, eager only, about a minute on two CPU cores: ResNet-18 has ResNet-50's stem (its
pool sees the same (B, 64, 56, 56) map) at 2.3x less of the rest, and torch.compile of a ResNet takes
minutes on a CPU (ask for it with --compile; --budget bounds it)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCHES))
    bsub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, help_ in BENCHES.items():
        bp = bsub.add_parser(name, help=help_, description=STEP_HELP if name == "step" else None)
        bp.add_argument("--json", action="store_true", help="print the result record as JSON")
        bp.add_argument("--out", default=None, help="also save the JSON record to this file")
        bp.add_argument("--quick", action="store_true", help="fewer steps and repeats (a smoke run)")
        bp.add_argument(
            "--threads", type=int_at_least(1), default=None, help="torch threads (default: all cores)"
        )
        add_device(bp)
        if name == "train":
            bp.add_argument("--compile", action="store_true",
                            help="add a row: the trainer's loop through torch.compile")  # fmt: skip
        if name == "pool":
            bp.add_argument("--cases", type=_names, default=None,
                            help="comma-separated cases to measure (default: all of the device's; "
                            "tiny-tiled,tiny-overlapping: the per-call cost alone)")  # fmt: skip
        if name == "probe":
            bp.add_argument("--cases", type=_names, default=None,
                            help="comma-separated cases to measure (default: all; resnet18-noise, "
                            "resnet18-mnist, resnet50, vit_b_16, convnext_tiny)")  # fmt: skip
        if name == "step":
            _step_arguments(bp)
        bp.set_defaults(func=_run)


def _step_arguments(bp: argparse.ArgumentParser) -> None:
    """``gatepool bench step``'s own options (each default: the device's, gatepool.lab.bench.step)."""
    bp.add_argument("--model", default=None, help="torchvision model (default: resnet50 cuda, resnet18)")
    bp.add_argument("--size", type=int_at_least(8), default=None, help="image size (default: 224 cuda, 112)")
    bp.add_argument("--batch", type=int_at_least(1), default=None, help="batch (default: 128 cuda, 16)")
    bp.add_argument("--steps", type=int_at_least(1), default=None, help="timed steps (default: 20 cuda, 10)")
    bp.add_argument("--warmup", type=int_at_least(1), default=None, help="warm-up steps (default: 3 cuda, 2)")
    bp.add_argument("--gates", type=_gates, default=None,
                    help="comma-separated gates to convert to (default: every gate but max)")  # fmt: skip
    bp.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="also time each net through torch.compile (default: on cuda only)")  # fmt: skip
    bp.add_argument("--budget", type=float_in(0), default=None,
                    help="seconds after which no net starts its warm-up (compile); the rest are "
                    "listed as skipped (default 300)")  # fmt: skip


def _names(text: str) -> tuple[str, ...]:
    """``a,b``: the names, each checked where it is used."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _gates(text: str) -> tuple[str, ...]:
    """``--gates soft,attention``: names among gatepool.layers.GATES."""
    from gatepool.layers import GATES

    gates = _names(text)
    if any(g not in GATES for g in gates):
        raise argparse.ArgumentTypeError(f"expected gates among {', '.join(GATES)}, got {text!r}")
    return gates


def _run(args: argparse.Namespace) -> int:
    """Each bench module has ``run(quick, device) -> record`` and ``table(record) -> str``."""

    from gatepool.utils.io import atomic_write_json
    from gatepool.utils.threads import num_threads

    if args.out is not None and os.path.isdir(args.out):
        raise UsageError(f"--out {args.out}: is a folder; give a file name for the JSON record")
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # read once, at the first profiler use: set it before
    where = device(args)
    module = importlib.import_module(f"gatepool.lab.bench.{args.bench}")
    missing = [lib for lib in getattr(module, "REQUIRES", ()) if importlib.util.find_spec(lib) is None]
    if missing:
        raise UsageError(f"bench {args.bench} needs {', '.join(missing)}, which is not installed: "
                         "pip install gatepool[vision] (make test-vision's .venv-vision has it)")  # fmt: skip
    with num_threads(args.threads):
        try:
            record = module.run(quick=args.quick, device=where, **_extra(args))
        except ValueError as e:  # step and pool check their options (model, cases) before they measure
            if args.bench not in ("step", "pool", "probe"):
                raise
            raise UsageError(str(e)) from None
    print(json.dumps(record, indent=2, ensure_ascii=False) if args.json else module.table(record))
    if args.out:
        atomic_write_json(args.out, record)
    return 0


def _extra(args: argparse.Namespace) -> dict:
    """The bench's own options that were given, as ``run``'s keyword arguments."""
    if args.bench == "train":
        return {"compile": True} if args.compile else {}
    if args.bench in ("pool", "probe"):
        return {"cases": args.cases} if args.cases else {}
    if args.bench == "step":
        names = ("model", "size", "batch", "steps", "warmup", "gates", "compile", "budget")
        return {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    return {}
