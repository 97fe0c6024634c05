"""Kill anywhere, lose nothing: ``gatepool reproduce --profile quick`` killed with SIGKILL again and again.

One uninterrupted run is the reference. A second run in another folder is killed with SIGKILL to its
whole process group (the reproduction and its training workers) and started again, until a run gets
through; each kill is drawn at random (seeded), half of each kind:

* *inside* a write: a ``sitecustomize`` on PYTHONPATH (this test's, in every process of the run,
  workers included) counts the run's file placements (``os.replace``: checkpoints, the kept previous
  checkpoint, weights, results, figures, report) and kills the group at a drawn one (1 to 1/20 of a
  whole run's), with the new bytes written but not yet in place (between the two renames of a
  checkpoint, too);
* at a drawn time after the start, up to 8% of the reference's wall time (imports, experiments,
  trainings, anything).

Once a run gets through, three more runs are killed inside the report's three writes (results.json,
report.md, report.html). At least 20 kills must land, some inside checkpoint and result writes.

After every kill, every file a reader would open is whole: JSON parses, checkpoints pass their SHA-256,
weights load, PNGs end with IEND, the report is complete; nothing was found damaged (``*.corrupt``).
In the end the final results.json has the same claims as the reference with the same verdicts, and the
same measured values except the wall-clock ones. vit-mnist sizes its trainings by a speed it measures
(``speed.json``); the killed run is given the reference's file, so its trainings are the same seeded
trainings and their values are compared too.

Marked ``kill`` (6.5 to 8 minutes on 2 cores; 19 minutes and 66 runs on a 2-core AMD EPYC without AVX-512,
where the time kills more often land in the imports): ``make test-kill``, which CI runs after ``make test``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatepool.utils.io import load_checked

pytestmark = [pytest.mark.slow, pytest.mark.kill]

SRC = str(Path(__file__).resolve().parents[1] / "src")
SITECUSTOMIZE = '''
import os, signal
_LOG, _AT = os.environ.get("GATEPOOL_TEST_WRITES"), int(os.environ.get("GATEPOOL_TEST_KILL_AT", "0"))
if _LOG:
    _replace = os.replace

    def replace(src, dst, *args, **kwargs):
        with open(_LOG, "a") as f:  # one short O_APPEND write: lines from several processes stay whole
            f.write(f"{os.getpid()} {os.fspath(dst)}\\n")
        if _AT:
            with open(_LOG) as f:
                if sum(1 for _ in f) >= _AT:
                    os.killpg(os.getpgrp(), signal.SIGKILL)  # the new bytes written, not yet in place
        return _replace(src, dst, *args, **kwargs)

    os.replace = replace
'''
MAX_RUNS = 120  # a run that makes no progress never gets through; a slow CPU needs more restarts (below)
WALL_CLOCK = {("seq-demo", "time"), ("seq-demo-encdec", "time")}  # in seconds: differ between any two runs


def start(out: Path, site: Path, log: Path, kill_at: int = 0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), SRC]), "GATEPOOL_TEST_WRITES": str(log),
           "GATEPOOL_TEST_KILL_AT": str(kill_at), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "gatepool", "reproduce", "--profile", "quick", "--out", str(out), "--quiet"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def claims(out: Path) -> dict[tuple[str, str], tuple[str, object]]:
    record = json.loads((out / "results.json").read_text())
    experiments = record["experiments"]
    return {(e["name"], c["id"]): (c["verdict"], c["measured"]) for e in experiments for c in e["claims"]}


def check_whole(out: Path) -> dict[str, int]:
    """Open every file a reader would: each must be complete. Returns how many of each kind were read."""
    seen = {"json": 0, "checkpoint": 0, "weights": 0, "png": 0, "report": 0}
    for path in out.rglob("*"):
        name = path.name
        if not path.is_file() or name.startswith("."):  # .gatepool.lock, and temp files no reader opens
            continue
        assert not name.endswith(".corrupt"), f"{path}: a damaged file was found and moved aside"
        if name.endswith(".json"):
            json.loads(path.read_text())
            seen["json"] += 1
        elif name.endswith(".pt"):
            load_checked(path)
            seen["checkpoint"] += 1
        elif name.endswith(".safetensors"):
            from safetensors.torch import load_file

            load_file(path)
            seen["weights"] += 1
        elif name.endswith(".png"):
            data = path.read_bytes()
            assert data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82"), path
            seen["png"] += 1
        elif name in ("report.html", "report.md"):
            text = path.read_text()
            assert text.rstrip().endswith("</html>") if name.endswith(".html") else text.strip(), path
            seen["report"] += 1
    return seen


def test_reproduce_killed_again_and_again_ends_as_an_uninterrupted_run(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    ref, out = tmp_path / "reference", tmp_path / "killed"

    proc = start(ref, site, tmp_path / "reference.log")
    t0 = time.monotonic()
    log, _ = proc.communicate(timeout=900)
    ref_seconds = time.monotonic() - t0
    assert proc.returncode == 0, log
    writes = len((tmp_path / "reference.log").read_text().splitlines())
    assert writes > 100  # checkpoints, weights, results, figures, report: what the kills can land in
    (out / "vit-mnist").mkdir(parents=True)
    shutil.copy(ref / "vit-mnist" / "speed.json", out / "vit-mnist" / "speed.json")

    rng = random.Random(0)
    kills, read = [], []
    for i in range(MAX_RUNS):  # killed until a run gets through: the last kills land in the report's writes
        kind, run_log = rng.choice(["write", "time"]), tmp_path / f"run{i}.log"
        if kind == "write":
            at = rng.randint(1, writes // 20)
            proc = start(out, site, run_log, kill_at=at)
            text, _ = proc.communicate(timeout=900)
        else:
            at = round(rng.uniform(1.0, 0.08 * ref_seconds), 2)
            proc = start(out, site, run_log)
            try:
                text, _ = proc.communicate(timeout=at)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                text, _ = proc.communicate()
        assert proc.returncode in (0, -signal.SIGKILL), text
        read.append(check_whole(out))
        if proc.returncode == 0:
            break
        placed = run_log.read_text().splitlines() if run_log.exists() else []
        kills.append((kind, at, Path(placed[-1].split()[1]).name if placed else None))
    assert proc.returncode == 0, f"still not through after {MAX_RUNS} runs"
    # Every experiment is done now; a rerun writes only results.json, report.md and report.html, in that
    # order: one kill inside each.
    for at, name in enumerate(("results.json", "report.md", "report.html"), start=1):
        run_log = tmp_path / f"report{at}.log"
        proc = start(out, site, run_log, kill_at=at)
        text, _ = proc.communicate(timeout=900)
        assert proc.returncode == -signal.SIGKILL, text
        assert Path(run_log.read_text().splitlines()[-1].split()[1]).name == name
        kills.append(("write", at, name))
        read.append(check_whole(out))
    assert len(kills) >= 20, f"only {len(kills)} kills landed: {kills}"
    landed_in = {name for kind, _, name in kills if kind == "write"}
    for writes_of in ({"checkpoint.pt", "checkpoint.prev.pt"}, {"result.json"}):
        assert landed_in & writes_of, (writes_of, kills)  # inside a checkpoint's and a result's write

    proc = start(out, site, tmp_path / "final.log")
    text, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, text
    check_whole(out)
    assert not [p for p in out.rglob(".*.tmp")], "temp files of killed writes were left behind"

    expected, got = claims(ref), claims(out)
    assert got.keys() == expected.keys()
    for key, (verdict, measured) in expected.items():
        assert got[key][0] == verdict, key
        if key not in WALL_CLOCK:
            assert got[key][1] == measured, (key, got[key][1], measured)
    totals = {k: sum(r[k] for r in read) for k in read[0]}
    print(f"\n{len(kills)} kills ({sum(k == 'write' for k, _, _ in kills)} inside writes, landing in "
          f"{sorted(landed_in)}), {len(read)} restarts; files opened whole after them: {totals}")
