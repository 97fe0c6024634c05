"""One line and exit 2, never a traceback: Ray's address and GPUs, a build folder of another
configuration, torchrun's environment; and ``reproduce --strict`` fails on the lecture's claims only."""

from __future__ import annotations

import json

import pytest

from gatepool.cli import main


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


GRID = 'gates = ["max"]\n[model_settings]\nwidth = 8\n[train]\nepochs = 1\ntrain_size = 64\n'


@pytest.fixture
def ray_stub(monkeypatch):
    """Ray importable but never started: RayExecutor.start does nothing, ``run_grid`` records its call."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'gatepool[ray]')")
    from gatepool.train import grid, sweep

    calls = []

    def record(the_grid, out, **kwargs):
        calls.append(kwargs)
        return {"rows": [], "summary": []}

    monkeypatch.setattr(sweep.RayExecutor, "start", lambda self: None)
    monkeypatch.setattr(grid, "run_grid", record)
    return calls


def test_ray_gets_the_device_name_unresolved_and_a_gpu_for_cuda(ray_stub, tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    assert main(["sweep", str(path), "--out", str(tmp_path / "a"), "--executor", "ray", "--quiet"]) == 0
    assert ray_stub[-1]["device"] == "auto" and ray_stub[-1]["executor"].num_gpus == 0  # resolved in the task
    # a CPU-only driver may hand cuda to its cluster: not resolved here, one GPU per task by default
    assert main(["sweep", str(path), "--out", str(tmp_path / "b"), "--executor", "ray", "--device", "cuda",
                 "--quiet"]) == 0  # fmt: skip
    assert ray_stub[-1]["device"] == "cuda" and ray_stub[-1]["executor"].num_gpus == 1
    for argv, wanted in ((["--device", "cuda", "--gpus-per-task", "0"], "--gpus-per-task 0"),
                         (["--device", "cuda:1"], "--device cuda:1")):  # fmt: skip
        assert main(["sweep", str(path), "--executor", "ray", *argv]) == 2
        assert wanted in one_line(capsys)


def test_experiments_under_ray_hand_the_unresolved_name_to_the_tasks(ray_stub, tmp_path, monkeypatch):
    from gatepool.lab.experiments import pool_comparison

    seen = []

    def fake_run_tasks(fn, tasks, jobs=1, executor=None, **kw):
        seen.append(tasks[0].config["device"])  # a gatepool.train.task.TrainTask
        raise RuntimeError("stop here")

    monkeypatch.setattr(pool_comparison, "run_tasks", fake_run_tasks)
    assert main(["run", "pool-comparison", "--out", str(tmp_path), "--executor", "ray", "--quiet"]) == 1
    assert seen == ["auto"]
    record = json.loads((tmp_path / "pool-comparison" / "result.json").read_text())
    assert record["environment"]["device"] == "auto (resolved in each Ray task)"


def test_an_unreachable_ray_address_is_one_line_naming_it(monkeypatch, capsys, tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'gatepool[ray]')")

    def refuse(*args, **kwargs):
        raise ConnectionError("could not connect to the GCS at 10.0.0.9:6379")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    for argv in (["sweep", str(path)], ["run", "pool-comparison"], ["reproduce"]):
        assert main([*argv, "--out", str(tmp_path / "out"), "--executor", "ray", "--address",
                     "10.0.0.9:6379"]) == 2  # fmt: skip
        err = one_line(capsys)
        assert "--address 10.0.0.9:6379" in err and "could not connect" in err


def test_pretrained_build_of_another_configuration_is_one_line(monkeypatch, capsys, tmp_path):
    from gatepool.lab import pretrained

    def mismatch(*args, **kwargs):
        raise ValueError(f"{tmp_path}/vit: holds a training of another configuration (epochs 3, not 60)")

    monkeypatch.setattr(pretrained, "build", mismatch)
    assert main(["pretrained", "build", "--out", str(tmp_path)]) == 2
    assert "another configuration" in one_line(capsys)


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_a_malformed_torchrun_environment_is_one_line_naming_it(name, monkeypatch, capsys):
    monkeypatch.setenv(name, "two")
    assert main(["train", "--epochs", "1", "--train-size", "64"]) == 2
    err = one_line(capsys)
    assert name in err and "'two'" in err


def claims(*pairs):
    return [{"id": f"c{i}", "source": s, "verdict": v} for i, (s, v) in enumerate(pairs)]


@pytest.mark.parametrize(
    "records, status",
    [
        ([{"name": "gate-matters", "status": "complete", "claims": claims(("beyond", "off"))}], 0),
        ([{"name": "a", "status": "complete", "claims": claims(("lecture", "ok"), ("beyond", "off"))}], 0),
        ([{"name": "a", "status": "complete", "claims": claims(("lecture", "off"), ("beyond", "ok"))}], 1),
        ([{"name": "a", "status": "complete", "claims": claims(("ours", "off"))}], 1),
    ],
)
def test_strict_fails_on_claims_off_but_not_on_findings_beyond(records, status, monkeypatch, tmp_path):
    from gatepool.lab import reproduce

    monkeypatch.setattr(reproduce, "reproduce", lambda **kw: (records, {}))
    assert main(["reproduce", "--strict", "--out", str(tmp_path), "--quiet"]) == status
    assert main(["reproduce", "--out", str(tmp_path), "--quiet"]) == 0  # without --strict: never
