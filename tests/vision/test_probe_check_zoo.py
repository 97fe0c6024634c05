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


def test_timm_attention_is_one_step_of_the_walk():
    """A timm ViT (two blocks, width 64, 16 patches and the class token) predicted whole: its Attention's
    qkv and proj inside the block's row."""
    import timm
    import torch

    from gatepool.analysis.probe.check import check_model

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=2, embed_dim=64,
                            num_heads=2)  # fmt: skip
    c = check_model(vit, torch.randn(32, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    # all but the container ``blocks`` (an nn.Sequential the walk traces through: not one node)
    assert c.with_rule == c.modules - 1 > 30 and c.no_rule.startswith("blocks (Sequential)") and not c.error
    assert c.forward >= 0.9 * c.modules and c.backward >= 0.9 * c.modules, c


def test_timm_norm_act_is_its_norm_then_its_activation():
    """timm's BatchNormAct2d (a BatchNorm2d whose forward also applies its activation) predicted as the
    same net written with nn.BatchNorm2d and nn.ReLU: the activation is not skipped."""
    import torch
    from timm.layers import BatchNormAct2d

    from gatepool.analysis.probe.correlated import measure_input
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    fused = torch.nn.Sequential(conv, BatchNormAct2d(8, act_layer=torch.nn.ReLU), torch.nn.Conv2d(8, 4, 1))
    plain = torch.nn.Sequential(conv, torch.nn.BatchNorm2d(8), torch.nn.ReLU(), fused[2])
    stats = measure_input(torch.randn(16, 3, 8, 8))
    a, b = predict_correlated(fused, stats, batch=16), predict_correlated(plain, stats, batch=16)
    assert a["2"].var is not None and a["2"].var == pytest.approx(b["3"].var, rel=1e-6)  # the last conv
    assert a["(input)"].grad_e2 == pytest.approx(b["(input)"].grad_e2, rel=1e-6)
