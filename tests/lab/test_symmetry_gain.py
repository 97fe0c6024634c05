"""symmetry-gain: registered beyond the lecture, its batches, intervals and verdicts, and the quick run."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from gatepool.lab.claims import Context
from gatepool.lab.experiments import registry
from gatepool.lab.experiments import symmetry_gain as sg
from gatepool.lab.harness import get, run_experiment
from gatepool.lab.stats import welch_difference
from gatepool.utils.threads import num_threads


def test_registered_beyond_the_lecture_with_the_issues_setup():
    assert "symmetry-gain" in registry() and "symmetry-gain" not in registry(beyond=False)
    exp = get("symmetry-gain")
    full = exp.resolve_setup("full")
    assert full["models"] == ["p4cnn", "z2cnn"] and full["fractions"] == [0.01, 0.1, 1.0]
    assert len(full["seeds"]) >= 3 and full["train_size"] == 12000 and full["test_size"] == 10000
    assert [sg.subset_size(full, f) for f in full["fractions"]] == [120, 1200, 12000]
    ids = [c.id for c in exp.claims(full)]
    assert ids == ["p4-invariant", "z2-not-invariant", "gain-1%", "gain-10%", "gain-100%", "worth-the-data",
                   "anchor-ratio"]
    assert all(c.source == "beyond" and c.ref for c in exp.claims(full))
    assert len(exp.resolve_setup("quick")["seeds"]) == 2  # intervals in the quick run too


def test_the_full_setup_is_sized_for_about_25_minutes_on_one_thread():
    full = get("symmetry-gain").resolve_setup("full")
    p4 = full["epochs"] * (12000 / 700 + 2000 / 1100) + 10000 / 1100  # per training, at the reserved rates
    z2 = full["epochs"] * (12000 / 2300 + 2000 / 4400) + 10000 / 4400
    assert sg.estimate_seconds(full) == pytest.approx(9 * (p4 + z2))
    assert sg.estimate_seconds(full) <= 25 * 60


def test_cycled_batches_are_permutations_in_turn_and_repeat_a_small_subset():
    x, y = torch.arange(10.0).view(10, 1), torch.arange(10)
    batches = sg.cycled_batches(torch.Generator().manual_seed(0), x=x, y=y, batch_size=4)
    seen = torch.cat([next(batches)[1] for _ in range(5)])  # 20 labels: two whole permutations
    assert sorted(seen[:10].tolist()) == sorted(seen[10:].tolist()) == list(range(10))
    again = sg.cycled_batches(torch.Generator().manual_seed(0), x=x, y=y, batch_size=4)
    assert torch.equal(torch.cat([next(again)[1] for _ in range(5)]), seen)  # the generator alone decides
    xb, yb = next(sg.cycled_batches(torch.Generator().manual_seed(1), x=x[:3], y=y[:3], batch_size=7))
    assert len(yb) == 7 and set(yb.tolist()) == {0, 1, 2} and torch.equal(xb[:, 0].long(), yb)


def test_interval_is_the_t_interval_of_the_mean():
    values = [3.1, 2.7, 3.6]
    c = sg.interval(values, 0.95)
    low, high = scipy_stats.t.interval(0.95, 2, loc=np.mean(values), scale=scipy_stats.sem(values))
    expected = (np.mean(values), np.std(values, ddof=1), low, high)
    assert (c["mean"], c["std"], c["low"], c["high"]) == pytest.approx(expected)
    assert sg.interval([3.0], 0.95)["low"] is None


def _context(tmp_path):
    exp = get("symmetry-gain")
    return Context(exp, "full", exp.resolve_setup("full"), tmp_path, progress=False)


def test_verdicts_of_the_gains(tmp_path):
    ctx = _context(tmp_path)
    errors = {"p4cnn": {0.01: [20.0, 22.0, 21.0], 0.1: [6.0, 9.0, 7.0], 1.0: [2.5, 2.6, 2.4]},
              "z2cnn": {0.01: [19.0, 24.0, 20.0], 0.1: [12.0, 13.0, 12.5], 1.0: [5.0, 5.2, 4.9]}}
    sg._judge_gains(ctx, errors)
    c = ctx.claims
    d = welch_difference(errors["z2cnn"][1.0], errors["p4cnn"][1.0], 0.95)
    assert c["gain-100%"]["verdict"] == "ok" and c["gain-100%"]["measured"] == pytest.approx(d.low, abs=1e-4)
    assert c["gain-10%"]["verdict"] == "ok"
    assert c["gain-1%"]["verdict"] == "undecided" and "holds 0" in c["gain-1%"]["note"]
    gap = np.mean([6.0, 9.0, 7.0]) - np.mean([5.0, 5.2, 4.9])
    assert c["worth-the-data"]["measured"] == pytest.approx(gap)
    assert c["worth-the-data"]["verdict"] == "off"  # 7.33% on a tenth against 5.03% on all
    assert c["anchor-ratio"]["measured"] == pytest.approx(2.5 / 5.033, abs=1e-4)
    assert c["anchor-ratio"]["verdict"] == "ok"
    worse = {"p4cnn": {f: [v + 10 for v in e] for f, e in errors["z2cnn"].items()}, "z2cnn": errors["p4cnn"]}
    sg._judge_gains(ctx, worse)
    assert ctx.claims["gain-100%"]["verdict"] == "off" and ctx.claims["anchor-ratio"]["verdict"] == "off"


def test_rotation_change_tells_the_nets_apart():
    from gatepool.models import create_model

    torch.manual_seed(0)
    x = torch.randn(8, 1, 28, 28)
    p4, z2 = sg.rotation_change(create_model("p4cnn"), x), sg.rotation_change(create_model("z2cnn"), x)
    assert p4["relative"] < 1e-5 and p4["flips"] == 0
    assert z2["relative"] > 1e-2


@pytest.mark.slow
def test_quick_run_from_its_trainings(tmp_path):
    with num_threads(1):
        rec = run_experiment("symmetry-gain", profile="quick", out=tmp_path / "out", progress=False)
    assert rec["status"] == "complete", rec["error"]
    folder = tmp_path / "out" / "symmetry-gain"
    quick = get("symmetry-gain").resolve_setup("quick")
    for model in ("p4cnn", "z2cnn"):
        for pct, n in (("1", 120), ("10", 1200), ("100", 12000)):
            for seed in (0, 1):
                run = json.loads((folder / f"{model}-{pct}pct-s{seed}" / "results.json").read_text())
                assert run["config"]["model"] == model and run["config"]["train_size"] == n
                assert run["config"]["steps_per_epoch"] == quick["epoch_images"] // quick["batch_size"]
                assert len(run["history"]) == quick["epochs"] and run["config"]["threads"] == 1
    claims = {c["id"]: c for c in rec["claims"]}
    assert claims["p4-invariant"]["verdict"] == "ok" and claims["z2-not-invariant"]["verdict"] == "ok"
    errors = rec["data"]["test_error"]
    assert set(errors) == {"p4cnn", "z2cnn"} and len(errors["p4cnn"]["100%"]["values"]) == 2
    assert all(0 <= v <= 100 for m in errors.values() for c in m.values() for v in c["values"])
    assert not math.isnan(claims["gain-100%"]["measured"])
    assert [f.split("/")[-1] for f in rec["figures"]] == ["symmetry-gain.png"]
