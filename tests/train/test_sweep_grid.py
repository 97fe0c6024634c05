"""``gatepool sweep GRID``: the grid's expansion and checks, the table and its intervals, failures reported,
and the executor flags' one-line errors."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys

import pytest

from gatepool.cli import main
from gatepool.train import grid as grid_mod
from gatepool.train.grid import load_grid, parse_grid, run_name, summarize, to_csv
from gatepool.train.sweep import TaskFailed, run_tasks

GRID = """
model = "residual_cnn"
gates = ["max", "soft"]
seeds = [0, 1, 2]
datasets = ["mnist"]
[model_settings]
width = [8, 16]
groups = 4
[train]
epochs = 1
train_size = 128
lr = [1e-3, 3e-3]
betas = [0.9, 0.99]
"""


def test_a_grid_expands_to_its_product_with_named_folders(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    grid = load_grid(path)
    points = grid.points()
    assert len(points) == 2 * 3 * 2 * 2  # gates × seeds × widths × lrs (groups and betas: one value)
    names = [run_name(p) for p in points]
    assert len(set(names)) == len(names)
    assert names[0] == "mnist/max-width=8-lr=0.001-s0"
    assert all(p["model_kwargs"]["groups"] == 4 and p["train"]["betas"] == [0.9, 0.99] for p in points)
    as_json = tmp_path / "grid.json"  # the same keys as JSON
    as_json.write_text(json.dumps({"gates": ["max", "soft"], "seeds": [0, 1, 2],
                                   "model_settings": {"width": [8, 16], "groups": 4},
                                   "train": {"epochs": 1, "train_size": 128, "lr": [1e-3, 3e-3],
                                             "betas": [0.9, 0.99]}}))  # fmt: skip
    assert [run_name(p) for p in load_grid(as_json).points()] == names


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"gates": ["max"], "speed": 1}, r"unknown key\(s\) \['speed'\]"),
        ({"gates": ["maxx"]}, r"gate='maxx'.*pool"),
        ({"gates": ["max"], "datasets": ["cifar"]}, r"datasets: 'cifar' is unknown"),
        ({"gates": ["max"], "train": {"epochs": 0}}, r"epochs must be an integer >= 1"),
        ({"gates": ["max"], "train": {"seed": 1}}, r"grid-set field\(s\) \['seed'\]"),
        ({"gates": ["max"], "seeds": [0, 0]}, r"seeds lists a value twice"),
        ({"gates": ["max"], "model_settings": {"width": []}}, r"width: an empty list"),
        ({"seeds": [0]}, r"gates is missing"),
        ({"gates": ["max"], "model": "resnet"}, r"model 'resnet' is unknown"),
        ({"gates": ["max"], "train": {"device": "cpu"}}, r"train.device: .*use the command's --device"),
    ],
)
def test_a_bad_grid_names_the_key(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(raw)


def test_a_grid_takes_the_generated_data_sets_by_name():
    grid = parse_grid({"gates": ["max"], "datasets": ["mnist", "cluttered-mnist", "distractor-mnist"],
                       "model_settings": {"width": 8}})  # parsed only: no 60×60 training here
    assert [run_name(p) for p in grid.points()] == ["mnist/max-s0", "cluttered-mnist/max-s0",
                                                    "distractor-mnist/max-s0"]  # fmt: skip


def test_a_grid_device_is_refused_in_one_line_naming_the_flag(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text('gates = ["max"]\n[train]\ndevice = "cpu"\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.device" in err and "--device" in err, err


def test_the_cli_refuses_a_bad_grid_or_flags_in_one_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text('gates = ["max"]\ndatasets = ["cifar"]\n')
    assert main(["sweep", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "cifar" in err
    assert main(["sweep", str(tmp_path / "none.toml")]) == 2
    assert "no such grid file" in capsys.readouterr().err
    good = tmp_path / "grid.toml"
    good.write_text(GRID)
    assert main(["sweep", str(good), "--retries", "3"]) == 2
    assert capsys.readouterr().err.strip().endswith("--retries needs --executor ray")
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    for argv in (["sweep", str(good)], ["run", "pool-comparison"], ["reproduce"]):
        assert main([*argv, "--executor", "ray"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install 'gatepool[ray]'" in err, err


def test_intervals_are_students_t_over_the_seeds():
    rows = [{"dataset": "mnist", "gate": g, "seed": s, "settings": {}, "status": "ok", "test_acc": a}
            for g, accs in (("max", [0.90, 0.92, 0.94]), ("soft", [0.95])) for s, a in enumerate(accs)]
    rows.append({"dataset": "mnist", "gate": "soft", "seed": 1, "settings": {}, "status": "failed"})
    by_gate = {s["gate"]: s for s in summarize(rows)}
    # t(0.975, 2) = 4.302653 (a t table); s = 0.02
    assert by_gate["max"]["test_acc_mean"] == pytest.approx(0.92)
    assert by_gate["max"]["test_acc_ci95"] == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-6)
    assert by_gate["soft"]["n"] == 1 and by_gate["soft"]["test_acc_ci95"] is None  # failed: not counted


def refuse(name):
    raise ValueError(f"{name} is not JSON")


def test_results_json_is_strict_json_null_where_there_is_no_number(tmp_path, monkeypatch):
    monkeypatch.setattr(grid_mod, "train_task", fake_train)  # soft fails: no mean; max has one seed
    grid = parse_grid({"gates": ["max", "soft"], "seeds": [0], "model_settings": {"width": 8}})
    grid_mod.run_grid(grid, tmp_path)
    result = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)  # NaN: ValueError
    by_gate = {s["gate"]: s for s in result["summary"]}
    assert by_gate["max"]["test_acc_ci95"] is None and by_gate["max"]["test_acc_mean"] == pytest.approx(0.9)
    assert by_gate["soft"]["n"] == 0 and by_gate["soft"]["test_acc_mean"] is None


def fake_train(task):
    """A training's record without training; the soft gate's trainings fail."""
    if task.config["model_kwargs"]["pool"] == "soft":
        raise RuntimeError("out of memory")
    acc = 0.9 + 0.01 * task.config["seed"]
    return {"final": {"test_acc": acc, "test_loss": 0.3, "train_acc": acc, "train_loss": 0.3},
            "history": [{}], "seconds": 1.0}  # fmt: skip


def test_a_failed_training_is_a_row_of_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(grid_mod, "train_task", fake_train)
    grid = parse_grid({"gates": ["max", "soft"], "seeds": [0, 1], "model_settings": {"width": 8}})
    result = grid_mod.run_grid(grid, tmp_path)
    status = {(r["gate"], r["seed"]): (r["status"], r["error"]) for r in result["rows"]}
    assert status[("max", 1)] == ("ok", "")
    assert status[("soft", 0)] == ("failed", "RuntimeError: out of memory")
    table = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert len(table) == 4 and [r["status"] for r in table] == ["ok", "ok", "failed", "failed"]
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == result["rows"]
    assert (tmp_path / "accuracy.png").stat().st_size > 1000
    assert to_csv(result["rows"]).splitlines()[0].startswith("dataset,gate,seed,status")


def boom(x):
    if x == 1:
        raise ValueError("bad task")
    return x


@pytest.mark.slow
def test_the_local_pool_reports_failures_too():
    for jobs in (1, 2):  # in this process, and in 2 workers
        res = run_tasks(boom, [0, 1, 2], jobs, failures="return")
        assert res[0] == 0 and res[2] == 2 and isinstance(res[1], TaskFailed), jobs
        assert res[1].index == 1 and res[1].error == "ValueError: bad task"
    with pytest.raises(ValueError, match="bad task"):  # the default: raised, as before executors
        run_tasks(boom, [0, 1, 2], 1)


def test_the_docs_grid_is_a_valid_grid():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 1
    tomllib = pytest.importorskip("tomllib", reason="TOML needs Python >= 3.11")
    grid = parse_grid(tomllib.loads(blocks[0]))
    assert len(grid.points()) == 5 * 3 * 2 * 2


def test_no_experiment_setting_is_taken_for_an_executor_flag():
    """``gatepool run NAME --KEY VALUE``: argparse takes a prefix of a flag for the flag (``--task`` once
    matched ``--task-cpus``), so no setting may be a prefix of the executor's flags."""
    import argparse

    from gatepool.cli.args import add_executor
    from gatepool.lab.experiments import registry

    parser = argparse.ArgumentParser()
    add_executor(parser)
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"]
    keys = {k for e in registry().values() for k in (*e.setup, *(e.quick or {}))}
    clashes = [(k, f) for k in keys for f in flags if f.startswith("--" + k.replace("_", "-"))]
    assert not clashes


def test_run_takes_a_short_setting_for_a_setting_not_an_abbreviated_flag():
    from gatepool.cli import build_parser

    args, extra = build_parser().parse_known_args(["run", "sqrt-d", "--d", "4", "--task", "sort"])
    assert extra == ["--d", "4", "--task", "sort"] and args.device == "auto"
