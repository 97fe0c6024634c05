"""``gatepool convert-check``: ``convert`` over the torchvision and timm zoos, a table of what converts.

    gatepool convert-check            # every torchvision classification model, one model per timm family
    gatepool convert-check --zoo torchvision --gates soft attention --compile
    gatepool convert-check --models tv:vgg11 timm:resnet18d --out /tmp/zoo.md

See :mod:`gatepool.analysis.convert_zoo` for the checks. Writes the Markdown page (``--out``, default
docs/convert-zoo.md) with its date, machine and versions, and ``--json`` the results (after every model,
so an interrupted run keeps what it did; ``--resume`` goes on with it); ``--merge A.json B.json`` writes
the page from several runs. ``--pooled-from SOFT.json`` runs only the models that run found with a pool
(a model with no pool has nothing to convert, whatever the gate), at the input size it found.
Exit 1 when a model is not converted fully. Needs torchvision / timm (``pip install gatepool[vision]``).
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
    p.add_argument(
        "--pooled-from",
        nargs="+",
        default=None,
        metavar="JSON",
        help="only the models these runs' --json found with a pool, at the size they found "
        "(a model with no pool has nothing to convert for any gate: named on the page)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the models the --json file holds with every gate done, run the rest",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="write the page from these runs' --json files instead of running",
    )
    p.set_defaults(func=_run)


def _machine(threads: int) -> str:
    import os
    import platform

    from gatepool.utils.environment import cpu_model

    cpu = cpu_model()
    cores = f"{os.cpu_count()} cores, {threads} torch thread"
    return f"{platform.system()} {platform.machine()}, {cpu}, {cores}, CPU"


def _run(args: argparse.Namespace) -> int:
    if args.merge:
        return _merge(args)
    gates = _gates(args.gates)
    models, excluded, sizes, no_pool = _models(args)
    meta = _meta(args, gates, excluded, no_pool)
    kept: list = []
    if args.resume:
        meta, kept = _resume(args.json, meta)
        kept = _finished(kept, models, gates, args.json)
    return _sweep(args, models, gates, meta, kept, sizes)


def _merge(args: argparse.Namespace) -> int:
    """``--merge``: the page from several runs' ``--json`` files, nothing run."""
    import datetime
    import json

    runs = []
    for path in args.merge:
        with open(path) as f:
            runs.append(json.load(f))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    _write(args.out, runs, f"Put together by `{_command(args)}` on {when}.")
    print(f"wrote {args.out} from {len(runs)} runs")
    return 0


def _gates(asked: list[str] | None) -> tuple[str, ...]:
    """``--gates``, each a gate of the gate table (default: every gate)."""
    from gatepool.layers import gate_table

    gates = tuple(asked or gate_table.names())
    bad = [g for g in gates if g not in gate_table.names()]
    if bad:
        raise UsageError(f"--gates: {bad} unknown; choose from {list(gate_table.names())}")
    return gates


def _models(args: argparse.Namespace) -> tuple[list[str], list[str], dict[str, int], list[str]]:
    """The models to run; those ``--exclude`` leaves out; from ``--pooled-from``, each model's input size
    and the models it found with no pool (not run)."""
    from gatepool.analysis import convert_zoo as zoo

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
    excluded = [m for m in args.exclude if m in models]
    models = [m for m in models if m not in args.exclude]
    sizes, no_pool = _pooled(args.pooled_from, models) if args.pooled_from else ({}, [])
    models = [m for m in models if m not in no_pool]
    return models, excluded, sizes, no_pool


def _meta(args: argparse.Namespace, gates: tuple[str, ...], excluded: list[str], no_pool: list[str]) -> dict:
    """What the page says of this run: its command, start, machine (one torch thread from here on),
    versions, and what it asked."""
    import datetime

    import torch

    torch.set_num_threads(1)
    versions = {"torch": torch.__version__}
    for lib in ("torchvision", "timm"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            pass
    began = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    meta = {
        "command": _command(args),
        "began": began,
        "machine": _machine(1),
        "versions": versions,
        "compile": args.compile,
        "gates": list(gates),
        "excluded": excluded,
    }
    if args.pooled_from:
        meta.update(pooled_from=list(args.pooled_from), no_pool=no_pool)
    return meta


def _finished(kept: list, models: list[str], gates: tuple[str, ...], path: str) -> list:
    """Of a resumed run's results, those of the models it ran with every gate (the others run again)."""
    gates_of: dict[str, set] = {}
    for r in kept:
        gates_of.setdefault(r.model, set()).add(r.gate)
    finished = {m for m, g in gates_of.items() if g >= set(gates)}
    print(
        f"resuming {path}: {len(finished)} models done, {len(set(models) - finished)} to run",
        file=sys.stderr,
    )
    return [r for r in kept if r.model in finished]


def _sweep(args: argparse.Namespace, models: list[str], gates: tuple[str, ...], meta: dict, kept: list,
           sizes: dict[str, int]) -> int:
    """Every model not kept, with every gate; the page (and ``--json``) written after each model and at
    the end. Exit 1 when a model with a pool is not converted fully."""
    import datetime
    import json

    from gatepool.analysis import convert_zoo as zoo

    done: list = list(kept)
    order = {m: i for i, m in enumerate(models)}

    def save(results, complete=False) -> dict:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        results = sorted(results, key=lambda r: order.get(r.model, len(order)))  # stable: gates in order
        run = {
            "meta": {**meta, "finished": now, "complete": complete, "planned": len(models)},
            **zoo.summary(results),
        }
        _write(args.out, [run])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(run, f, indent=1)
        return run

    def log(r):
        done.append(r)
        print(
            f"{r.model:40s} {r.gate:13s} {r.status:8s} {r.seconds:6.1f}s "
            f"{', '.join(r.left[:3]) or r.why[:120]}",
            file=sys.stderr,
            flush=True,
        )
        if r.gate == gates[-1]:
            save(done)  # after every model: an interrupted sweep leaves its table so far

    todo = [m for m in models if m not in {r.model for r in kept}]
    zoo.sweep(todo, gates, compile=args.compile, log=log, sizes=sizes)
    run = save(done, complete=True)
    print(f"{run['full']}/{run['models'] - run['no_pool']} with a pool full; wrote {args.out}")
    return 0 if not run["not_full"] else 1


def _command(args: argparse.Namespace) -> str:
    """The command line that makes this run (from the parsed arguments, so ``main([...])`` says it too)."""
    if args.merge:
        return " ".join(["gatepool convert-check --merge", *args.merge, "--out", args.out])
    parts = ["gatepool convert-check"]
    parts += ["--models", *args.models] if args.models else [] if args.zoo == "all" else ["--zoo", args.zoo]
    parts += ["--exclude", *args.exclude] if args.exclude else []
    parts += ["--gates", *args.gates] if args.gates else []
    parts += ["--compile"] if args.compile else []
    parts += ["--pooled-from", *args.pooled_from] if args.pooled_from else []
    parts += ["--out", args.out] + (["--json", args.json] if args.json else [])
    return " ".join(parts + (["--resume"] if args.resume else []))


def _pooled(paths: list[str], models: list[str]) -> tuple[dict[str, int], list[str]]:
    """From earlier runs' JSON: each model's input size, and the models of ``models`` with no pool."""
    import json

    sizes, statuses = {}, {}
    for path in paths:
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, ValueError) as e:
            raise UsageError(f"--pooled-from: cannot read {path}: {e}") from e
        for r in run["results"]:
            statuses.setdefault(r["model"], set()).add(r["status"])
            if r["size"]:
                sizes[r["model"]] = r["size"]
    return sizes, [m for m in models if statuses.get(m) == {"no pool"}]


def _resume(path: str | None, meta: dict) -> tuple[dict, list]:
    """The run in ``path`` to go on with (its meta, with this start added) and its results."""
    import json

    from gatepool.analysis import convert_zoo as zoo

    if not path:
        raise UsageError("--resume goes on with the run in --json: pass --json PATH")
    try:
        with open(path) as f:
            run = json.load(f)
    except FileNotFoundError:
        return meta, []  # nothing to resume: a fresh run
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume: cannot read {path}: {e}") from e
    old = run["meta"]
    for key in ("gates", "compile"):
        if old.get(key) != meta[key]:
            raise UsageError(
                f"--resume: {path} ran {key}={old.get(key)}, this run asks {meta[key]}: "
                f"ask the same, or write another --json"
            )
    merged = {**old, **meta, "command": old["command"], "began": old["began"]}
    merged["resumed"] = [*old.get("resumed", []), meta["began"]]
    if old["machine"] != meta["machine"] or old["versions"] != meta["versions"]:
        merged["machine"] = f"{old['machine']}; resumed on {meta['machine']}"
        merged["versions"] = {k: v if old["versions"].get(k) == v else f"{old['versions'].get(k)}, then {v}"
                              for k, v in meta["versions"].items()}  # fmt: skip
    return merged, [zoo.Result(**r) for r in run["results"]]


_INTRO = """\
What `gatepool.convert` does to every classification model of torchvision and to one model per timm
family (module): random weights, `pretrained=False`, nothing downloaded. This page is written by
`gatepool convert-check` (one run, or `--merge` of several runs' JSON); each section names its command,
machine, versions and time. For each model and gate, at the smallest input of {sizes} the original
accepts, batch 2: `convert(model, gate, global_pool=G, squeeze_pool=G, example_input=x)` (G the gate,
"soft" for "conv"); a forward and a backward in train mode (finite); a state_dict round trip into a
freshly converted copy built from another seed (the same outputs, exactly); no pool of the original left
(no torch pool module that convert did not build, and no pool function, `F.max_pool*d`, `F.avg_pool*d`,
`F.adaptive_avg_pool*d` or a mean over the spatial dims, run during a forward outside the modules convert
built, as a `TorchFunctionMode` sees them); and, in the runs with `--compile`, `torch.compile(backend=
"eager")` giving the eager output where the original compiles. A timm family is a timm module; its model
here is the smallest-sounding name in it (`convert_zoo.timm_families`).

✓ full · no pool (nothing to convert) ~ partial (what is left is named) ✗ refused or broken (why) – skipped
○ converted fully, but the original does not compile (`--compile` runs: nothing to compare with).
"""


def _write(path: str, runs: list[dict], merged: str = "") -> None:
    """The page: the intro, what each zoo's runs cover, the runs, then one table per zoo (a column per
    gate, and per gate of the ``--compile`` runs; where two runs give one cell, the later one's)."""
    from gatepool.analysis import convert_zoo as zoo
    from gatepool.layers import gate_table

    page = ["# convert() over the zoos", "", _INTRO.format(sizes=", ".join(map(str, zoo.SIZES))), ""]
    page += [merged, ""] if merged else []
    cells = [  # every result, its column its gate, or "compile GATE" in the --compile runs
        zoo.Result(**{**r, "gate": f"compile {r['gate']}" if run["meta"]["compile"] else r["gate"]})
        for run in runs
        for r in run["results"]
    ]
    columns = [g for g in gate_table.names() if any(c.gate == g for c in cells)]
    columns += sorted({c.gate for c in cells} - set(columns))
    tables = []
    for zoo_name, prefix in (("torchvision", "tv:"), ("timm", "timm:")):
        rows: dict[str, dict[str, zoo.Result]] = {}
        for c in cells:
            if c.model.startswith(prefix):
                rows.setdefault(c.model, {})[c.gate] = c  # a later run's result stands
        if not rows:
            continue
        page += [_zoo_summary(zoo_name, prefix, rows, runs, columns), ""]
        table = zoo.table([c for row in rows.values() for c in row.values()], tuple(columns))
        tables += [f"## {zoo_name}", "", table, ""]
    page += ["## The runs", ""] + [_run_line(run) for run in runs] + [""] + tables
    with open(path, "w") as f:
        f.write("\n".join(page))


def _excluded(meta: dict) -> list[str]:
    """A run's --exclude (a run from before "excluded" was kept: its command says)."""
    if "excluded" in meta or " --exclude " not in meta["command"]:
        return meta.get("excluded", [])
    return meta["command"].split(" --exclude ")[1].split(" --")[0].split()


def _zoo_summary(zoo_name: str, prefix: str, rows: dict, runs: list[dict], columns: list[str]) -> str:
    """One paragraph: how many of a zoo's models with a pool convert fully, what not (named), coverage."""
    from gatepool.analysis import convert_zoo as zoo

    statuses = {m: {c.status for c in row.values()} for m, row in rows.items()}
    with_pool = [m for m, st in statuses.items() if st != {"no pool"} and "skipped" not in st]
    full = [m for m in with_pool if statuses[m] <= zoo.CONVERTED]
    rest = [m for m in with_pool if m not in full]
    failed = {
        m: [f"{g}: {c.status}" for g, c in rows[m].items() if c.status not in zoo.CONVERTED] for m in rest
    }
    what = "models" if prefix == "tv:" else "families"
    text = (
        f"**{zoo_name}: {len(full)} of {len(with_pool)} {what} with a pool convert fully "
        f"({100 * len(full) / max(len(with_pool), 1):.0f}%)** with every gate run on them"
        + ("; not fully: " + ", ".join(f"{m} ({', '.join(failed[m])})" for m in rest) if rest else "")
        + f". {sum(st == {'no pool'} for st in statuses.values())} have no pool; "
        f"{sum('skipped' in st for st in statuses.values())} skipped."
    )
    out = sorted({m for run in runs for m in _excluded(run["meta"]) if m.startswith(prefix)} - set(rows))
    if out:
        text += f" Not run (--exclude): {', '.join(out)}."
    ran = {g: sum(g in rows[m] for m in with_pool) for g in columns}
    uncompiled = sorted(m for m in with_pool if any(c.status == "not compiled" for c in rows[m].values()))
    text += (
        f" Of the {len(with_pool)} with a pool, each gate ran on: "
        + ", ".join(f"{g} {n}" for g, n in ran.items() if n)
        + (f" (the original of {len(uncompiled)} does not compile: {', '.join(uncompiled)}; their converted "
           f"form was not compared)" if uncompiled else "")
        + "."
    )  # fmt: skip
    no_pool = [m for m, st in statuses.items() if st == {"no pool"}]
    once = [m for m in no_pool if len(rows[m]) < sum(n > 0 for n in ran.values())]
    if once:
        used = ", ".join(g for g in columns if any(g in rows[m] for m in once))
        text += (f" {'The' if len(once) == len(no_pool) else f'{len(once)} of the'} {len(no_pool)} with no "
                 f"pool ran with {used} only: a model with no pool has nothing to convert, whatever the gate "
                 f"(the runs with --pooled-from leave them out).")  # fmt: skip
    return text


def _run_line(run: dict) -> str:
    """One run: what it ran, its command, time, machine and versions, and what it left out."""
    meta = run["meta"]
    gates = tuple(meta["gates"])
    planned = meta.get("planned")
    if planned is None and " --models " in meta["command"]:  # a run from before "planned" was kept
        planned = len(meta["command"].split(" --models ")[1].split(" --")[0].split())
    zoos = sorted({r["model"].split(":")[0] for r in run["results"]})
    title = " and ".join({"tv": "torchvision", "timm": "timm"}[z] for z in zoos)
    text = (
        f"- **{title}, gate{'s' if len(gates) > 1 else ''} {', '.join(gates)}"
        + (", torch.compile" if meta["compile"] else "")
        + f"**: `{meta['command']}`, "
        + (f"{meta['began']}–{meta['finished']}" if "began" in meta else f"finished {meta['finished']}")
        + f"; {meta['machine']}; "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + f". {run['full']} of {run['models'] - run['no_pool']} models with a pool convert fully, "
        f"{run['no_pool']} have no pool"
    )
    if _excluded(meta):
        text += f"; left out (--exclude): {', '.join(_excluded(meta))}"
    if meta.get("pooled_from"):
        text += (f"; not run, as {' and '.join(meta['pooled_from'])} found them with no pool (nothing to "
                 f"convert, for any gate): {len(meta['no_pool'])} models")  # fmt: skip
    if meta.get("resumed"):
        text += f"; resumed at {', '.join(meta['resumed'])} UTC"
    text += "."
    if not (meta.get("complete") or planned is None or planned == run["models"]):
        text += f" The run was stopped after {run['models']} of its {planned} models: the others did not run."
    return text
