"""The experiment harness: one run of one experiment, and its result on disk.

An experiment declares its claims and setups with ``gatepool.lab.claims`` (see there for how claims are
checked); ``gatepool.lab.experiments`` imports every experiment file and lists them (``registry()``).
A run writes ``<out>/<name>/result.json`` (atomically, last) beside its figures; a finished result whose
profile and setup match is what makes ``gatepool reproduce`` skip an experiment when resuming.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gatepool.lab.claims import Context, Experiment, jsonable, plain, rejudge_claims
from gatepool.lab.experiments import registry
from gatepool.train.sweep import device_for
from gatepool.utils.environment import machine
from gatepool.utils.io import DiskFullError, atomic_write_json, read_json


def get(name: str) -> Experiment:
    reg = registry()
    if name not in reg:
        raise ValueError(f"experiment {name!r} is unknown; `gatepool list` shows {', '.join(reg)}")
    return reg[name]


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x,y"]`` -> ``{"a": "1", "b": "x,y"}``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def environment() -> dict[str, Any]:
    """Machine, Python and torch: beside every number we publish."""
    return machine()


def result_path(out: Path, name: str) -> Path:
    return Path(out) / name / "result.json"


def load_result(out: Path, name: str) -> dict[str, Any] | None:
    path = result_path(out, name)
    if not path.is_file():
        return None
    try:
        record = read_json(path)
    except (OSError, ValueError):
        return None  # a torn or foreign file: the experiment runs again
    return record if shipped_unchanged(record) else None  # judged from other shipped weights: again


def shipped_unchanged(record: dict[str, Any]) -> bool:
    """Whether every shipped model the record was judged from (``pretrained``: name -> SHA-256) still
    ships with that hash."""
    used = record.get("pretrained") or {}
    if not used:
        return True
    from gatepool.models.pretrained import cards

    now = {name: card["sha256"] for name, card in cards().items()}
    return all(now.get(name) == digest for name, digest in used.items())


def run_experiment(
    name: str,
    *,
    profile: str = "quick",
    overrides: dict[str, str] | None = None,
    seed: int | None = None,
    out: str | Path = "runs/experiments",
    jobs: int = 1,
    progress: bool = True,
    device: str = "auto",
    executor: Any = None,
) -> dict[str, Any]:
    """Run one experiment and write its result record; returns the record.

    ``device`` (auto | cpu | cuda | cuda:N | mps) is resolved here (with a Ray ``executor``: in each task,
    :func:`gatepool.train.sweep.device_for`) and handed to the experiment as
    ``ctx.device``, a plain string such as ``"cuda:0"`` (picklable for sweep workers): the device its
    trainings run on (``TrainConfig(device=ctx.device)``). The record's environment names it.
    ``executor`` (``ctx.executor``): where the sweeps' trainings run (``gatepool.train.sweep``; None: this
    machine's process pool of ``jobs`` workers).
    """
    exp = get(name)
    setup = exp.resolve_setup(profile, overrides, seed)
    folder = Path(out) / name
    where, device_record = device_for(device, executor)  # with Ray: resolved in each task
    ctx = Context(exp, profile, setup, folder, jobs=jobs, progress=progress, device=where,
                  executor=executor)  # fmt: skip
    t0 = time.perf_counter()
    error = None
    try:
        exp.fn(ctx)
    except DiskFullError:  # not the experiment's fault: stop, and let the CLI say it in one line
        raise
    except Exception as e:  # the record says what broke; the claims measured so far stay
        error = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    seconds = time.perf_counter() - t0
    record = {
        "name": name,
        "title": exp.title,
        "profile": profile,
        "setup": jsonable(setup),
        "claims_digest": exp.claims_digest(setup),
        "seconds": round(seconds, 2),
        "figures": [
            str(Path(f).relative_to(Path(out))) if Path(f).is_relative_to(Path(out)) else f
            for f in ctx.figures
        ],
        "claims": ctx.claim_records(),
        "notes": ctx.notes,
        "literature": ctx.literature,
        "data": plain(ctx.data),
        "pretrained": dict(sorted(ctx.pretrained.items())),  # shipped models used: name -> SHA-256
        "status": "error" if error else "complete",
        "error": error,
        "environment": {**environment(), **device_record},
    }
    atomic_write_json(result_path(Path(out), name), record)
    return record


def rejudge(record: dict[str, Any], why: str) -> dict[str, Any]:
    """A finished record judged again against the claims declared now, from its own measurements.

    For a run whose measurements are unchanged but whose claims were relabelled or re-barred (a source,
    a kind, a two-sided bar) and whose trainings are not at hand to run it again
    (:func:`gatepool.lab.claims.rejudge_claims` says how each claim is judged). ``why`` goes into the
    record (``rejudged``, after the reason of any earlier judging again, once), so the report can say it.
    """
    exp = get(record["name"])
    setup = exp.resolve_setup(record["profile"])
    if jsonable(setup) != record.get("setup"):
        raise ValueError(f"{record['name']}: the record's setup is not the {record['profile']} profile's now")
    claims = rejudge_claims(exp.claims(setup), record.get("claims", []), record["profile"], why)
    before = record.get("rejudged") or ""
    reasons = before if before.endswith(why) else "; then ".join(r for r in (before, why) if r)
    return {**record, "claims": claims, "claims_digest": exp.claims_digest(setup), "rejudged": reasons}
