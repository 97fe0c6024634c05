"""Experiment 14 (sqrt-d), quick, on small inputs."""

import math

from gatepool.lab.harness import run_experiment


def test_sqrt_d_quick_reaches_its_verdicts(tmp_path):
    rec = run_experiment("sqrt-d", profile="quick", overrides={"d": "1,16,256"}, out=tmp_path, progress=False)
    claims = {c["id"]: c for c in rec["claims"]}
    assert set(claims) == {f"{k}-d{d}" for d in (1, 16, 256) for k in ("std", "max-gate", "max-gate-scaled")}
    assert all(c["verdict"] == "ok" for c in claims.values()), [
        c for c in claims.values() if c["verdict"] != "ok"
    ]
    for d in (1, 16, 256):  # independent of the lecture's numbers: std ≈ √d, scaled gates stay soft
        assert abs(claims[f"std-d{d}"]["measured"] / math.sqrt(d) - 1) < 0.05
        assert claims[f"max-gate-scaled-d{d}"]["measured"] < 0.1
    assert claims["max-gate-d256"]["measured"] > 0.8
    assert (tmp_path / "sqrt-d" / "sqrt-d.png").stat().st_size > 1000


def test_sqrt_d_off_lecture_uses_theory_for_std_and_measures_gates_only(tmp_path):
    rec = run_experiment(
        "sqrt-d", profile="quick", overrides={"d": "9", "tokens": "30"}, out=tmp_path, progress=False
    )
    claims = {c["id"]: c for c in rec["claims"]}
    assert claims["std-d9"]["basis"] == "theory" and claims["std-d9"]["expected"] == 3.0
    assert claims["std-d9"]["verdict"] == "ok"
    assert claims["max-gate-d9"]["lecture"] is None and claims["max-gate-d9"]["verdict"] == "not run"
    assert claims["max-gate-d9"]["measured"] > 1 / 30
