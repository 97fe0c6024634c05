"""``gatepool convert-check``: ``convert`` over the torchvision and timm zoos, a table of what converts.

    gatepool convert-check            # every torchvision classification model, one model per timm family
    gatepool convert-check --zoo torchvision --gates soft attention --compile
    gatepool convert-check --models tv:vgg11 timm:resnet18d --out /tmp/zoo.md

See :mod:`gatepool.analysis.convert_zoo` for the checks. Writes the Markdown page (``--out``, default
docs/convert-zoo.md) with its date, machine and versions, and ``--json`` the results. Exit 1 when a model
is not converted fully. Needs torchvision / timm (``pip install gatepool[vision]``).
"""

from __future__ import annotations

import argparse
import sys

from gatepool.cli.args import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert-check", help="convert() on every torchvision model and timm family: a table")
    p.add_argument(
        "--zoo", choices=["all", "torchvision", "timm"], default="all", help="which zoo (default all)"
    )
    p.add_argument("--models", nargs="+", default=None, help="these models instead (tv:NAME, timm:NAME)")
    p.add_argument("--exclude", nargs="+", default=[], help="leave these models out (named on the page)")
    p.add_argument("--gates", nargs="+", default=None, help="the gates to try (default: every gate)")
    p.add_argument("--compile", action="store_true", help="also torch.compile each (slow)")
    p.add_argument(
        "--out", default="docs/convert-zoo.md", help="the Markdown page (default docs/convert-zoo.md)"
    )
    p.add_argument("--json", default=None, help="also write the results here as JSON")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import datetime
    import json
    import platform

    import torch

    from gatepool.analysis import convert_zoo as zoo
    from gatepool.layers.gated_pool import GATES

    gates = tuple(args.gates or GATES)
    bad = [g for g in gates if g not in GATES]
    if bad:
        raise UsageError(f"--gates: {bad} unknown; choose from {list(GATES)}")
    try:
        if args.models:
            models = args.models
        else:
            models = (zoo.torchvision_models() if args.zoo in ("all", "torchvision") else []) + (
                zoo.timm_families() if args.zoo in ("all", "timm") else []
            )
    except ImportError as e:
        raise UsageError(
            f"convert-check needs torchvision and timm (pip install gatepool[vision]): {e}"
        ) from e
    models = [m for m in models if m not in args.exclude]
    torch.set_num_threads(1)

    versions = {"torch": torch.__version__}
    for lib in ("torchvision", "timm"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            pass
    machine = f"{platform.machine()}, {platform.system()}, {torch.get_num_threads()} thread, CPU"
    done: list = []

    def write_page(results) -> dict:
        s = zoo.summary(results)
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        page = [
            "# convert() over the zoos",
            "",
            f"Made by `gatepool convert-check {' '.join(sys.argv[2:])}`".rstrip()
            + f" on {when}; {machine}; "
            + ", ".join(f"{k} {v}" for k, v in versions.items())
            + ". Random weights, batch 2, the smallest "
            f"input of {list(zoo.SIZES)} the original accepts. For each gate: convert (global_pool and "
            "squeeze_pool the same gate, 'soft' for 'conv'), forward and backward in train mode, a "
            "state_dict "
            "round trip into a fresh converted copy, and no pool of the original left (modules, or pool "
            "functions run outside convert's modules)"
            + (", torch.compile where the original compiles" if args.compile else "")
            + ".",
            "",
            f"**{s['full']} of {s['models'] - s['no_pool']} models with a pool convert fully with every gate "
            f"tried** ({s['no_pool']} have no pool). ✓ full, · no pool, ~ partial (what is left is named), "
            "✗ refused or broken (why), – skipped.",
            "",
            zoo.table(results, gates),
            "",
        ]
        with open(args.out, "w") as f:
            f.write("\n".join(page))
        s["meta"] = {"command": "gatepool convert-check " + " ".join(sys.argv[2:]), "finished": when,
                     "machine": machine, "versions": versions, "compile": args.compile, "gates": gates}
        return s

    def log(r):
        done.append(r)
        print(
            f"{r.model:40s} {r.gate:13s} {r.status:8s} {r.seconds:6.1f}s "
            f"{', '.join(r.left[:3]) or r.why[:120]}",
            file=sys.stderr,
            flush=True,
        )
        if r.gate == gates[-1]:
            s = write_page(done)  # after every model: an interrupted sweep leaves its table so far
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(s, f, indent=1)

    results = zoo.sweep(models, gates, compile=args.compile, log=log)
    s = write_page(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=1)
    print(f"{s['full']}/{s['models'] - s['no_pool']} with a pool full; wrote {args.out}")
    return 0 if not s["not_full"] else 1
