"""Experiments 8–11 (soft-gate, temperature-dial, soft-gradient, gradient-share), quick, on small inputs.

The verdicts compare our layers' outputs with the lecture's numbers; the extra assertions here compare
them with the closed form computed independently in the test.
"""

import math

import pytest

from gatepool.lab.harness import run_experiment


def softmax(v, tau=1.0):
    m = max(v)
    e = [math.exp((x - m) / tau) for x in v]
    return [x / sum(e) for x in e]


def claims(rec):
    return {c["id"]: c for c in rec["claims"]}


# The lecture's window, unrounded: ln of the e^v it prints (31, 61, 4,647, 9,054)
V = [math.log(e) for e in (31, 61, 4647, 9054)]


def test_soft_gate(tmp_path):
    c = claims(run_experiment("soft-gate", out=tmp_path, progress=False))
    assert all(x["verdict"] == "ok" for x in c.values())
    g = softmax(V)
    assert c["soft-out"]["measured"] == pytest.approx(sum(a * b for a, b in zip(g, V)), abs=1e-4)
    assert c["soft-gate-4"]["measured"] == pytest.approx(g[3], abs=1e-5)
    assert c["soft-gate-4"]["tolerance"] < 0.00051  # half a unit of the printed .656, not more
    assert c["exp-sum"]["measured"] == pytest.approx(31 + 61 + 4647 + 9054, abs=0.01)
    assert c["exp-3"]["measured"] == pytest.approx(math.exp(8.44), rel=1e-5)
    # every number restates the lecture's arithmetic on its window (e^v, their sum, the max's pick, and the
    # softmax that our layer computes, which no correct soft pool misses): none is counted as measured
    assert all(x["source"] == "arithmetic" and x["ref"] for x in c.values())


def test_the_displayed_window_misses_the_lecture_numbers(tmp_path):
    """On the two-decimal display, ∂out/∂v₃ and the fourth gate miss the printed digits: the slip was ours."""
    rec = run_experiment("soft-gradient", overrides={"window": "3.44,4.11,8.44,9.11"}, out=tmp_path,
                         progress=False)  # fmt: skip
    c = claims(rec)
    assert c["soft-3"]["measured"] == pytest.approx(0.1985, abs=1e-4)
    assert abs(c["soft-3"]["measured"] - 0.200) > 0.0005


def test_soft_gate_other_window_uses_the_closed_form(tmp_path):
    rec = run_experiment("soft-gate", overrides={"window": "0,1,2"}, out=tmp_path, progress=False)
    c = claims(rec)
    on_window = {"max-out", "soft-out", "soft-gate-1", "soft-gate-2", "soft-gate-3", "exp-sum"}
    assert set(c) == on_window | {f"exp-{j}" for j in range(1, 5)}  # the printed window's e^v stay checked
    assert all(c[k]["basis"] == "theory" and c[k]["verdict"] == "ok" for k in on_window)
    assert c["exp-sum"]["measured"] == pytest.approx(1 + math.e + math.e**2, rel=1e-5)
    assert c["max-out"]["measured"] == 2.0


def test_temperature_dial(tmp_path):
    rec = run_experiment("temperature-dial", out=tmp_path, progress=False)
    c = claims(rec)
    assert all(x["verdict"] == "ok" for x in c.values()), c
    assert c["out-tau2"]["measured"] == pytest.approx(
        sum(a * b for a, b in zip(softmax(V, 2.0), V)), abs=1e-4
    )
    assert c["gate3-tau0.5"]["measured"] == pytest.approx(softmax(V, 0.5)[2], abs=1e-5)
    assert c["gate1-tau2"]["measured"] == pytest.approx(softmax(V, 2.0)[0], abs=1e-5)
    assert (tmp_path / "temperature-dial" / "temperature-dial.png").is_file()


def test_soft_gradient(tmp_path):
    rec = run_experiment("soft-gradient", out=tmp_path, progress=False)
    c = claims(rec)
    assert [c[f"hard-{j}"]["measured"] for j in range(1, 5)] == [0, 0, 0, 1]
    g = softmax(V)
    out = sum(a * b for a, b in zip(g, V))
    for j in range(4):
        assert c[f"soft-{j + 1}"]["measured"] == pytest.approx(g[j] * (1 + V[j] - out), abs=1e-5)
    assert all(x["verdict"] == "ok" for x in c.values())  # on the unrounded window every digit holds
    assert (tmp_path / "soft-gradient" / "soft-gradient.png").is_file()


def test_gradient_share_quick(tmp_path):
    rec = run_experiment(
        "gradient-share", overrides={"batch": "16", "pools": "max,soft,avg"}, out=tmp_path, progress=False
    )
    c = claims(rec)
    assert c["max"]["measured"] == pytest.approx(0.25, abs=0.01)
    assert c["soft"]["measured"] > 0.99 and c["avg"]["measured"] > 0.99
    assert all(x["verdict"] == "ok" for x in c.values())
