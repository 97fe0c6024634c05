"""``gatepool probe-check`` end to end on one tiny timm model (``make test-vision``); the whole run:
docs/probe.md's probe-check table."""

from __future__ import annotations

import json

import pytest

from gatepool.cli import main

pytest.importorskip("torchvision")
pytest.importorskip("timm")


def test_probe_check_one_tiny_model(tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = main(["probe-check", "--models", "timm:test_resnet", "--size", "32", "--batch", "4", "--seed", "0",
               "--json", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    record = json.loads(out.read_text())
    (r,) = record["results"]
    assert rc == (1 if r["error"] else 0)
    assert r["model"] == "timm:test_resnet" and r["size"] == 32 and r["modules"] > 10
    assert 0 < r["with_rule"] <= r["modules"] and r["forward"] <= r["with_rule"] and r["seconds"] > 0
    if r["with_rule"] < r["modules"]:  # the first row without a prediction, named with the walk's reason
        row, _, why = r["no_rule"].partition(": ")
        assert row.endswith(")") and why
    assert "`gatepool probe-check --models timm:test_resnet --size 32 --batch 4 --seed 0" in text
    assert "torch 2." in text and "timm 1." in text and "| timm:test_resnet | 32 |" in text
