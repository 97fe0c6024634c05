"""The ``gatepool`` command: one sub-command per file in this folder.

Each file ``gatepool/cli/<name>.py`` has ``register(subparsers)``, which adds its parser(s) and sets
``func`` (called with the parsed arguments, returns the exit code). Heavy imports happen inside
``func`` so that ``gatepool --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gatepool import __version__

# Order here is the order in `gatepool --help`.
COMMAND_MODULES = ["experiments", "train", "probe", "data", "bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gatepool",
        description="Pooling is a gate: gated pooling, attention, probes, and the lecture reproduced.",
    )
    parser.add_argument("--version", action="version", version=f"gatepool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"gatepool.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return 0
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted; finished work is saved, run the same command again to resume", file=sys.stderr)
        return 130
