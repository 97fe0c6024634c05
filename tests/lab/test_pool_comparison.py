"""Experiment 12 (pool-comparison), the headline, on a tiny grid: two gates × two seeds, one epoch.

What is pinned down: one training folder per (gate, seed), each a finished ``gatepool.train`` run; the
claims computed from those runs' own results (recomputed here from the files, not from the record);
the learned τ read from the soft-learned run's history; and a rerun that trains nothing again.
"""

import json
import statistics

import pytest

from gatepool.lab.harness import run_experiment
from gatepool.utils.threads import num_threads

TINY = {
    "pools": "max,soft-learned",
    "seeds": "0,1",
    "epochs": "1",
    "train_size": "256",
    "test_size": "200",
    "batch_size": "64",
}
pytestmark = pytest.mark.slow  # four trainings: about a second each


@pytest.fixture(autouse=True)
def one_thread():
    with num_threads(1):
        yield


def test_pool_comparison_claims_come_from_its_trainings(tmp_path):
    rec = run_experiment("pool-comparison", profile="quick", overrides=TINY, out=tmp_path, progress=False)
    assert rec["status"] == "complete", rec["error"]
    folder = tmp_path / "pool-comparison"
    acc = {}
    for pool in ("max", "soft-learned"):
        for seed in (0, 1):
            run = json.loads((folder / f"{pool}-s{seed}" / "results.json").read_text())
            assert run["config"]["model_kwargs"] == {"pool": pool} and run["config"]["seed"] == seed
            assert run["config"]["train_size"] == 256 and len(run["history"]) == 1
            assert (folder / f"{pool}-s{seed}" / "model.safetensors").is_file()
            acc.setdefault(pool, []).append(100 * run["final"]["test_acc"])
    assert rec["data"]["test_acc"] == {p: pytest.approx(a) for p, a in acc.items()}
    claims = {c["id"]: c for c in rec["claims"]}
    means = [statistics.fmean(a) for a in acc.values()]
    assert claims["spread"]["measured"] == pytest.approx(max(means) - min(means))
    seed_spread = statistics.fmean(max(a) - min(a) for a in acc.values())
    assert claims["seed-spread"]["measured"] == pytest.approx(seed_spread)
    if seed_spread > 0:
        ratio = (max(means) - min(means)) / seed_spread
        assert claims["gates-within-seeds"]["measured"] == pytest.approx(ratio)

    taus = []
    for seed in (0, 1):
        run = json.loads((folder / f"soft-learned-s{seed}" / "results.json").read_text())
        last = run["history"][-1]
        per_pool = [v for k, v in last.items() if k.startswith("tau_")]
        assert len(per_pool) == 2 and all(len(t) > 1 for t in per_pool)  # both pools, one τ per channel
        taus += [t for ts in per_pool for t in ts]
    assert claims["tau-min"]["measured"] == pytest.approx(min(taus))
    assert claims["tau-max"]["measured"] == pytest.approx(max(taus))
    assert min(taus) != max(taus)  # τ moved, per channel: the τ claims read a learned value
    assert (folder / "pool-comparison.png").is_file() and (folder / "pool-comparison-tau.png").is_file()


def test_pool_comparison_rerun_trains_nothing_again(tmp_path):
    first = run_experiment("pool-comparison", profile="quick", overrides=TINY, out=tmp_path, progress=False)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "pool-comparison").glob("*/model.safetensors")}
    assert len(stamps) == 4
    again = run_experiment("pool-comparison", profile="quick", overrides=TINY, out=tmp_path, progress=False)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # finished runs are read, not retrained
    assert [c["measured"] for c in again["claims"]] == [c["measured"] for c in first["claims"]]


def test_the_null_ratio_and_the_push_turns():
    from gatepool.lab.experiments.pool_comparison import null_ratio_percentile, push_turns, spread_ratio

    assert spread_ratio({"a": [1.0, 2.0], "b": [2.0, 3.0]}) == pytest.approx(1.0)  # means 1.5, 2.5; ranges 1
    # two gates, two seeds each: the gap between two means of 2 over the mean range of 2 has a wide null
    wide, narrow = null_ratio_percentile(2, 2), null_ratio_percentile(6, 3)
    assert wide > narrow > 1.0
    # the percentile is the percentile: about 5% of draws with no gate effect exceed it
    import numpy as np

    x = np.random.default_rng(1).standard_normal((4000, 6, 3))
    m = x.mean(-1)
    r = (m.max(-1) - m.min(-1)) / (x.max(-1) - x.min(-1)).mean(-1)
    assert 0.03 < (r > narrow).mean() < 0.07
    assert push_turns([1.0, 1.02, 1.01]) and push_turns([1.0, 0.98, 0.99, 0.985])
    assert not push_turns([1.0, 1.01, 1.02]) and not push_turns([1.0, 1.0, 1.0])
    assert not push_turns([1.0, 1.01, 1.005, 1.02])  # a wiggle on the way, no turn: it ends at its farthest
