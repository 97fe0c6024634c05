"""Experiment 17 (attention-cost), quick: the lecture's table as arithmetic, the gate's memory measured."""

import math

import pytest

from gatepool.lab.experiments.attention_cost import fit_exponent, measure_cost
from gatepool.lab.harness import run_experiment


def claims(rec):
    return {c["id"]: c for c in rec["claims"]}


def test_attention_cost(tmp_path):
    rec = run_experiment("attention-cost", out=tmp_path, progress=False)
    c = claims(rec)
    assert rec["status"] == "complete"
    assert all(x["verdict"] == "ok" for x in c.values()), [x for x in c.values() if x["verdict"] != "ok"]
    for t in (144, 576, 196, 50176):
        assert c[f"arithmetic-{t}"]["measured"] == t * t and c[f"arithmetic-{t}"]["source"] == "arithmetic"
    assert c["bytes-50176"]["measured"] == 4 * 50176**2
    assert round(c["patch-saving"]["measured"]) == 65536
    # a lecture value printed to two digits: 144² = 20,736 is 2.1e4, not 2.0e4
    assert c["arithmetic-144"]["lecture"] == 2.1e4 and c["arithmetic-144"]["tolerance"] == 500
    # measured: the explicit gate's memory grows as t², SDPA's far slower
    assert c["memory-exponent-explicit"]["measured"] == pytest.approx(2.0, abs=0.01)
    assert c["memory-exponent-explicit"]["tolerance"] < 0.01
    assert c["memory-exponent-sdpa"]["measured"] < 1.5
    assert (tmp_path / "attention-cost" / "attention-cost-measured.png").stat().st_size > 1000


def test_the_explicit_gate_holds_t_squared_floats():
    rows = measure_cost([1024, 2048], rounds=1)
    peak = {(r["tokens"], r["way"]): r["peak_bytes"] for r in rows}
    for t in (1024, 2048):
        assert peak[(t, "explicit")] >= 4 * t * t  # at least the (t, t) float32 gate itself
        assert peak[(t, "sdpa")] < 4 * t * t / 2  # never the gate
    assert all(r["seconds"] > 0 for r in rows)


def test_fit_exponent():
    t = [100, 200, 400, 800]
    slope, err = fit_exponent(t, [3.0 * x**2 for x in t])
    assert slope == pytest.approx(2.0, abs=1e-9) and err < 1e-9
    slope, err = fit_exponent(t, [x**2 + 50 * x for x in t])  # a bent curve: the error says so
    assert slope < 2 and err > 0.05 and abs(slope - 2) < err + 0.2
    with pytest.raises(ValueError, match="three"):
        fit_exponent([1, 2], [1, 4])
    assert math.isfinite(slope)


def test_other_token_counts_use_t_squared(tmp_path):
    rec = run_experiment("attention-cost", overrides={"tokens": "100,3000", "max_tokens": "576"},
                         out=tmp_path, progress=False)  # fmt: skip
    c = claims(rec)
    assert c["arithmetic-100"]["basis"] == "theory" and c["arithmetic-100"]["expected"] == 10_000
    assert c["arithmetic-3000"]["measured"] == 9_000_000 and c["arithmetic-3000"]["verdict"] == "ok"


def test_bad_setting_is_reported(tmp_path):
    rec = run_experiment("attention-cost", overrides={"patch": "15"}, out=tmp_path, progress=False)
    assert rec["status"] == "error" and "patch" in rec["error"]


def test_time_calls_interleaves_rounds_at_the_torch_thread_count():
    """The timing every attention measurement uses: torch.utils.benchmark.Timer, one sample a way a round,
    the ways taking turns, at torch's thread count (the Timer's own default is 1), in seconds."""
    import time

    import torch

    from gatepool.lab.bench.attention import time_calls

    calls, threads = [], []

    def way(name, seconds):
        def fn(x):
            calls.append(name)
            threads.append(torch.get_num_threads())
            time.sleep(seconds * x)

        return fn

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        times = time_calls({"a": way("a", 0.004), "b": way("b", 0.001)}, (1.0,), rounds=3, warmup=1)
    finally:
        torch.set_num_threads(before)
    assert set(threads) == {2}
    assert calls[:2] == ["a", "b"]  # the warm-up calls, then the rounds
    turns = [c for i, c in enumerate(calls[2:]) if i == 0 or calls[2 + i - 1] != c]  # runs of one way
    assert turns == ["a", "b"] * 3
    assert [len(times["a"]), len(times["b"])] == [3, 3]
    assert all(0.004 <= s < 0.04 for s in times["a"]) and all(0.001 <= s < 0.01 for s in times["b"])
