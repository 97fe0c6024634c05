"""Sweeps of trainings in worker processes: results in task order, and no worker outlives a killed sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatepool.train.sweep import LocalExecutor, RayExecutor, run_tasks

SRC = str(Path(__file__).resolve().parents[2] / "src")
SCRIPT = """
import os, sys, time
from gatepool.train.sweep import run_tasks

def work(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(120)  # a long training

if __name__ == "__main__":
    run_tasks(work, [os.path.join(sys.argv[1], f"w{i}") for i in range(2)], jobs=2)
"""


def square(x: int) -> int:
    return x * x


@pytest.mark.slow
def test_results_come_back_in_task_order():
    assert run_tasks(square, [3, 1, 2], jobs=1) == [9, 1, 4]
    assert run_tasks(square, list(range(5)), jobs=2) == [0, 1, 4, 9, 16]


def threads_used(_task) -> int:
    import torch

    return torch.get_num_threads()


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to tell the counts apart")
def test_every_task_gets_a_workers_threads_however_many_remain():
    per_worker = (os.cpu_count() or 1) // 2
    assert run_tasks(threads_used, [0, 1], jobs=2) == [per_worker, per_worker]
    assert run_tasks(threads_used, [0], jobs=2) == [per_worker]  # the last one left, in this process


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_killed_sweep(tmp_path):
    (tmp_path / "sweep.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "sweep.py"), str(tmp_path)], env=env)
    pids = [tmp_path / f"w{i}" for i in range(2)]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in pids):
        assert proc.poll() is None and time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
    workers = [int(p.read_text()) for p in pids]
    assert all(alive(pid) for pid in workers)
    proc.send_signal(signal.SIGKILL)  # the sweep alone, as the OOM killer would
    proc.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "workers went on after their sweep was killed"


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: run_tasks(print, [1], jobs=0), "jobs"),
        (lambda: run_tasks(print, [1], jobs=True), "jobs"),
        (lambda: LocalExecutor(2.0), "jobs"),
        (lambda: RayExecutor(num_cpus=-1), "num_cpus"),
        (lambda: RayExecutor(num_gpus=float("nan")), "num_gpus"),
        (lambda: RayExecutor(retries=-1), "retries"),
        (lambda: RayExecutor(local_cpus=True), "local_cpus"),
        (lambda: RayExecutor(local_cpus=0), "local_cpus"),
    ],
)
def test_executor_arguments_are_checked(make, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        make()
