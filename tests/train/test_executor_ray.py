"""The Ray executor on a local 2-CPU Ray instance: the same trainings as the local pool, bit for bit;
finished trainings skipped and started ones resumed on a rerun; a killed task retried; failures reported."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'gatepool[ray]')")

from gatepool.cli import main  # noqa: E402
from gatepool.train.sweep import RayExecutor, SweepError, TaskFailed, run_tasks  # noqa: E402

pytestmark = pytest.mark.slow
TIMING = ("images_per_s", "seconds")  # the only history fields that differ between reruns

GRID = """
model = "residual_cnn"
gates = ["max", "soft"]
seeds = [0]
[model_settings]
width = 8
[train]
epochs = 2
train_size = 256
test_size = 256
batch_size = 64
"""


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module: 2 CPUs, no dashboard; this module's task functions are sent
    by value (the workers cannot import a test file)."""
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def run_records(out: Path) -> dict[str, dict]:
    """Every training's results.json under a sweep's ``out``, by run folder."""
    return {str(p.parent.relative_to(out)): json.loads(p.read_text()) for p in out.glob("*/*/results.json")}


def without_timing(record: dict) -> dict:
    keep = {k: v for k, v in record.items() if k not in ("seconds", "machine")}
    keep["history"] = [{k: v for k, v in row.items() if k not in TIMING} for row in record["history"]]
    return keep


def test_ray_sweep_equals_local_and_reruns_skip_or_resume(tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    local, remote = tmp_path / "local", tmp_path / "ray"
    # the local pool with one worker per core: 1 thread each; a Ray task with 1 CPU: 1 thread
    assert main(["sweep", str(grid), "--out", str(local), "--jobs", str(os.cpu_count()), "--quiet"]) == 0
    assert main(["sweep", str(grid), "--out", str(remote), "--executor", "ray", "--quiet"]) == 0
    a, b = run_records(local), run_records(remote)
    assert sorted(a) == sorted(b) == ["mnist/max-s0", "mnist/soft-s0"]
    for name in a:
        assert a[name]["threads"] == b[name]["threads"] == 1
        assert a[name]["weights_sha256"] == b[name]["weights_sha256"], name  # bit-identical weights
        # the device asked for: resolved on the driver for the local pool, in the task under Ray
        assert (a[name]["config"]["device"], b[name]["config"]["device"]) == ("cpu", "auto")
        assert a[name]["device"] == b[name]["device"] == "cpu"  # where it ran
        for rec in (a[name], b[name]):
            del rec["config"]["device"]
        assert without_timing(a[name]) == without_timing(b[name]), name
    table_a = [{k: v for k, v in r.items() if k not in ("out", "seconds")}
               for r in json.loads((local / "results.json").read_text())["rows"]]  # fmt: skip
    table_b = [{k: v for k, v in r.items() if k not in ("out", "seconds")}
               for r in json.loads((remote / "results.json").read_text())["rows"]]  # fmt: skip
    assert table_a == table_b and all(r["status"] == "ok" for r in table_b)

    # a rerun skips what finished: no training writes again
    stamps = {p: p.stat().st_mtime_ns for p in remote.glob("*/*/*") if p.is_file()}
    assert main(["sweep", str(grid), "--out", str(remote), "--executor", "ray", "--quiet"]) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    # a started training resumes from its last epoch: as if killed after epoch 1 (only its checkpoint)
    run = remote / "mnist" / "max-s0"
    for name in ("results.json", "model.safetensors", "checkpoint.pt"):
        (run / name).unlink()
    assert main(["sweep", str(grid), "--out", str(remote), "--executor", "ray", "--quiet"]) == 0
    again = run_records(remote)["mnist/max-s0"]
    assert again["weights_sha256"] == b["mnist/max-s0"]["weights_sha256"]
    assert again["history"][0]["seconds"] == b["mnist/max-s0"]["history"][0]["seconds"]  # epoch 1 not rerun
    assert again["history"][1]["seconds"] != b["mnist/max-s0"]["history"][1]["seconds"]  # epoch 2 was


def die_first_time(folder: str) -> int:
    """Kill this task's worker (SIGKILL, as the OOM killer would) the first time; else return the attempt."""
    attempt = len(list(Path(folder).iterdir()))
    (Path(folder) / f"attempt-{attempt}").touch()
    if attempt == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return attempt


def always_die(folder: str) -> None:
    (Path(folder) / f"attempt-{len(list(Path(folder).iterdir()))}").touch()
    os.kill(os.getpid(), signal.SIGKILL)


def always_raise(folder: str) -> None:
    (Path(folder) / f"attempt-{len(list(Path(folder).iterdir()))}").touch()
    raise ValueError("a bad training")


def test_a_killed_task_is_retried_and_a_lost_one_reported(tmp_path):
    folders = [tmp_path / name for name in ("once", "always", "raises")]
    for f in folders:
        f.mkdir()
    executor = RayExecutor(num_cpus=1, retries=1)
    res = run_tasks(die_first_time, [str(folders[0])], executor=executor)
    assert res == [1]  # the second attempt ran to the end
    fns = [die_first_time, always_die, always_raise]
    results = run_tasks(call, [(fn, str(f)) for fn, f in zip(fns, folders)], executor=executor,
                        failures="return")  # fmt: skip
    assert results[0] == 2  # its folder already held two attempts
    for i, (r, f) in enumerate(zip(results[1:], folders[1:]), 1):
        assert isinstance(r, TaskFailed) and r.index == i and r.attempts == 2, r
        assert len(list(f.iterdir())) == 2  # ran once, retried once: bounded
    assert "WorkerCrashedError" in results[1].error and "ValueError: a bad training" in results[2].error
    with pytest.raises(SweepError, match="1 of 2 tasks failed.*ValueError: a bad training"):
        run_tasks(call, [(die_first_time, str(folders[0])), (always_raise, str(folders[2]))],
                  executor=RayExecutor(num_cpus=1, retries=0))  # fmt: skip


def call(pair):
    fn, arg = pair
    return fn(arg)


def test_run_and_reproduce_hand_the_executor_to_the_experiments_sweeps(tmp_path, monkeypatch):
    from gatepool.lab.experiments import pool_comparison, vit_mnist
    from gatepool.train import sweep

    seen = []

    def fake_run_tasks(fn, tasks, jobs=1, executor=None, **kw):
        seen.append(executor)
        raise RuntimeError("stop here")

    for module in (sweep, pool_comparison, vit_mnist):  # attention-reach's train_pending calls sweep's
        monkeypatch.setattr(module, "run_tasks", fake_run_tasks)
    argv = ["--executor", "ray", "--address", "auto", "--cpus-per-task", "2", "--retries", "5", "--quiet"]
    assert main(["run", "pool-comparison", "--out", str(tmp_path / "a"), *argv]) == 1  # the experiment broke
    assert main(["reproduce", "--only", "attention-reach", "--out", str(tmp_path / "b"), *argv]) == 1
    assert seen == [RayExecutor(address="auto", num_cpus=2.0, num_gpus=0.0, retries=5)] * 2
    record = json.loads((tmp_path / "a" / "pool-comparison" / "result.json").read_text())
    assert record["status"] == "error" and "stop here" in record["error"]
