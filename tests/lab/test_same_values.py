"""What ``make reproduce`` shows, bit for bit: the deterministic quick experiments measured again give the
committed ``results/quick`` record's values and verdicts exactly (every claim's measured and expected value
and verdict, as the record keeps them; the notes quote rounding errors, which differ by machine). The
experiments here run in seconds and read no clock; those that time something, train on several threads or
run long are left to the kill test and the reproduction itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatepool.lab.harness import run_experiment

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "results" / "quick" / "results.json").read_text(encoding="utf-8"))
COMMITTED = {rec["name"]: rec for rec in RECORD["experiments"]}
FAST = ["conv-forward", "conv-backward", "padding-map", "he-init", "batchnorm", "weight-uses", "max-normals",
        "pool-compound", "stream-skew", "head-chain", "network-forward", "soft-gate", "soft-gradient",
        "temperature-dial", "sqrt-d", "attention-maps"]


def _kept(claim: dict) -> tuple:
    return claim["id"], claim.get("measured"), claim.get("expected"), claim.get("verdict")


@pytest.mark.parametrize("name", FAST)
def test_quick_values_as_committed(name, tmp_path):
    record = run_experiment(name, profile="quick", out=tmp_path, progress=False, device="cpu")
    assert [_kept(c) for c in record["claims"]] == [_kept(c) for c in COMMITTED[name]["claims"]]
