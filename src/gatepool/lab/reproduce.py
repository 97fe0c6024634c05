"""``gatepool reproduce``: run every experiment (resuming), then write the report.

An experiment whose ``<out>/<name>/result.json`` is complete for the same profile, setup and declared
claims (their digest) is skipped, so a killed run picks up where it stopped (long trainings also resume
from their own checkpoints); a record measured against claims declared otherwise is run again.
Experiments not run (``--only``) or broken still appear in the report, as ``not run`` or ``error``.
Experiments beyond the lecture (``Experiment.beyond``, e.g. ``gate-matters``) run only with
``beyond=True`` (``gatepool reproduce --beyond``); without it they are not in the report at all.
One reproduction writes to ``out`` at a time (:class:`gatepool.utils.lock.RunLock`): a second one
raises ``LockHeld`` naming the first, or with ``wait=True`` waits for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gatepool.lab.claims import SOURCES, jsonable, not_run_record
from gatepool.lab.experiments import registry
from gatepool.lab.harness import environment, load_result, run_experiment
from gatepool.lab.report import counts_text, summary, table, write_report
from gatepool.train.sweep import device_for
from gatepool.utils.lock import RunLock


def reproduce(
    *,
    profile: str = "quick",
    out: str | Path = "runs/reproduce",
    only: list[str] | None = None,
    force: bool = False,
    jobs: int = 1,
    progress: bool = True,
    wait: bool = False,
    device: str = "auto",
    executor: Any = None,
    beyond: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    """Run the experiments and write the report; returns (records, report paths).

    ``beyond``: also run the experiments beyond the lecture (after the lecture's).

    ``device``: where the experiments' trainings run (``ctx.device``; see :func:`run_experiment`). It is
    how to run, not what: an experiment complete on another device is not run again. So is ``executor``
    (``ctx.executor``: the trainings' process pool or Ray; see :func:`run_experiment`).
    """
    out = Path(out)
    reg = registry(beyond=beyond)
    extensions = sorted(set(only or []) & (set(registry()) - set(reg)))
    if extensions:
        raise ValueError(f"--only {' '.join(extensions)}: beyond the lecture; add --beyond to run it")
    unknown = sorted(set(only or []) - set(reg))
    if unknown:
        raise ValueError(f"--only: unknown experiment(s) {unknown}; choose from {', '.join(reg)}")
    with RunLock(out, wait=wait):
        return _reproduce(reg, profile, out, only, force, jobs, progress, device, executor)


def _reproduce(
    reg: dict[str, Any],
    profile: str,
    out: Path,
    only: list[str] | None,
    force: bool,
    jobs: int,
    progress: bool,
    device: str,
    executor: Any = None,
) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    t0 = time.perf_counter()
    records = []
    for name, exp in reg.items():
        if only and name not in only:
            done = load_result(out, name)
            records.append(done if done else _not_run(exp, profile))
            continue
        setup = exp.resolve_setup(profile)
        done = load_result(out, name)
        if (
            not force
            and done
            and done.get("status") == "complete"
            and done.get("profile") == profile
            and done.get("setup") == jsonable(setup)
            and done.get("claims_digest") == exp.claims_digest(setup)  # the same claims, not older ones
        ):
            if progress:
                print(
                    f"[{name}] complete in {out / name}, skipped ({done['seconds']:.1f} s when run)",
                    flush=True,
                )
            records.append(done)
            continue
        if progress:
            print(f"[{name}] {exp.title} ...", flush=True)
        rec = run_experiment(name, profile=profile, out=out, jobs=jobs, progress=progress, device=device,
                             executor=executor)  # fmt: skip
        if progress:
            counts = summary([rec])
            print(
                f"[{name}] {rec['status']} in {rec['seconds']:.1f} s: {counts_text(counts)}",
                flush=True,
            )
        records.append(rec)
    meta = {
        "profile": profile,
        "seconds": round(time.perf_counter() - t0, 1),
        "experiment_seconds": {r["name"]: r.get("seconds") for r in records},
        "summary": {src: summary(records, src) for src in SOURCES},  # verdicts by where the bar comes from
        "environment": {**environment(), **device_for(device, executor)[1]},
    }
    paths = write_report(out, records, meta)
    if progress:
        print()
        print(table(records))
        print(f"\nreport: {paths['markdown']}  {paths['html']}")
    return records, paths


def _not_run(exp, profile: str) -> dict[str, Any]:
    setup = exp.resolve_setup(profile)
    return {
        "name": exp.name,
        "title": exp.title,
        "profile": profile,
        "status": "not run",
        "claims": [not_run_record(c) for c in exp.claims(setup)],
        "figures": [],
        "notes": [],
    }
