"""The ``gatepool`` command: one sub-command per file in this folder.

Each file ``gatepool/cli/<name>.py`` has ``register(subparsers)``, which adds its parser(s) and sets
``func`` (called with the parsed arguments, returns the exit code). Heavy imports happen inside
``func`` so that ``gatepool --help`` stays instant.

Exit status: 0 done; 1 a claim off (``--strict``), an experiment broke, or a data file missing or
corrupt; 2 the command refused, in one line on stderr and without a traceback: a bad argument (it
names the argument and what it accepts), a run folder in use by another run (it names the holder), or
a full disk (it names the file, which keeps its previous content); 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gatepool import __version__
from gatepool.utils.lock import LockHeld


class UsageError(Exception):
    """Bad input the user can fix: :func:`main` prints ``gatepool CMD: error: MESSAGE`` and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, ``gatepool train: error: argument --epochs: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    return parse


def float_in(low: float, high: float = math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[low, high)`` (``(low, high)`` with ``low_open``)."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g})"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if low_open else value >= low) and value < high):
            raise argparse.ArgumentTypeError(f"must be a finite number in {interval}, got {text!r}")
        return value

    return parse


def out_folder(path: str | Path, flag: str = "--out") -> Path:
    """``path`` checked as a folder to write (made later, by the run): else a UsageError naming ``flag``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder; give a folder (it is created if missing)")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, so this folder cannot be made; give another")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {parent} is not writable by this user; give another folder")
    return path


# Order here is the order in `gatepool --help`.
COMMAND_MODULES = ["experiments", "train", "probe", "data", "bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
