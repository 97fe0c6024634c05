"""``gatepool data info|fetch|generate``: where the data sets were found, downloading and generating them."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="data sets: info, fetch, generate")
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    pi = dsub.add_parser("info", help="print what was found where, verified or not")
    pi.add_argument(
        "--data-dir", default=None, help="use only this folder's files, or DIR/NAME/ (also: GATEPOOL_DATA)"
    )
    pi.add_argument("--json", action="store_true")
    pi.set_defaults(func=_info)
    pf = dsub.add_parser("fetch", help="download into the user cache and verify")
    pf.add_argument("name", choices=["mnist", "fashion-mnist"])
    pf.add_argument("--dest", default=None, help="folder to write to (default ~/.cache/gatepool/NAME)")
    pf.set_defaults(func=_fetch)
    pg = dsub.add_parser("generate", help="make a generated set now (else on first use)")
    pg.add_argument("name", choices=["translated-mnist", "cluttered-mnist", "distractor-mnist",
                                     "rotated-mnist"])
    pg.add_argument("--data-dir", default=None, help="keep it in DIR/NAME/ (default: the cache)")
    pg.add_argument("--force", action="store_true", help="make it again even if a good copy is there")
    pg.set_defaults(func=_generate)


def _info(args: argparse.Namespace) -> int:
    from gatepool.data import info, search_roots  # lazy: `gatepool --help` must not import torch

    rows = info(args.data_dir)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("search order: " + " -> ".join(f"{rule}:{root}" for rule, root in search_roots(args.data_dir)))
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        if mine[0]["folder"] is None:
            error = mine[0]["error"]
            print(error if error.startswith(name) else f"{name}: {error}")
            continue
        recipe = f" — {mine[0]['recipe']}" if mine[0].get("recipe") else ""
        if recipe and all(r["path"] is None for r in mine):  # a generated set not made yet: one line
            print(f"{name}: {mine[0]['error']}{recipe}")
            continue
        print(f"{name}: loaded from {mine[0]['folder']} ({mine[0]['rule']}){recipe}")
        for r in mine:
            state = "verified" if r["verified"] else (r["error"] or "not verified")
            print(f"  {r['file']:<25} {state}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from gatepool.cli.args import out_folder
    from gatepool.data import DataError, fetch  # lazy: `gatepool --help` must not import torch

    if args.dest is not None:
        out_folder(args.dest, "--dest")
    try:
        folder = fetch(args.name, args.dest)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.name}: verified copy in {folder}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from gatepool.data import DataError, generate, load  # lazy: `gatepool --help` must not import torch

    try:
        folder = generate(args.name, args.data_dir, force=args.force)
        for split in ("train", "test"):
            load(args.name, split, args.data_dir)  # verifies every file against the manifest
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.name}: verified copy in {folder}")
    return 0
