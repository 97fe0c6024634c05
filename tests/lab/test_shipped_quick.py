"""The quick profile judges attention-reach's accuracies, attention-maps and vit-mnist's curve from the
shipped full-profile models: each such claim names them (``shipped_model``), the record lists them with
their SHA-256 (``pretrained``), and the numbers are recomputed here from the cards and the weights."""

import math
import statistics

import pytest
import torch

from gatepool.lab.claims import Context
from gatepool.lab.harness import get, run_experiment
from gatepool.models.pretrained import cards
from gatepool.utils.threads import num_threads

SEEDS = [0, 1, 2]
MAP_NETS = ", ".join(f"conv_attention-s{s}" for s in SEEDS)


@pytest.fixture(autouse=True)
def one_thread():
    with num_threads(1):
        yield


def context(name, tmp_path, profile="quick", overrides=None):
    exp = get(name)
    return Context(exp, profile, exp.resolve_setup(profile, overrides), tmp_path / name, progress=False)


def test_attention_reach_quick_judges_the_shipped_nets_with_the_lectures_bars(tmp_path):
    from gatepool.lab.common.attention_nets import shipped_nets
    from gatepool.lab.experiments.attention_reach import _judge_shipped

    ctx = context("attention-reach", tmp_path)
    _judge_shipped(ctx, shipped_nets(ctx))
    every = cards()
    acc = {m: statistics.fmean(100 * every[f"{m}-s{s}"]["test_acc"] for s in SEEDS)  # the same 2,000 digits
           for m in ("conv_stem", "conv_attention")}  # fmt: skip
    claims = ctx.claims
    assert claims["stem-acc"]["measured"] == pytest.approx(acc["conv_stem"], abs=1e-3)
    assert claims["attention-acc"]["measured"] == pytest.approx(acc["conv_attention"], abs=1e-3)
    assert claims["lift"]["measured"] == pytest.approx(acc["conv_attention"] - acc["conv_stem"], abs=1e-3)
    for cid, tol in (("stem-acc", 3.0), ("attention-acc", 3.0), ("lift", 5.0)):  # the declared bars
        c = claims[cid]
        assert c["tolerance"] == tol and c["bar"] is not None
        assert c["verdict"] == ("ok" if abs(c["measured"] - c["bar"]) <= tol else "off")
    assert claims["stem-acc"]["shipped_model"] == "conv_stem-s0, conv_stem-s1, conv_stem-s2"
    assert claims["lift"]["shipped_model"] == f"conv_stem-s0, conv_stem-s1, conv_stem-s2, {MAP_NETS}"
    assert ctx.pretrained == {n: every[n]["sha256"] for n in ctx.pretrained} and len(ctx.pretrained) == 6


def test_only_quick_on_its_own_setup_uses_shipped_nets(tmp_path):
    from gatepool.lab.common.attention_nets import shipped_nets

    assert shipped_nets(context("attention-reach", tmp_path, "full")) is None  # full trains its own
    assert shipped_nets(context("attention-reach", tmp_path, overrides={"epochs": "2"})) is None
    assert shipped_nets(context("attention-maps", tmp_path, overrides={"seeds": "0,1"})) is None


def explicit_gates(model, x):
    """G = softmax(Q Kᵀ / √d) in float64, from the model's weights (not its attention module)."""
    a = model.attention
    t = model.tokens(x).double()  # (1, 144, 32)
    q, k = t @ a.to_q.weight.double().T, t @ a.to_k.weight.double().T  # (1, 144, d)
    return torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)[0]  # (144, 144)


def test_attention_maps_quick_reads_the_shipped_nets_and_saves_the_explorer(tmp_path):
    from gatepool.data import load_dataset
    from gatepool.lab.common.attention_nets import first_test_digit
    from gatepool.models import create_model

    rec = run_experiment("attention-maps", profile="quick", out=tmp_path, progress=False)
    assert rec["status"] == "complete", rec["error"]
    every = cards()
    assert rec["pretrained"] == {n: every[n]["sha256"] for n in MAP_NETS.split(", ")}
    claims = {c["id"]: c for c in rec["claims"]}
    assert all(c["shipped_model"] == MAP_NETS for c in claims.values()), claims
    x, index = first_test_digit(7)
    shares, gates = {}, {}
    with torch.no_grad():
        for s in SEEDS:
            gates[s] = explicit_gates(create_model("conv_attention", pretrained=f"conv_attention-s{s}"), x)
            for r, c in ((2, 6), (3, 8), (10, 3)):
                shares.setdefault((r, c), []).append(gates[s][r * 12 + c].topk(3).values.sum().item())
    for (r, c), values in shares.items():
        claim = claims[f"top3-r{r}c{c}"]
        if claim["measured"] is not None:  # judged: the mean over the three shipped nets
            assert claim["measured"] == pytest.approx(statistics.fmean(values), abs=1e-5)
        else:
            assert "not judged" in claim["note"]

    ex = rec["data"]["explorer"]
    assert set(ex) == {"image", "grid", "rows", "label", "seed", "model"}
    assert ex["grid"] == [12, 12] and ex["label"] == 7 and ex["seed"] == 0
    assert (ex["model"], ex["seed"]) == ("shipped conv_attention", 0)
    raw = load_dataset("mnist", "test").images[index].double() / 255
    assert torch.tensor(ex["image"], dtype=torch.float64).sub(raw).abs().max() <= 5e-5
    rows = torch.tensor(ex["rows"], dtype=torch.float64)  # (144, 144)
    assert rows.shape == (144, 144) and (rows >= 0).all()
    assert (rows.sum(1) - 1).abs().max() <= 144 * 5e-5  # each row a softmax, rounded to 4 decimals
    assert (rows - gates[0]).abs().max() <= 5e-5 + 1e-5  # seed 0's gate, recomputed in float64


def test_vit_mnist_quick_gap_from_the_shipped_contestants(tmp_path):
    from gatepool.lab.experiments.vit_mnist import SHIPPED, _shipped, _shipped_gaps

    ctx = context("vit-mnist", tmp_path)
    shipped = _shipped(ctx)
    gap, small, large = _shipped_gaps(ctx, shipped)
    every = cards()
    assert (small, large) == (1000, 60000)
    for n in (small, large):  # the cards' accuracies are on the same 10,000 test digits
        want = 100 * (every[SHIPPED[("cnn", n)]]["test_acc"] - every[SHIPPED[("vit", n)]]["test_acc"])
        assert gap[n] == pytest.approx(want, abs=1e-3)
    assert set(ctx.pretrained) == set(SHIPPED.values())
    assert _shipped(context("vit-mnist", tmp_path, overrides={"vit_patch": "4"})) is None


@pytest.mark.slow
def test_vit_mnist_quick_marks_the_claims_its_shipped_models_answer(tmp_path):
    from gatepool.lab.experiments.vit_mnist import SHIPPED

    rec = run_experiment("vit-mnist", profile="quick", out=tmp_path, progress=False)
    assert rec["status"] == "complete", rec["error"]
    claims = {c["id"]: c for c in rec["claims"]}
    assert "shipped_model" not in claims["gap-smallest"]  # this run's own 1,000-digit trainings
    assert claims["gap-shrinks"]["shipped_model"] == ", ".join(SHIPPED.values())
    assert claims["pos-neighbours"]["shipped_model"] == "vit_mnist-n60000-s0"
    assert claims["gap-shrinks"]["verdict"] != "not run" and claims["pos-neighbours"]["verdict"] != "not run"
    assert "1000 to 60000 digits" in claims["gap-shrinks"]["statement"]
    assert set(rec["pretrained"]) == set(SHIPPED.values())


def test_check_records_the_shipped_model_only_when_given(tmp_path):
    ctx = context("attention-maps", tmp_path, "full")
    ctx.check("reach", 5)
    assert "shipped_model" not in ctx.claims["reach"]
    ctx.check("reach", 5, shipped_model="conv_attention-s0")
    assert ctx.claims["reach"]["shipped_model"] == "conv_attention-s0"


def test_a_result_judged_from_other_shipped_weights_is_not_reused(tmp_path):
    from gatepool.lab.harness import load_result, result_path
    from gatepool.utils.io import atomic_write_json

    digest = cards()["conv_stem-s0"]["sha256"]
    atomic_write_json(result_path(tmp_path, "x"), {"name": "x", "pretrained": {"conv_stem-s0": digest}})
    assert load_result(tmp_path, "x") is not None
    atomic_write_json(result_path(tmp_path, "x"), {"name": "x", "pretrained": {"conv_stem-s0": "0" * 64}})
    assert load_result(tmp_path, "x") is None  # rebuilt weights since: the experiment runs again
    atomic_write_json(result_path(tmp_path, "x"), {"name": "x", "pretrained": {"gone-s0": digest}})
    assert load_result(tmp_path, "x") is None
