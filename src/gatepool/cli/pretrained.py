"""``gatepool pretrained build|list``: train the shipped lecture models; show their cards."""

from __future__ import annotations

import argparse
import json
import sys

from gatepool.cli.args import UsageError, int_at_least, out_folder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrained", help="the shipped lecture models: list their cards, build them")
    psub = p.add_subparsers(dest="pretrained_command", metavar="ACTION", required=True)
    pl = psub.add_parser("list", help="one line per shipped model (name, model, data, epochs, test accuracy)")
    pl.add_argument("--json", action="store_true", help="the cards as JSON")
    pl.set_defaults(func=_list)
    pb = psub.add_parser("build", help="train every shipped model with the full profile's setup (resumable) "
                         "and write the weights and cards into the package")  # fmt: skip
    pb.add_argument("--out", default="runs/pretrained",
                    help="folder of the trainings (default runs/pretrained)")
    pb.add_argument("--dest", default=None, help="where the weights and cards go (default: the package's "
                    "gatepool/models/pretrained/)")  # fmt: skip
    pb.add_argument("--jobs", type=int_at_least(1), default=2, help="one-thread worker processes (default 2)")
    pb.add_argument("--only", default=None, help="comma-separated names: build only these")
    pb.set_defaults(func=_build)


def _list(args: argparse.Namespace) -> int:
    from gatepool.models.pretrained import BUILD_COMMAND, PRETRAINED_DIR, cards

    every = cards()
    if args.json:
        print(json.dumps(list(every.values()), indent=2))
        return 0
    if not every:
        print(f"no shipped models in {PRETRAINED_DIR}; build them with `{BUILD_COMMAND}`")
        return 0
    print(f"{'name':<34} {'model':<14} {'kwargs':<22} {'data':<18} {'seed':>4} {'epochs':>6} {'steps':>6} "
          f"{'test acc':>9}  {'on':>6}  sha256")
    for c in every.values():
        kw = ",".join(f"{k}={v}" for k, v in c["model_kwargs"].items())
        print(f"{c['name']:<34} {c['model']:<14} {kw:<22} {c['data']:<18} {c['seed']:>4} {c['epochs']:>6} "
              f"{c['steps']:>6} {100 * c['test_acc']:>8.2f}%  {c['test_size']:>6}  {c['sha256'][:12]}")
    print(f"({len(every)} models in {PRETRAINED_DIR}; `create_model(model, **kwargs, pretrained=True)`)")
    return 0


def _build(args: argparse.Namespace) -> int:
    from gatepool.lab.pretrained import build

    out_folder(args.out)
    if args.dest is not None:
        out_folder(args.dest, "--dest")
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    command = "gatepool pretrained build " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["pretrained",
                                                                                       "build"] else ""
    try:
        build(args.out, args.dest, jobs=args.jobs, only=only, command=command.strip() or
              f"gatepool pretrained build --out {args.out} --jobs {args.jobs}")  # fmt: skip
    except ValueError as e:  # --only names, or --out holding trainings of another configuration
        raise UsageError(str(e)) from None
    return 0
