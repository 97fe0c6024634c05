"""``gatepool sweep GRID.toml``: a grid of trainings (gates × seeds × data sets × settings), one table.

    gatepool sweep grid.toml --out runs/my-grid                 # this machine's worker processes
    gatepool sweep grid.toml --executor ray --address auto      # one Ray task per training

The grid file's keys are in :mod:`gatepool.train.grid`. Writes ``OUT/results.csv``, ``OUT/results.json``
and ``OUT/accuracy.png`` (mean test accuracy per gate, 95% interval over seeds), and every training's
folder below OUT. Running it again skips finished trainings and resumes started ones. Exit status 1 when
a training failed (after its retries): its row says why.
"""

from __future__ import annotations

import argparse
import sys

from gatepool.cli.args import (
    UsageError,
    add_device,
    add_executor,
    executor,
    int_at_least,
    out_folder,
    task_device,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="train a grid of gates × seeds × data sets × settings (resumable)")
    p.add_argument("grid", help="the grid file (.toml or .json; see `gatepool.train.grid`)")
    p.add_argument("--out", default=None,
                   help="results folder (default: the grid's out, else runs/sweep-NAME)")
    p.add_argument("--jobs", type=int_at_least(1), default=None,
                   help="with --executor local: worker processes (default: one per core, at most 4)")
    add_device(p, ray=True)
    add_executor(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--wait", action="store_true", help="if another run writes to --out, wait for it to end")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gatepool.train.grid import load_grid, run_grid
    from gatepool.train.sweep import default_jobs
    from gatepool.utils.lock import RunLock

    try:
        grid = load_grid(args.grid)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.jobs is not None and args.executor != "local":
        raise UsageError("--jobs is for --executor local; with ray, --cpus-per-task sets a training's share")
    out = out_folder(args.out or grid.out or f"runs/sweep-{Path(args.grid).stem}")
    runner = executor(args)
    where = task_device(args, runner)  # with Ray: resolved in each task, where it runs
    jobs = args.jobs or (1 if runner else default_jobs(where))  # Ray: a task per training, no jobs
    with RunLock(out, wait=args.wait):
        result = run_grid(grid, out, jobs=jobs, executor=runner, device=where, progress=not args.quiet)
    failed = [r for r in result["rows"] if r["status"] != "ok"]
    if not args.quiet:
        for s in result["summary"]:
            settings = " ".join(f"{k}={v}" for k, v in s["settings"].items())
            ci = "" if s["n"] < 2 else f" ± {100 * s['test_acc_ci95']:.2f}"
            acc = "-" if s["n"] == 0 else f"{100 * s['test_acc_mean']:.2f}{ci} %"  # no seed finished
            print(f"{s['dataset']:<14} {s['gate']:<13} {settings} test accuracy {acc} (n={s['n']})")
        print(f"wrote {out}/results.csv, results.json, accuracy.png")
    for r in failed:
        print(f"failed: {r['out']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0
