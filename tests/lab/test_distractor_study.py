"""distractor-study: the registered plan it checks, its readings, its budget rule and a tiny run."""

import shutil
import subprocess

import pytest

from gatepool.lab.claims import Context
from gatepool.lab.experiments import distractor_study as ds
from gatepool.lab.experiments import registry
from gatepool.lab.harness import get
from gatepool.lab.stats import bonferroni, welch_difference


def test_the_plan_in_the_checkout_is_the_registered_one():
    assert ds.plan_sha256() == ds.PLAN_SHA256


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_plan_was_committed_alone_before_the_study():
    root = ds.PLAN.parents[1]

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)

    shown = git("show", f"{ds.PLAN_COMMIT}:results-beyond/distractor-plan.md")
    if shown.returncode != 0:
        pytest.skip(f"the plan's commit is not in this checkout ({shown.stderr.strip()})")
    import hashlib

    assert hashlib.sha256(shown.stdout.encode()).hexdigest() == ds.PLAN_SHA256
    files = git("show", "--name-only", "--format=", ds.PLAN_COMMIT).stdout.split()
    assert files == ["results-beyond/distractor-plan.md"]  # on its own: no code, no results with it
    code = "src/gatepool/lab/experiments/distractor_study.py"
    study = git("log", "--format=%H", "--diff-filter=A", "--", code)
    added = study.stdout.split()
    assert added, "the study's code has a commit"
    assert git("merge-base", "--is-ancestor", ds.PLAN_COMMIT, added[-1]).returncode == 0


def test_a_changed_plan_is_refused(tmp_path, monkeypatch):
    changed = tmp_path / "plan.md"
    changed.write_text(ds.PLAN.read_text().replace("10 epochs", "12 epochs"))
    monkeypatch.setattr(ds, "PLAN", changed)
    exp = get("distractor-study")
    ctx = Context(exp, "full", exp.resolve_setup("full"), tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match=r"is not the registered plan .* `git checkout 3953a732c589"):
        ds._check_plan(ctx)


def test_registered_beyond_the_lecture_with_the_plans_setup():
    assert "distractor-study" in registry() and "distractor-study" not in registry(beyond=False)
    exp = get("distractor-study")
    full = exp.resolve_setup("full")
    assert full["pools"] == ["max", "soft", "attention", "conv"] and full["seeds"] == [0, 1, 2, 3, 4]
    assert (full["train_size"], full["test_size"], full["epochs"]) == (None, None, 10)
    recipe = (full["optimizer"], full["lr"], full["schedule"], full["batch_size"])
    assert recipe == ("adam", 3e-3, "onecycle", 128)
    assert full["margin"] == 2.0 and full["confidence"] == 0.95
    assert [c.id for c in exp.claims(full)] == ["attention-helps", "no-gate-matters"]
    assert all(c.source == "beyond" for c in exp.claims(full))
    assert len(exp.resolve_setup("quick")["seeds"]) == 1  # a smoke run: no verdict


def test_the_epoch_count_is_the_largest_within_the_bound():
    full = get("distractor-study").resolve_setup("full")
    assert ds.estimate_seconds(full) <= ds.WALL_BOUND_S < ds.estimate_seconds({**full, "epochs": 11})
    assert ds.estimate_seconds(full) == pytest.approx(21324, abs=1)  # the plan's arithmetic


@pytest.mark.parametrize(("low", "high", "expected"), [
    (0.1, 5.0, "helps"), (-5.0, -0.1, "hurts"), (-1.9, 2.0, "does not matter"),
    (-2.0, 1.0, "does not matter"),
    (-2.1, 1.0, "undecided"), (-1.0, 2.5, "undecided"), (-30.0, 40.0, "undecided"), (None, None, None),
])
def test_readings(low, high, expected):
    assert ds.reading(low, high, 2.0) == expected


def _context(tmp_path, seeds):
    exp = get("distractor-study")
    return Context(exp, "full", {**exp.resolve_setup("full"), "seeds": seeds}, tmp_path, progress=False)


def test_judge_reads_family_wise_intervals(tmp_path):
    ctx = _context(tmp_path, [0, 1, 2, 3, 4])
    acc = {"max": [30.0, 31.0, 29.0, 30.5, 29.5], "soft": [30.2, 30.8, 29.4, 30.1, 29.9],
           "attention": [45.0, 46.0, 44.0, 45.5, 44.5], "conv": [10.0, 50.0, 30.0, 20.0, 40.0]}
    out = ds._judge(ctx, acc)
    d = welch_difference(acc["attention"], acc["max"], bonferroni(0.95, 3))
    assert (out["attention"]["family_low"], out["attention"]["family_high"]) == pytest.approx((d.low, d.high))
    readings = [out[p]["reading"] for p in ("soft", "attention", "conv")]
    assert readings == ["does not matter", "helps", "undecided"]
    helps = ctx.claims["attention-helps"]
    assert helps["verdict"] == "ok" and helps["measured"] == pytest.approx(d.low, abs=1e-3)
    assert "helps" in helps["note"]
    none = ctx.claims["no-gate-matters"]
    assert none["measured"] == 2 and none["verdict"] == "off" and "conv: undecided" in none["note"]


def test_judge_no_gate_matters_and_one_seed(tmp_path):
    ctx = _context(tmp_path, [0, 1, 2])
    same = {p: [30.0, 30.4, 29.8] for p in ds.POOLS}
    ds._judge(ctx, same)
    assert ctx.claims["no-gate-matters"]["verdict"] == "ok"
    assert ctx.claims["attention-helps"]["verdict"] == "off"
    ctx = _context(tmp_path, [0])
    ds._judge(ctx, {p: [30.0] for p in ds.POOLS})
    assert {c["verdict"] for c in ctx.claims.values()} == {"not run"}


def test_ink_masks_mark_the_bars_and_the_digit_of_the_stored_canvases(small_canvas):
    small_canvas(64, 32)
    from gatepool.data import load

    canvases, bars, digit = ds.ink_masks(8)
    stored = load(ds.DATA, "test").images[:8].numpy()
    assert (canvases == stored).all() and bars.shape == digit.shape == (8, 60, 60)
    assert (stored[bars] == 255).all() and not (bars & digit).any()
    assert 0 < stored[digit].max() <= 102  # the digit dimmed to 2/5 of its ink
    assert ((stored > 0) <= (bars | digit)).all()  # every pixel with ink is a bar's or the digit's


def test_weight_shares():
    import numpy as np
    import torch

    bars = np.zeros((2, 4, 4), bool)
    digit = np.zeros((2, 4, 4), bool)
    bars[:, 0, :] = True  # a quarter of the area
    digit[:, 1, :2] = True  # an eighth
    maps = torch.zeros(2, 4, 4)
    maps[0, 0, 0], maps[0, 1, 0] = 3.0, 1.0  # canvas 0: 3/4 on a bar, 1/4 on the digit
    maps[1] = 1.0  # canvas 1: uniform
    s = ds.weight_shares(maps, bars, digit)
    assert s["bar_weight"] == pytest.approx((0.75 + 0.25) / 2)
    assert s["digit_weight"] == pytest.approx((0.25 + 0.125) / 2)
    assert (s["bar_pixels"], s["digit_pixels"]) == (0.25, 0.125)


@pytest.mark.slow
def test_tiny_run_resumes_and_reads_the_weights(tmp_path, small_canvas):
    small_canvas(128, 64)
    from gatepool.lab.harness import run_experiment
    from gatepool.utils.threads import num_threads

    tiny = {"seeds": "0,1", "epochs": "1", "train_size": "64", "test_size": "32", "batch_size": "32",
            "examples": "2", "share_canvases": "16"}
    with num_threads(1):
        rec = run_experiment("distractor-study", profile="full", overrides=tiny, out=tmp_path / "out",
                             progress=False)
    assert rec["status"] == "complete", rec["error"]
    acc = rec["data"]["test_acc"]
    assert set(acc) == set(ds.POOLS) and all(len(a) == 2 for a in acc.values())
    assert rec["data"]["plan"]["commit"] == ds.PLAN_COMMIT
    assert set(rec["data"]["weight_shares"]) == {"attention", "soft"}
    assert {f.split("/")[-1] for f in rec["figures"]} == {"distractor-accuracy.png", "distractor-curves.png",
                                                           "distractor-weights.png"}
    folder = tmp_path / "out" / "distractor-study"
    stamps = {p: p.stat().st_mtime_ns for p in folder.glob("*/results.json")}
    assert len(stamps) == 8
    with num_threads(1):
        again = run_experiment("distractor-study", profile="full", overrides=tiny, out=tmp_path / "out",
                               progress=False)
    assert again["data"]["test_acc"] == rec["data"]["test_acc"]
    assert {p: p.stat().st_mtime_ns for p in folder.glob("*/results.json")} == stamps  # nothing retrained
