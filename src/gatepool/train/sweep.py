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

Executors: where the calls run. ``run_tasks(fn, tasks, jobs, executor)`` with ``executor=None`` (or a
:class:`LocalExecutor`) is the process pool above; a :class:`RayExecutor` submits every call as a Ray
task with its share of a node (``num_cpus`` CPUs, and ``num_gpus`` when asked), on the cluster at
``address`` or on a Ray instance it starts on this machine. The thread rule carries over: a Ray task
runs ``fn`` on ``num_cpus`` torch threads, so a task with one CPU gets the bits of a worker of
``--jobs <cores>`` here. The calls write their own files: a training writes its checkpoints and results
into its run folder itself, so on a cluster the out folder must be one path that every node sees (a
shared file system). That is deliberate: a checkpoint returned to the driver only at the end would be
lost with a node that dies mid-training, and the retried task could not resume from its last epoch.

Failures: a Ray task whose worker dies (killed, out of memory, a lost node) or whose call raises is
retried ``retries`` times (it resumes from its checkpoint); one that still fails becomes a
:class:`TaskFailed` in the results when ``run_tasks(..., failures="return")``, or, by default, a
:class:`SweepError` naming every failed task after all the others have finished and saved their work.
A local Ray instance ends with the process that started it, as the pool's workers do (checked by hand:
after ``kill -9`` of the driver its two sleeping tasks' workers were gone within 20 s).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from gatepool.utils.checks import check_int, check_number
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


@dataclass(frozen=True)
class TaskFailed:
    """A call that failed for good: its place in the task list, the task, the error and the attempts."""

    index: int
    task: Any
    error: str
    attempts: int

    def __str__(self) -> str:
        return f"task {self.index} failed after {self.attempts} attempt(s): {self.error}"


class SweepError(RuntimeError):
    """Some calls failed for good (after their retries); ``failures`` lists them."""

    def __init__(self, failures: list[TaskFailed], total: int) -> None:
        self.failures = failures
        lines = "; ".join(str(f) for f in failures[:5]) + (" ..." if len(failures) > 5 else "")
        super().__init__(f"{len(failures)} of {total} tasks failed: {lines}")


@dataclass(frozen=True)
class LocalExecutor:
    """Today's pool: ``jobs`` spawned processes on this machine, ``cpu_count // jobs`` threads each."""

    jobs: int = 1

    def __post_init__(self) -> None:
        check_int(self.jobs, "jobs")

    def map(self, fn: Callable[[T], Any], tasks: Sequence[T], failures: str = "raise") -> list[Any]:
        if self.jobs == 1:
            return [_call_local(fn, i, t, failures) for i, t in enumerate(tasks)]
        threads = max(1, (os.cpu_count() or 1) // self.jobs)  # from the jobs asked for, however many remain
        if len(tasks) <= 1:  # one left (a resumed sweep): here, but with a worker's threads, for its bits
            with num_threads(threads):
                return [_call_local(fn, i, t, failures) for i, t in enumerate(tasks)]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(self.jobs, len(tasks)), mp_context=ctx, initializer=_init_worker,
                                 initargs=(threads, os.getpid())) as pool:  # fmt: skip
            if failures == "raise":
                return list(pool.map(fn, tasks))  # the first error, as raised, once the others end
            futures = [pool.submit(fn, t) for t in tasks]
            return [_result_or_failure(f, i, t) for i, (f, t) in enumerate(zip(futures, tasks))]


def _call_local(fn: Callable[[T], Any], index: int, task: T, failures: str) -> Any:
    if failures == "raise":
        return fn(task)
    try:
        return fn(task)
    except Exception as e:  # reported in the results, not dropped
        return TaskFailed(index, task, f"{type(e).__name__}: {e}", 1)


def _result_or_failure(future: Any, index: int, task: Any) -> Any:
    try:
        return future.result()
    except Exception as e:  # a worker that died (BrokenProcessPool) fails every task still in it
        return TaskFailed(index, task, f"{type(e).__name__}: {e}", 1)


@dataclass(frozen=True)
class RayExecutor:
    """Each call a Ray task with ``num_cpus`` CPUs (its torch threads) and ``num_gpus`` GPUs.

    ``address``: a running cluster (``ray://host:10001``, ``host:6379`` or ``auto``); None starts a
    local Ray instance on this machine (its CPUs: ``local_cpus``, default all cores; no dashboard).
    ``retries``: how many times a failed task runs again (a dead worker or
    an exception alike). Ray stays up for the rest of the process (an experiment after another reuses it).
    """

    address: str | None = None
    num_cpus: float = 1
    num_gpus: float = 0
    retries: int = 2
    local_cpus: int | None = None

    def __post_init__(self) -> None:
        check_number(self.num_cpus, "num_cpus", 0)
        check_number(self.num_gpus, "num_gpus", 0)
        if self.num_cpus == 0 and self.num_gpus == 0:
            raise ValueError("num_cpus and num_gpus cannot both be 0: a task needs a CPU or a GPU")
        check_int(self.retries, "retries", 0)
        check_int(self.local_cpus, "local_cpus", optional=True)

    @property
    def threads(self) -> int:
        """Torch threads of each task: its CPUs (at least one)."""
        return max(1, int(self.num_cpus))

    def start(self) -> Any:
        """Connect to ``address`` or start a local instance (once per process); returns the ray module."""
        ray = import_ray()
        if not ray.is_initialized():
            if self.address is None:
                ray.init(num_cpus=self.local_cpus, include_dashboard=False, configure_logging=False)
            else:
                ray.init(address=self.address, configure_logging=False)
        return ray

    def map(self, fn: Callable[[T], Any], tasks: Sequence[T], failures: str = "raise") -> list[Any]:
        if not tasks:
            return []
        ray = self.start()
        remote = ray.remote(_call_with_threads).options(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=self.retries, retry_exceptions=True
        )
        refs = [remote.remote(fn, t, self.threads) for t in tasks]
        results: list[Any] = []
        for i, (ref, task) in enumerate(zip(refs, tasks)):
            try:
                results.append(ray.get(ref))
            except Exception as e:  # RayTaskError (fn raised) or WorkerCrashedError, after the retries
                results.append(TaskFailed(i, task, _ray_error(e), self.retries + 1))
        failed = [r for r in results if isinstance(r, TaskFailed)]
        if failed and failures == "raise":
            raise SweepError(failed, len(tasks))
        return results


def _call_with_threads(fn: Callable[[T], Any], task: T, threads: int) -> Any:
    """A Ray task's body: ``fn(task)`` on ``threads`` torch threads."""
    with num_threads(threads):
        return fn(task)


def _ray_error(e: Exception) -> str:
    cause = getattr(e, "cause", None)  # RayTaskError carries the exception fn raised
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError that names the extra to install."""
    try:
        import ray
    except ImportError:
        raise ImportError("the Ray executor needs Ray: pip install 'gatepool[ray]'") from None
    return ray


Executor = LocalExecutor | RayExecutor


def device_for(device: Any, executor: Any) -> tuple[str, dict[str, Any]]:
    """The device name the calls of ``executor`` get, and what a record says of it.

    The local pool (``executor`` None or a :class:`LocalExecutor`): ``device`` resolved here, e.g.
    ``("cuda:0", {"device": "cuda:0", "device_name": ...})``. A :class:`RayExecutor`: the name as given
    (``auto``, ``cpu``, ``cuda``), which each task resolves where it runs: Ray shows a task only the GPUs
    it reserved (none with ``num_gpus=0``: ``auto`` is then the CPU), and the driver may have no GPU.
    """
    from gatepool.utils.environment import check_device, device_info

    if isinstance(executor, RayExecutor):
        name = check_device(device)
        return name, {"device": f"{name} (resolved in each Ray task)"}
    where = resolve_device(device)
    return str(where), device_info(where)


def run_tasks(
    fn: Callable[[T], Any],
    tasks: Sequence[T],
    jobs: int = 1,
    executor: Executor | None = None,
    *,
    failures: str = "raise",
) -> list[Any]:
    """Run ``fn`` over ``tasks`` through ``executor`` (None: ``LocalExecutor(jobs)``); results in task order.

    ``failures``: ``"raise"`` or ``"return"`` (a :class:`TaskFailed` in the failed task's place, every
    task run). With ``"raise"``: ``jobs=1`` raises the first error as it happens, and the tasks after it do
    not run; ``jobs > 1`` raises the first error (in task order) once the pool's other tasks have ended;
    Ray raises a :class:`SweepError` naming every failed task once every other task has ended.
    """
    if failures not in ("raise", "return"):
        raise ValueError(f"failures must be 'raise' or 'return', got {failures!r}")
    if executor is None:
        executor = LocalExecutor(jobs)  # checks jobs
    if not isinstance(executor, (LocalExecutor, RayExecutor)):
        raise TypeError(f"executor must be None, a LocalExecutor or a RayExecutor, got {executor!r}")
    return executor.map(fn, list(tasks), failures)
