"""What every sub-command's arguments share: the one-line usage error, argparse types with ranges,
the check of an output folder, ``--device`` (``--amp``) and ``--executor`` (``--address``, ...)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gatepool.utils.checks import check_int, check_number
from gatepool.utils.environment import check_device  # no torch: `gatepool --help` stays instant


class UsageError(Exception):
    """Bad input the user can fix: :func:`main` prints ``gatepool CMD: error: MESSAGE`` and exits 2."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, ``gatepool train: error: argument --epochs: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _argument(check: Callable[..., Any], text: str, kind: type, *bounds: Any, **options: Any) -> Any:
    """``check(kind(text), ...)`` from :mod:`gatepool.utils.checks`, its error as argparse's: the text not
    a ``kind`` is passed as is, so the check refuses it ("argument --epochs: must be an integer >= 1,
    got 'two'")."""
    try:
        value = kind(text)
    except ValueError:
        value = text
    try:
        return check(value, "", *bounds, **options)  # no name: argparse puts the flag in front
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).strip()) from None


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``."""
    return lambda text: _argument(check_int, text, int, low)


def float_in(low: float, high: float = math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[low, high)`` (``(low, high)`` with ``low_open``)."""
    return lambda text: _argument(check_number, text, float, low, high, low_open=low_open, high_open=True)


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


def add_device(
    parser: argparse.ArgumentParser, *, default: str | None = "auto", amp: bool = False, ray: bool = False
) -> None:
    """``--device auto|cpu|cuda|cuda:N|mps`` (and with ``amp``, ``--amp bf16|fp16``) on ``parser``;
    ``ray``: the command also has ``--executor`` (:func:`add_executor`), and the help says what Ray does.

    The flag's type checks the spelling; :func:`device` checks that the device is there.
    """
    ray_help = ("; with --executor ray each task resolves it where it runs (cuda: one GPU per task unless "
                "--gpus-per-task says otherwise; cuda:N is refused)")
    parser.add_argument(
        "--device",
        type=_device_name,
        default=default,
        metavar="DEVICE",
        help="auto (CUDA when present, else MPS, else the CPU; the default), cpu, cuda, cuda:N or mps"
        + (ray_help if ray else ""),
    )
    if amp:
        parser.add_argument(
            "--amp",
            choices=["bf16", "fp16"],
            default=None,
            help="mixed precision: autocast to bfloat16 (CUDA or CPU) or float16 (CUDA, with a GradScaler)",
        )


def _device_name(text: str) -> str:
    try:
        return check_device(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda, cuda:N or mps, got {text!r}") from None


def device(args: argparse.Namespace):
    """``args.device`` as a ``torch.device`` (imports torch); one not here is a UsageError naming --device."""
    from gatepool.utils.environment import resolve_device

    try:
        return resolve_device(args.device)
    except ValueError as e:
        raise UsageError(f"--device {args.device}: {e}") from None


def task_device(args: argparse.Namespace, runner: Any) -> str:
    """The device name the trainings get from ``runner`` (:func:`executor`'s), by the library's one rule
    (:func:`gatepool.train.sweep.device_for`): the local pool gets ``--device`` resolved here (a
    UsageError naming --device if it is not here); Ray gets the name as given (``auto``, ``cpu``,
    ``cuda``), which each task resolves where it runs (:func:`executor` has checked it)."""
    from gatepool.train.sweep import device_for

    try:
        return device_for(args.device, runner)[0]
    except ValueError as e:
        raise UsageError(f"--device {args.device}: {e}") from None


def add_executor(parser: argparse.ArgumentParser) -> None:
    """``--executor local|ray``, and for Ray: ``--address``, ``--cpus-per-task``, ``--gpus-per-task``,
    ``--retries`` (beside ``add_device(parser, ray=True)``). No experiment setting's name may start one of
    them (``gatepool run NAME --KEY V``: argparse would take ``--task`` for a prefix of ``--task-cpus``).
    """
    parser.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="where the trainings of a sweep run: local (this machine's worker processes, --jobs; the "
        "default) or ray (one Ray task each; needs pip install 'gatepool[ray]')",
    )
    ray = "with --executor ray:"
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help=f"{ray} the cluster (host:6379, ray://host:10001 or auto); default: a local Ray")
    parser.add_argument("--cpus-per-task", type=float_in(0), default=None, metavar="N",
                        help=f"{ray} CPUs (= torch threads) per training (default 1)")
    parser.add_argument("--gpus-per-task", type=float_in(0), default=None, metavar="N",
                        help=f"{ray} GPUs per training, fractions allowed (default 1 with --device cuda, "
                        "else 0; 0 with --device cuda is refused)")
    parser.add_argument("--retries", type=int_at_least(0), default=None, metavar="N",
                        help=f"{ray} how often a failed training runs again (default 2)")


def executor(args: argparse.Namespace):
    """The executor ``args`` ask for: None (local) or a RayExecutor; a UsageError naming the flag at fault."""
    given = {flag: v for flag, v in (("--address", args.address), ("--cpus-per-task", args.cpus_per_task),
                                     ("--gpus-per-task", args.gpus_per_task), ("--retries", args.retries))
             if v is not None}  # fmt: skip
    if args.executor == "local":
        if given:
            raise UsageError(f"{next(iter(given))} needs --executor ray")
        return None
    from gatepool.train.sweep import RayExecutor, import_ray

    try:
        import_ray()
    except ImportError:
        raise UsageError("--executor ray needs Ray (not installed): pip install 'gatepool[ray]'") from None
    cuda = str(getattr(args, "device", "auto")).startswith("cuda")
    if cuda and ":" in args.device:
        raise UsageError(f"--device {args.device} with --executor ray: a Ray task sees only the GPUs it "
                         "reserved, numbered from 0; use --device cuda (or auto)")  # fmt: skip
    if cuda and args.gpus_per_task == 0:
        raise UsageError(f"--device {args.device} with --gpus-per-task 0: Ray hides every GPU from a task "
                         "that reserved none; give --gpus-per-task > 0 (the default is 1) or --device "
                         "auto/cpu")  # fmt: skip
    cpus = 1.0 if args.cpus_per_task is None else args.cpus_per_task
    gpus = args.gpus_per_task if args.gpus_per_task is not None else (1.0 if cuda else 0.0)
    try:
        runner = RayExecutor(address=args.address, num_cpus=cpus, num_gpus=gpus,
                             retries=2 if args.retries is None else args.retries)
    except ValueError as e:
        raise UsageError(f"--cpus-per-task/--gpus-per-task: {e}") from None
    try:
        runner.start()  # here, so that a bad --address is one line, not a traceback mid-run
    except (OSError, RuntimeError, ValueError) as e:  # ConnectionError is an OSError
        where = f"--address {args.address}" if args.address is not None else "a local Ray instance"
        raise UsageError(f"{where}: cannot start or reach Ray ({type(e).__name__}: {e})") from None
    return runner


# Order here is the order in `gatepool --help`.
