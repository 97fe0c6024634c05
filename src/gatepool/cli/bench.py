"""``gatepool bench train|pool|attention [--json]``: benchmarks (never part of the test suite)."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "train": "our trainer vs a pytorch/examples-style loop, and achieved FLOP/s",
    "pool": "forward+backward time of every gate vs F.max_pool2d / F.avg_pool2d",
    "attention": "time and peak memory of our SDPA vs torch's",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCHES))
    bsub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, help_ in BENCHES.items():
        bp = bsub.add_parser(name, help=help_)
        bp.add_argument("--json", action="store_true", help="print the result record as JSON")
        bp.add_argument("--out", default=None, help="also save the JSON record to this file")
        bp.add_argument("--quick", action="store_true", help="fewer steps and repeats (a smoke run)")
        bp.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
        bp.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"gatepool.bench.{args.bench}")
    return module.main(args)
