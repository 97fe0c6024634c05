"""`gatepool probe` end to end on N(0, 1) images (no data set needed): JSON, table, figures."""

from __future__ import annotations

import json

import pytest

from gatepool.cli import main


@pytest.mark.slow
def test_probe_cli_json_and_figures(tmp_path, capsys):
    out = tmp_path / "probe"
    rc = main(["probe", "--model", "residual_cnn", "--pool", "max", "--data", "noise", "--batch", "16",
               "--seed", "0", "--out", str(out), "--json"])
    assert rc == 0
    record = json.loads(capsys.readouterr().out)
    assert record["complete"] and record["setup"]["batch"] == 16 and record["backward"] == "unit-noise"
    names = [m["name"] for m in record["modules"]]
    assert names[0] == "(input)" and names[-1] == "(output)" and "block1.conv1" in names
    stem = next(m for m in record["modules"] if m["name"] == "stem")
    assert stem["ideal"]["var"] > 0 and stem["forward"]["var"] > 0 and stem["ratio"]["var"] > 0
    assert stem["backward"]["zero_share"] == 0.75  # max pool 2×2 after it: exactly one winner in four
    # the correlation-aware prediction: the stem is linear, its variance the measured one but for the
    # stationary correlation it assumes where taps meet the border (2e-4 here)
    assert abs(stem["predicted"]["var"] / stem["forward"]["var"] - 1) < 1e-3
    assert stem["predicted"]["grad_e2"] > 0 and set(stem["measured_corr"]) == {"1", "2"}
    saved = json.loads((out / "probe.json").read_text())
    assert [m["name"] for m in saved["modules"]] == names
    assert len(next(m for m in saved["modules"] if m["name"] == "stem")["maps"]["var"]) == 28  # (28, 28)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "probe_layers.png" in pngs and "probe_histograms.png" in pngs and "probe_stencils.png" in pngs
    assert any(p.startswith("probe_padding_") for p in pngs)
    assert all((out / p).stat().st_size > 1000 for p in pngs)


def test_probe_cli_table(capsys):
    assert main(["probe", "--data", "noise", "--batch", "4", "--backward", "loss"]) == 0
    text = capsys.readouterr().out
    assert "Var ideal" in text and "block3.conv2" in text and "cross-entropy (sum" in text
    assert "predicted" in text.splitlines()[0]


def test_probe_cli_model_without_pools_needs_no_pool(capsys):
    # --pool is passed only when given: vit_mnist takes no pool argument
    assert main(["probe", "--model", "vit_mnist", "--data", "noise", "--batch", "2", "--json",
                 "--no-predicted"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["setup"]["model"] == "vit_mnist" and record["setup"]["pool"] is None
