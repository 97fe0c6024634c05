"""``gatepool list | run NAME | reproduce``: the lecture's experiments and the report.

``gatepool run NAME --KEY VALUE`` is shorthand for ``--set KEY=VALUE`` (e.g. ``gatepool run seq-demo
--arch decoder``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
    p = sub.add_parser("list", help="list the experiments and their claims")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_list)

    # allow_abbrev=False: `--KEY VALUE` is a setting, never taken for a flag it abbreviates (--d: --device)
    p = sub.add_parser("run", help="run one experiment (`gatepool list` names them)", allow_abbrev=False)
    p.add_argument("name")
    _common(p)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one setting of the setup (repeatable); lists are comma-separated",
    )
    p.add_argument("--seed", type=int_at_least(0), default=None)
    p.add_argument(
        "--out",
        default="runs/experiments",
        help="results go to OUT/NAME/ (default %(default)s); one run at a time per OUT",
    )
    p.add_argument("--json", action="store_true", help="print the result record as JSON on stdout")
    p.set_defaults(func=_run, accepts_extra=True)

    p = sub.add_parser("reproduce", help="run every experiment (resumable) and write the report")
    _common(p)
    p.add_argument(
        "--out", default=None, help="folder for results and report (default runs/reproduce-PROFILE)"
    )
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only these experiments")
    p.add_argument("--force", action="store_true", help="rerun experiments that are already complete")
    p.add_argument("--strict", action="store_true", help="exit 1 if any claim is off "
                   "(findings beyond the lecture, source 'beyond', do not count)")
    p.add_argument(
        "--beyond", action="store_true", help="also run the experiments beyond the lecture (gate-matters)"
    )
    p.set_defaults(func=_reproduce)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        choices=["quick", "full"],
        default="quick",
        help="quick: minutes on a laptop CPU, widened tolerances; full: the lecture's setup",
    )
    p.add_argument(
        "--jobs",
        type=int_at_least(1),
        default=None,
        help="parallel worker processes for independent trainings, 1 torch thread each "
        "(default: one per core, at most 4; 1 on a GPU)",
    )
    add_device(p, ray=True)
    add_executor(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--wait", action="store_true", help="if another run writes to --out, wait for it to end")


def _list(args: argparse.Namespace) -> int:
    from gatepool.lab.harness import registry

    reg = registry()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": n,
                        "title": e.title,
                        "setup": e.setup,
                        "quick": e.quick,
                        "claims": [c.id for c in e.claims(e.setup)],
                    }
                    for n, e in reg.items()
                ],
                indent=2,
                default=str,
            )
        )
        return 0
    for name, exp in reg.items():
        ids = [c.id for c in exp.claims(exp.setup)]
        print(f"{name:<18} {exp.title}{'  [beyond: reproduce --beyond]' if exp.beyond else ''}")
        print(f"{'':<18} claims: {', '.join(ids)}")
    return 0


def _extra_to_sets(extra: list[str]) -> list[str]:
    """``["--arch", "decoder", "--d=4"]`` -> ``["arch=decoder", "d=4"]``."""
    sets, i = [], 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--") or len(tok) < 3:
            raise ValueError(f"unexpected argument {tok!r}; use --set KEY=VALUE")
        if "=" in tok:
            sets.append(tok[2:])
            i += 1
        elif i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            sets.append(f"{tok[2:]}={extra[i + 1]}")
            i += 2
        else:
            sets.append(f"{tok[2:]}=true")
            i += 1
    return sets


def _run(args: argparse.Namespace) -> int:
    # lazy: `gatepool --help` must not import torch
    from gatepool.lab.harness import get, parse_sets, run_experiment
    from gatepool.lab.report import table
    from gatepool.train.sweep import default_jobs
    from gatepool.utils.lock import RunLock

    try:  # everything the arguments decide, checked before anything is written
        overrides = parse_sets(args.set + _extra_to_sets(args.extra))
        get(args.name).resolve_setup(args.profile, overrides, args.seed)
    except ValueError as e:
        raise UsageError(str(e)) from None
    runner = executor(args)
    where = task_device(args, runner)  # with Ray: resolved in each task, where it runs
    sink = sys.stderr if args.json else sys.stdout
    with RunLock(out_folder(args.out), wait=args.wait), contextlib.redirect_stdout(sink):
        rec = run_experiment(
            args.name,
            profile=args.profile,
            overrides=overrides,
            seed=args.seed,
            out=args.out,
            jobs=args.jobs or (1 if runner else default_jobs(where)),
            progress=not args.quiet,
            device=where,
            executor=runner,
        )
    if args.json:
        print(json.dumps(rec, indent=2, ensure_ascii=False))
    else:
        print(table([rec]))
        print(f"\n{rec['status']} in {rec['seconds']:.1f} s; record: {args.out}/{args.name}/result.json")
    return 0 if rec["status"] == "complete" else 1


def _reproduce(args: argparse.Namespace) -> int:
    from gatepool.lab.reproduce import reproduce
    from gatepool.train.sweep import default_jobs

    out = out_folder(args.out or f"runs/reproduce-{args.profile}")
    runner = executor(args)
    where = task_device(args, runner)  # with Ray: resolved in each task, where it runs
    try:
        records, _ = reproduce(
            profile=args.profile,
            out=out,
            only=args.only,
            force=args.force,
            jobs=args.jobs or (1 if runner else default_jobs(where)),
            progress=not args.quiet,
            wait=args.wait,
            device=where,
            executor=runner,
            beyond=args.beyond,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    broken = [r["name"] for r in records if r.get("status") == "error"]
    if broken:
        print(f"experiments that broke: {', '.join(broken)}", file=sys.stderr)
        return 1
    # --strict: a claim off fails the run, except a "beyond" one, a finding about the question it asks
    off = [c for r in records for c in r.get("claims", [])
           if c["verdict"] == "off" and c.get("source") != "beyond"]  # fmt: skip
    return 1 if (args.strict and off) else 0
