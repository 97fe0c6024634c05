"""Fixtures shared by the CLI, lock and fault tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # make test's workers: one thread each, so two share two cores
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

SRC = str(Path(__file__).resolve().parents[1] / "src")
_HOLDER = """
import sys, time
from gatepool.utils.lock import RunLock
lock = RunLock(sys.argv[1], command="holder-test").acquire()
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
open(sys.argv[1] + "/released", "w").close()
lock.release()
"""


@pytest.fixture
def lock_holder():
    """``lock_holder(folder, seconds)``: another process takes ``folder``'s lock, holds it ``seconds``,
    writes ``folder/released`` and lets go. Returns its Popen once it holds the lock; killed at the end.
    """
    procs = []

    def start(folder: Path, seconds: float) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(folder), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": SRC},
        )
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()
        p.stdout.close()


@pytest.fixture
def small_canvas(monkeypatch, tmp_path):
    """``small_canvas(n_train, n_test)``: the generated 60×60 sets are made from the first n MNIST digits
    of each split, in a temporary cache (the real sets have 70,000); returns that cache's gatepool/."""
    from gatepool.data import Dataset, canvas, load_dataset

    def use(n_train: int, n_test: int) -> Path:
        full = {s: load_dataset("mnist", s) for s in ("train", "test")}
        sizes = {"train": n_train, "test": n_test}

        def source(split, data_dir=None):
            ds, n = full[split], sizes[split]
            return Dataset("mnist", split, ds.images[:n], ds.labels[:n], ds.mean, ds.std, ds.source)

        monkeypatch.setattr(canvas, "_source", source)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.delenv("GATEPOOL_DATA", raising=False)
        canvas._load.cache_clear()
        return tmp_path / "cache" / "gatepool"

    yield use

    canvas._load.cache_clear()
