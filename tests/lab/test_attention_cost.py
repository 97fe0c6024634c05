"""Experiment 17 (attention-cost), quick: the counts against t² computed here, the gate against softmax."""

import math

import torch

from gatepool.lab.experiments.attention_cost import materialized_gate
from gatepool.lab.harness import run_experiment


def claims(rec):
    return {c["id"]: c for c in rec["claims"]}


def test_attention_cost_reaches_the_lecture(tmp_path):
    rec = run_experiment("attention-cost", out=tmp_path, progress=False)
    c = claims(rec)
    assert rec["status"] == "complete"
    assert all(x["verdict"] == "ok" for x in c.values()), [x for x in c.values() if x["verdict"] != "ok"]
    for t in (144, 576, 196, 50176):
        assert c[f"gates-{t}"]["measured"] == t * t
        assert c[f"gates-{t}"]["basis"] == "lecture"
    for t in (144, 576, 196):  # materialised: t² float32 values
        assert c[f"weights-bytes-{t}"]["measured"] == 4 * t * t
    assert "weights-bytes-50176" not in c  # 10 GB: arithmetic only
    assert c["bytes-50176"]["measured"] == 4 * 50176**2
    assert abs(c["bytes-50176"]["measured"] / 1e9 - 10) < 0.5  # "about 10 GB"
    assert round(c["patch-saving"]["measured"]) == round((224**2 / (224 // 16) ** 2) ** 2) == 65536
    assert (tmp_path / "attention-cost" / "attention-cost.png").stat().st_size > 1000
    # a lecture value printed to two digits: 144² = 20,736 is 2.1e4, not 2.0e4
    assert c["gates-144"]["lecture"] == 2.1e4 and c["gates-144"]["tolerance"] == 500


def test_other_token_counts_use_t_squared(tmp_path):
    rec = run_experiment("attention-cost", overrides={"tokens": "100,3000", "materialize_max": "200"},
                         out=tmp_path, progress=False)
    c = claims(rec)
    assert {"gates-100", "gates-3000", "weights-bytes-100"} <= set(c) and "weights-bytes-3000" not in c
    assert c["gates-100"]["basis"] == "theory" and c["gates-100"]["expected"] == 10_000
    assert c["gates-3000"]["measured"] == 9_000_000 and c["gates-3000"]["verdict"] == "ok"
    assert c["weights-bytes-100"]["measured"] == 40_000


def test_materialized_gate_is_the_softmax_of_the_scores():
    t, d = 30, 16
    w = materialized_gate(t, dim=d, seed=3)
    gen = torch.Generator().manual_seed(3)
    q, k, _ = (torch.randn(1, 1, t, d, generator=gen) for _ in range(3))
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    expected = torch.exp(scores - scores.amax(-1, keepdim=True))
    expected = expected / expected.sum(-1, keepdim=True)
    assert w.shape == (1, 1, t, t) and w.dtype == torch.float32
    assert torch.allclose(w.double(), expected, atol=1e-6)


def test_bad_setting_is_reported(tmp_path):
    rec = run_experiment("attention-cost", overrides={"patch": "15"}, out=tmp_path, progress=False)
    assert rec["status"] == "error" and "patch" in rec["error"]
