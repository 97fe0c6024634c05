"""``gatepool report RUN_DIR | compare A B``: rebuild a run's pages; two runs' claims side by side.

``gatepool report RUN_DIR`` rewrites ``report.html`` and ``report.md`` from ``RUN_DIR/results.json`` and
the figures beside it, running nothing; ``--only NAME ...`` puts only those experiments on the pages.
``gatepool compare A B [--out FILE]`` prints both runs' claims side by side (A and B: run folders or their
results.json) and, with ``--out``, writes the same as a page.
"""

from __future__ import annotations

import argparse

from gatepool.cli.args import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="rebuild report.html and report.md from RUN_DIR/results.json")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `gatepool reproduce`")
    p.add_argument("--wait", action="store_true", help="if a run writes to RUN_DIR, wait for it to end")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="the pages show only these experiments (e.g. a `reproduce --beyond --only "
                   "gate-matters` run without the lecture's not-run claims); results.json is kept whole")
    p.set_defaults(func=_report)

    p = sub.add_parser("compare", help="two runs' claims side by side, with what changed")
    p.add_argument("a", metavar="A", help="a run folder (or its results.json)")
    p.add_argument("b", metavar="B", help="another run folder (or its results.json)")
    p.add_argument("--out", default=None, metavar="FILE", help="also write the comparison as a page (html)")
    p.set_defaults(func=_compare)


def _report(args: argparse.Namespace) -> int:
    from gatepool.lab.report import headline, write_pages
    from gatepool.lab.report.compare import load_run
    from gatepool.utils.lock import RunLock

    try:
        meta, records, file = load_run(args.run_dir)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.only:
        names = [r["name"] for r in records]
        unknown = [n for n in args.only if n not in names]
        if unknown:
            raise UsageError(f"--only: {', '.join(unknown)} not in {file}; it has {', '.join(names)}")
        records = [r for r in records if r["name"] in args.only]
    with RunLock(file.parent, wait=args.wait):
        paths = write_pages(file.parent, records, meta)
    print(headline(records, meta))
    print(f"report: {paths['markdown']}  {paths['html']}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gatepool.lab.report.compare import compare_page, compare_rows, compare_text, load_run
    from gatepool.utils.io import atomic_write_text

    if args.out is not None and Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: is a folder; give a file name (e.g. compare.html)")
    try:
        (meta_a, rec_a, _), (meta_b, rec_b, _) = load_run(args.a), load_run(args.b)
    except ValueError as e:
        raise UsageError(str(e)) from None
    rows = compare_rows(rec_a, rec_b)
    print(compare_text(rows, meta_a, meta_b, args.a, args.b))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        print(f"page: {atomic_write_text(args.out, compare_page(rows, meta_a, meta_b, args.a, args.b))}")
    return 0
