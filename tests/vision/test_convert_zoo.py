"""The zoo sweep on a sample, and conversions that stay converted (timm's reset_classifier and gradient
checkpointing, torchvision's fc replacement). The whole sweep: ``gatepool convert-check``
(docs/convert-zoo.md).

The sample holds a model for each way a pool hides: functional calls (DenseNet, Inception v3, MNASNet's
mean head, MobileNetV2), adaptive 6×6 / 7×7 heads (AlexNet, VGG), squeeze-and-excitation blocks whose
head is followed by an in-place dropout (EfficientNet), timm's functional squeezes (efficientnet_b0, an
ECA ResNet), "same"-padded pools (timm's tf_ models; MaxPool2dSame in vit_tiny_r_s16_p8_224 and
pnasnet5large), a mean over (-1, -2) (pvt_v2) and VGG's ConvMlp. Needs torchvision / timm
(``make test-vision``).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool import convert
from gatepool.layers.global_pool import GlobalGatedPoolNd

zoo = pytest.importorskip("gatepool.analysis.convert_zoo")
pytest.importorskip("torchvision")
pytest.importorskip("timm")

SAMPLE = [
    ("tv:densenet121", "attention"), ("tv:inception_v3", "soft"), ("tv:mnasnet0_5", "soft-learned"),
    ("tv:mobilenet_v2", "max"), ("tv:alexnet", "attention"), ("tv:efficientnet_b0", "soft"),
    ("tv:regnet_y_400mf", "avg"), ("timm:efficientnet_b0", "attention"), ("timm:ecaresnet26t", "soft"),
    ("timm:tf_mixnet_s", "soft"), ("tv:googlenet", "conv"), ("timm:pvt_v2_b0", "attention"),
    ("timm:vit_tiny_r_s16_p8_224", "soft-learned"),
    pytest.param("timm:vgg11", "attention", marks=pytest.mark.slow),
    pytest.param("timm:pnasnet5large", "max", marks=pytest.mark.slow),
]  # fmt: skip


@pytest.mark.parametrize("name,gate", SAMPLE)
def test_sample_converts_fully(name, gate):
    torch.set_num_threads(1)
    r = zoo.check(name, gate)
    assert r.status == "full", (r.status, r.left, r.why)
    assert r.replaced > 0


def test_left_over_sees_modules_and_calls():
    """The sweep's "nothing left" check fails where a pool is left: a module, or a call in a forward."""
    model = zoo.build("tv:densenet121", 0)
    x = torch.randn(1, 3, 64, 64)
    left = zoo.left_over(model, x)
    assert "features.pool0 (MaxPool2d)" in left and "adaptive_avg_pool2d in DenseNet" in left
    convert(model, "soft", global_pool="soft")
    assert zoo.left_over(model, x) == []
    model = zoo.build("tv:mnasnet0_5", 0)
    assert zoo.left_over(model, x) == ["mean in MNASNet"]
    pools = ["features.2 (MaxPool2d)", "features.5 (MaxPool2d)", "features.12 (MaxPool2d)"]
    model = zoo.build("tv:alexnet", 0)  # each pool once: a module, not also the call it makes
    assert zoo.left_over(model, x) == [*pools, "avgpool (AdaptiveAvgPool2d)"]
    convert(model, "conv", example_input=x)  # "conv" has no adaptive form: the 6×6 pool is left
    assert zoo.left_over(model, x) == ["avgpool (AdaptiveAvgPool2d)"]


def _gates(model):
    return [m for m in model.modules() if isinstance(m, GlobalGatedPoolNd)]


@pytest.mark.parametrize("arch", ["resnet18", "efficientnet_b0", "convnext_atto"])
def test_timm_reset_classifier_keeps_the_gate(arch):
    import timm

    x = torch.randn(2, 3, 64, 64)
    model = timm.create_model(arch, pretrained=False)
    convert(model, "soft", global_pool="soft-learned", example_input=x)
    old = _gates(model)
    assert len(old) == 1
    model.reset_classifier(7)
    new = _gates(model)
    assert len(new) == 1 and new[0].gate == "soft-learned"  # rebuilt (resnet) or kept (convnext): gated
    assert model(x).shape == (2, 7)
    copied = copy.deepcopy(model)  # the wrapper follows its copy, not the original
    copied.reset_classifier(3)
    assert copied(x).shape == (2, 3) and model(x).shape == (2, 7) and len(_gates(copied)) == 1


def test_timm_grad_checkpointing_keeps_the_gate():
    import timm

    x = torch.randn(2, 3, 64, 64)
    model = timm.create_model("efficientnet_b0", pretrained=False)
    convert(model, "attention", global_pool="soft-learned", squeeze_pool="soft", example_input=x)
    model.set_grad_checkpointing(True)
    model.train()
    model(x).square().mean().backward()
    gates = [m for m in model.modules() if hasattr(m, "_gatepool_origin") and list(m.parameters())]
    assert gates and all(p.grad is not None and p.grad.abs().sum() > 0 for m in gates for p in m.parameters())


@pytest.mark.parametrize("arch,head", [("resnet18", "fc"), ("densenet121", "classifier")])
def test_torchvision_fc_replacement_keeps_the_gate(arch, head):
    import torchvision

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torchvision.models.get_model(arch, weights=None)
    x = torch.randn(2, 3, 64, 64)
    convert(model, "soft", global_pool="attention", example_input=x)
    setattr(model, head, nn.Linear(getattr(model, head).in_features, 4))  # the fine-tuning idiom
    gate = _gates(model)[0]
    seen = []
    gate.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    out = model(x)
    F.cross_entropy(out, torch.tensor([0, 3])).backward()
    assert out.shape == (2, 4) and seen and gate.score.weight.grad.abs().sum() > 0


def test_convert_check_writes_the_page_and_merges_runs(tmp_path):
    """``gatepool convert-check``: a run writes its page and JSON; ``--merge`` writes one page of runs."""
    import json

    from gatepool.cli import main

    page, data = tmp_path / "zoo.md", tmp_path / "run.json"
    args = ["convert-check", "--models", "tv:squeezenet1_0", "timm:resnet18", "--exclude", "timm:resnet18",
            "--gates", "max", "avg", "--out", str(page), "--json", str(data)]  # fmt: skip
    assert main(args) == 0
    run = json.loads(data.read_text())
    assert run["meta"]["gates"] == ["max", "avg"] and run["meta"]["excluded"] == ["timm:resnet18"]
    assert [(r["model"], r["gate"], r["status"]) for r in run["results"]] == [
        ("tv:squeezenet1_0", "max", "full"), ("tv:squeezenet1_0", "avg", "full")]  # fmt: skip
    text = page.read_text()
    assert "| tv:squeezenet1_0 | 64 | ✓ | ✓ |  |" in text and "left out (--exclude): timm:resnet18" in text
    assert "**torchvision: 1 of 1 models with a pool convert fully (100%)**" in text
    broken = dict(run, results=[dict(r, status="partial", left=["features.2 (MaxPool2d)"])
                                for r in run["results"]])  # fmt: skip
    (tmp_path / "b.json").write_text(json.dumps(broken))
    assert main(["convert-check", "--merge", str(data), str(tmp_path / "b.json"), "--out", str(page)]) == 0
    text = page.read_text()
    assert text.count("- **torchvision, gates max, avg**: `gatepool convert-check --models") == 2
    assert text.count("| tv:squeezenet1_0 |") == 1  # one table: the later run's cells
    assert "max: partial: features.2 (MaxPool2d)" in text
    assert (
        "0 of 1 models with a pool convert fully (0%)** with every gate run on them; not fully: "
        "tv:squeezenet1_0 (max: partial, avg: partial)." in text
    )


def test_convert_check_leaves_out_what_has_no_pool_and_resumes(tmp_path):
    """``--pooled-from``: the models an earlier run found with no pool are not run (named on the page), the
    others at its size; ``--resume``: the models the JSON holds with every gate are kept, not run again."""
    import json
    from dataclasses import asdict

    from gatepool.cli import main

    earlier, page, data = tmp_path / "soft.json", tmp_path / "zoo.md", tmp_path / "run.json"
    results = [zoo.Result("tv:squeezenet1_0", "soft", "full", 64),
               zoo.Result("tv:alexnet", "soft", "no pool", 64)]  # fmt: skip
    earlier.write_text(json.dumps({"results": [asdict(r) for r in results]}))
    args = ["convert-check", "--models", "tv:squeezenet1_0", "tv:alexnet", "--gates", "max",
            "--out", str(page), "--json", str(data), "--pooled-from", str(earlier)]  # fmt: skip
    assert main(args) == 0
    run = json.loads(data.read_text())
    ran = [(r["model"], r["status"], r["size"]) for r in run["results"]]
    assert ran == [("tv:squeezenet1_0", "full", 64)]
    assert run["meta"]["no_pool"] == ["tv:alexnet"] and run["meta"]["pooled_from"] == [str(earlier)]
    assert (
        f"not run, as {earlier} found them with no pool (nothing to convert, for any gate): 1 models"
        in page.read_text()
    )
    run["results"][0]["seconds"] = 123.0  # a mark: a kept result is not run again
    data.write_text(json.dumps(run))
    args = ["convert-check", "--models", "tv:squeezenet1_0", "tv:squeezenet1_1", "--gates", "max",
            "--out", str(page), "--json", str(data), "--resume"]  # fmt: skip
    assert main(args) == 0
    resumed = json.loads(data.read_text())
    assert [(r["model"], r["status"]) for r in resumed["results"]] == [
        ("tv:squeezenet1_0", "full"), ("tv:squeezenet1_1", "full")]  # fmt: skip
    assert resumed["results"][0]["seconds"] == 123.0 and resumed["results"][1]["seconds"] != 123.0
    meta = resumed["meta"]
    assert meta["command"] == run["meta"]["command"] and len(meta["resumed"]) == 1 and meta["complete"]
    assert "resumed at" in page.read_text()
    assert main([*args[:5], "avg", *args[6:]]) == 2  # another gate: not the same run


def test_check_says_when_the_original_does_not_compile(monkeypatch):
    """``compile=True`` where the original does not compile: converted fully, nothing to compare, and
    said ("not compiled", why), not passed off as a compile that worked."""
    real = torch.compile

    def compile_converted_only(model, **kwargs):
        if not any(hasattr(m, "_gatepool_origin") for m in model.modules()):
            raise RuntimeError("dynamo cannot trace this original")
        return real(model, **kwargs)

    monkeypatch.setattr(torch, "compile", compile_converted_only)
    r = zoo.check("tv:squeezenet1_0", "soft", compile=True)
    assert r.status == "not compiled" and "dynamo cannot trace this original" in r.why
    assert zoo.summary([r])["full"] == 1  # it converted fully
    row = zoo.table([r], ("soft",)).splitlines()[-1]
    assert row.startswith("| tv:squeezenet1_0 | 64 | ○ |") and "the original does not compile" in row
