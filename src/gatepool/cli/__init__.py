"""The ``gatepool`` command: one sub-command per file in this folder.

Each file ``gatepool/cli/<name>.py`` has ``register(subparsers)``, which adds its parser(s) and sets
``func`` (called with the parsed arguments, returns the exit code). Heavy imports happen inside
``func`` so that ``gatepool --help`` stays instant.

Exit status: 0 done; 1 a claim off (``--strict``), an experiment broke, or a data file missing or
corrupt; 2 the command refused, in one line on stderr and without a traceback: a bad argument (it
names the argument and what it accepts; ``--device cuda`` where there is none, ``--amp fp16`` off
CUDA), a run folder in use by another run (it names the holder), or
a full disk (it names the file, which keeps its previous content); 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from gatepool import __version__
from gatepool.cli.args import Parser, UsageError
from gatepool.utils.lock import LockHeld

COMMAND_MODULES = ["experiments", "report", "train", "sweep", "probe", "data", "bench", "pretrained",
                   "convert_check", "probe_check"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    prog = f"gatepool {args.command}"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted; finished work is saved, run the same command again to resume", file=sys.stderr)
        return 130
    except (UsageError, LockHeld) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise
        from gatepool.utils.io import DiskFullError

        if not isinstance(e, DiskFullError):  # a write outside the atomic writers (a figure, say)
            e = f"{e.filename or 'a write'}: the disk is full ({e.strerror}); free some space and run again"
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
