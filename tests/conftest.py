"""Fixtures shared by the CLI, lock and fault tests."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
