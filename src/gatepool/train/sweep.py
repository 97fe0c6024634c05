"""Independent trainings in parallel worker processes, each with its share of the cores.

``run_tasks(fn, tasks, jobs)`` is ``[fn(t) for t in tasks]``; with ``jobs > 1`` the calls run in
``jobs`` spawned processes, each limited to ``cpu_count // jobs`` torch threads. ``fn`` and the tasks
must be picklable (a module-level function and plain data). Results come back in task order.

A training's bits depend on its thread count, so every task of a sweep gets the same count, however
many remain: a resumed sweep with one task left runs it in this process, but on ``cpu_count // jobs``
threads, as a worker would (measured: the conv + attention net resumed at 2 threads instead of 1
ended with other weights, and a kill test caught the claim that moved).

On a GPU (``device`` cuda or mps) the default is one job: the trainings run one after the other in this
process, each with the whole device (a training of these small models does not fill an H100-class GPU,
but one process owning it keeps things simple). ``--jobs N`` still starts N workers, each with its own
CUDA context on the same GPU; that works, it is just not the default.

On Linux a worker dies with the process that started it (``PR_SET_PDEATHSIG``): a sweep killed with
``kill -9`` leaves no training running on, writing into run folders that the next run resumes.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from gatepool.utils.environment import resolve_device
from gatepool.utils.threads import num_threads

T = TypeVar("T")


def default_jobs(device: Any = None) -> int:
    """Worker processes for independent trainings: one per core, at most 4, on the CPU; 1 on a GPU.

    ``device``: where the trainings run (a name for :func:`~gatepool.utils.environment.resolve_device`;
    None: the CPU, as before devices existed).

    Measured on 2 cores (torch 2.13, ResidualCNN, batch 128): one training with 2 threads ran about
    2,400 images/s, one with 1 thread about 1,900, so two 1-thread workers together do about 1.6× the
    work of one 2-thread run; and a 2-thread run next to any other busy process slowed down up to 20×
    (OpenMP threads wait for a core), while 1-thread workers degrade gracefully. More than 4 workers
    mostly multiplies memory (each holds the data set).
    """
    if device is not None and resolve_device(device).type != "cpu":
        return 1
    return max(1, min(4, os.cpu_count() or 1))


def _init_worker(threads: int, parent: int) -> None:
    _die_with(parent)
    import torch

    torch.set_num_threads(threads)


def _die_with(parent: int) -> None:
    """Linux: SIGKILL this process when ``parent`` (the process that started it) ends."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before prctl took effect
        os._exit(1)


def run_tasks(fn: Callable[[T], Any], tasks: Sequence[T], jobs: int = 1) -> list[Any]:
    """Run ``fn`` over ``tasks``, in ``jobs`` worker processes when ``jobs > 1``."""
    if jobs < 1:
        raise ValueError(f"jobs must be ≥ 1, got {jobs}")
    if jobs == 1:
        return [fn(t) for t in tasks]
    threads = max(1, (os.cpu_count() or 1) // jobs)  # from the jobs asked for, however many tasks remain
    if len(tasks) <= 1:  # one left (a resumed sweep): here, but with a worker's threads, for a worker's bits
        with num_threads(threads):
            return [fn(t) for t in tasks]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=ctx, initializer=_init_worker,
                             initargs=(threads, os.getpid())) as pool:
        return list(pool.map(fn, tasks))
