"""gate-matters: beyond the lecture, run only with --beyond; its statistics, figures and a tiny run."""

import json

import pytest
import torch

from gatepool.lab.claims import Context
from gatepool.lab.experiments import gate_matters as gm
from gatepool.lab.experiments import registry
from gatepool.lab.harness import get, run_experiment
from gatepool.lab.reproduce import reproduce
from gatepool.lab.stats import welch_difference
from gatepool.utils.threads import num_threads


def test_registered_beyond_the_lecture():
    assert "gate-matters" in registry() and "gate-matters" not in registry(beyond=False)
    exp = get("gate-matters")
    assert exp.beyond and all(c.source == "beyond" for c in exp.claims(exp.setup))
    ids = [c.id for c in exp.claims(exp.setup)]
    assert ids == [f"same-cnn-{d}" for d in gm.DATASETS] + [
        "same-resnet-cluttered-mnist", "same-resnet-distractor-mnist"]
    nets = {c.id: c.statement.split(" on ")[0] for c in exp.claims(exp.setup)}  # the net each claim names
    assert nets["same-cnn-fashion-mnist"] == "the lecture's ResidualCNN"  # 28×28: not the canvas net
    assert nets["same-cnn-cluttered-mnist"] == "the canvas ResidualCNN"
    assert nets["same-resnet-distractor-mnist"] == "ResNetGate"


def test_reproduce_runs_it_only_with_beyond(tmp_path):
    with pytest.raises(ValueError, match="--beyond"):
        reproduce(out=tmp_path, only=["gate-matters"], progress=False)
    records, _ = reproduce(out=tmp_path, only=["he-init"], progress=False, beyond=False)
    assert "gate-matters" not in [r["name"] for r in records]  # not even as 'not run'
    records, paths = reproduce(out=tmp_path, only=["he-init"], progress=False, beyond=True)
    assert [r["status"] for r in records if r["name"] == "gate-matters"] == ["not run"]
    assert "beyond the lecture" in paths["markdown"].read_text()


def test_full_profile_estimate_at_reserved_rates_stays_within_budget():
    # an estimate at the reserved RATES (measured under load), not a timing of the run itself
    exp = get("gate-matters")
    full, quick = exp.resolve_setup("full"), exp.resolve_setup("quick")
    assert gm.estimate_seconds(full) <= gm.BUDGET_S
    assert gm.estimate_seconds(quick) <= 60  # at the loaded rates; overheads come on top (≤ 90 s)
    assert len(full["seeds"]) >= 3 and len(full["pools"]) == 6
    assert set(full["deep_datasets"]) >= {"cluttered-mnist", "distractor-mnist"}
    assert len(quick["seeds"]) == 1
    with pytest.raises(ValueError, match="deep_datasets"):
        gm.model_for("resnet", "fashion-mnist")
    with pytest.raises(ValueError, match="datasets: 'kmnist' is unknown"):
        gm.model_for("cnn", "kmnist")
    assert gm.model_for("cnn", "mnist") == "residual_cnn"  # 28×28 sets get the lecture's net


def _context(tmp_path, seeds):
    exp = get("gate-matters")
    setup = {**exp.resolve_setup("full"), "seeds": seeds}
    return Context(exp, "full", setup, tmp_path, progress=False)


def test_verdict_counts_gates_whose_family_interval_excludes_zero(tmp_path):
    ctx = _context(tmp_path, [0, 1, 2])
    acc = {"max": [90.0, 90.4, 89.8], "avg": [90.1, 89.9, 90.3], "soft": [95.0, 95.2, 94.9],
           "soft-learned": [90.2, 90.0, 89.7], "attention": [89.9, 90.5, 90.1], "conv": [84.0, 84.3, 84.1]}
    out = gm._judge(ctx, "cnn/cluttered-mnist", acc)
    claim = ctx.claims["same-cnn-cluttered-mnist"]
    assert claim["measured"] == 2 and claim["verdict"] == "off" and "soft, conv" in claim["note"]
    d = welch_difference(acc["soft"], acc["max"], 0.99)  # Bonferroni: 1 − 0.05/5
    assert (out["soft"]["family_low"], out["soft"]["family_high"]) == pytest.approx((d.low, d.high))
    assert out["avg"]["differs"] is False
    same = {p: [90.0, 90.4, 89.8] for p in acc}
    gm._judge(ctx, "cnn/distractor-mnist", same)
    assert ctx.claims["same-cnn-distractor-mnist"]["verdict"] == "ok"


def test_zero_spread_is_not_judged_and_stores_no_infinity(tmp_path):
    # nets collapsed to one class: every seed the same accuracy, a different one per gate
    ctx = _context(tmp_path, [0, 1, 2])
    collapsed = {p: [11.35] * 3 for p in gm.POOLS} | {"soft": [9.8] * 3}
    out = gm._judge(ctx, "cnn/distractor-mnist", collapsed)
    claim = ctx.claims["same-cnn-distractor-mnist"]
    assert claim["verdict"] == "not run" and claim["measured"] is None
    assert "unable to decide" in claim["note"] and "soft" in claim["note"] and "zero spread" in claim["note"]
    assert out["soft"]["differs"] is None and out["soft"]["low"] is None and out["soft"]["df"] is None
    json.dumps(out, allow_nan=False)  # standard JSON: no Infinity / NaN
    from gatepool.utils.plotting import pyplot

    gm._accuracy_figure(ctx, pyplot(), {"cnn/distractor-mnist": collapsed})  # draws without an interval
    assert ctx.figures[-1].endswith("gate-matters-accuracy.png")
    # one gate differs with a real interval: the claim is off even if others are not judged
    mixed = dict(collapsed, conv=[20.0, 20.4, 19.8])
    out = gm._judge(ctx, "cnn/cluttered-mnist", mixed)
    claim = ctx.claims["same-cnn-cluttered-mnist"]
    assert claim["verdict"] == "off" and claim["measured"] == 1 and out["conv"]["differs"] is True
    json.dumps(out, allow_nan=False)


def test_one_seed_is_not_run(tmp_path):
    ctx = _context(tmp_path, [0])
    gm._judge(ctx, "cnn/cluttered-mnist", {p: [50.0] for p in gm.POOLS})
    claim = ctx.claims["same-cnn-cluttered-mnist"]
    assert claim["verdict"] == "not run" and "one seed" in claim["note"]


@pytest.mark.slow
def test_measure_rates_times_the_trainers_step(monkeypatch):
    import gatepool.train

    step, calls = gatepool.train.train_step, []
    monkeypatch.setattr(gatepool.train, "train_step", lambda *a, **kw: calls.append(1) or step(*a, **kw))
    rates = gm.measure_rates(rounds=1, steps=1, batch=2)
    assert set(rates) == {gm.MNIST_MODEL, gm.CANVAS_MODEL, gm.DEEP_MODEL}
    assert all(list(r) == gm.POOLS and all(0 < v < float("inf") for v in r.values()) for r in rates.values())
    assert len(calls) == 3 * len(gm.POOLS) * (2 + 1)  # per model and gate: Timer's 2 warm-up steps, 1 timed


def test_gate_maps_are_the_attention_weights():
    torch.manual_seed(0)
    model = gm.model_for("cnn", "cluttered-mnist")
    from gatepool import create_model

    net = create_model(model, pool="attention")
    maps = gm.gate_maps(net, torch.randn(3, 1, 60, 60))
    assert [tuple(m.shape) for m in maps] == [(3, 60, 60), (3, 30, 30), (3, 14, 14)]
    for m in maps:  # each 2×2 window's weights are a softmax: they sum to 1
        n, h, w = m.shape
        sums = m.reshape(n, h // 2, 2, w // 2, 2).sum((2, 4))
        torch.testing.assert_close(sums, torch.ones_like(sums))
    routed = gm.routed_weight(maps)
    assert routed.shape == (3, 56, 56)
    torch.testing.assert_close(routed.reshape(3, 7, 8, 7, 8).sum((2, 4)), torch.ones(3, 7, 7))
    assert all(not p.return_weights for p in net.modules() if getattr(p, "gate", None) == "attention")


def test_routed_weight_of_four_pools_is_the_brute_force_composition():
    # resnet_gate on 60×60: gate maps 60, 30, 14, 6 (odd maps 15 and 7 lose a row in a 2×2 stride-2 pool)
    torch.manual_seed(0)
    from gatepool import create_model

    maps = gm.gate_maps(create_model(gm.model_for("resnet", "cluttered-mnist"), pool="attention"),
                        torch.randn(2, 1, 60, 60))
    assert [m.shape[-1] for m in maps] == [60, 30, 14, 6]
    routed = gm.routed_weight(maps)
    assert routed.shape == (2, 48, 48)  # the last map covers 6 · 2³ rows and columns
    r = torch.arange(48)
    brute = torch.ones(2, 48, 48)
    for i, m in enumerate(maps):  # input position (r, c) sits under entry (r // 2^i, c // 2^i) of map i
        brute = brute * m[:, r[:, None] // 2**i, r[None, :] // 2**i]
    torch.testing.assert_close(routed, brute)
    # nested softmaxes: every 16×16 composed window (the last pool's 2×2 at input scale) sums to 1
    torch.testing.assert_close(routed.reshape(2, 3, 16, 3, 16).sum((2, 4)), torch.ones(2, 3, 3))


TINY = {"pools": "max,attention,soft-learned", "seeds": "0,1", "datasets": "cluttered-mnist",
        "deep_datasets": "cluttered-mnist", "epochs": "1", "train_size": "64", "test_size": "32",
        "batch_size": "32", "examples": "2"}


@pytest.mark.slow
def test_tiny_run_from_its_trainings(tmp_path, small_canvas):
    small_canvas(256, 128)
    with num_threads(1):
        rec = run_experiment("gate-matters", profile="full", overrides=TINY, out=tmp_path / "out",
                             progress=False)
    assert rec["status"] == "complete", rec["error"]
    folder = tmp_path / "out" / "gate-matters"
    acc = {}
    for net, model in (("cnn", "residual_cnn_canvas"), ("resnet", "resnet_gate")):
        for pool in ("max", "attention", "soft-learned"):
            for seed in (0, 1):
                run = json.loads((folder / f"{net}-cluttered-mnist" / f"{pool}-s{seed}" / "results.json")
                                 .read_text())
                assert run["config"]["model"] == model and run["config"]["data"] == "cluttered-mnist"
                assert run["config"]["model_kwargs"] == {"pool": pool} and run["config"]["seed"] == seed
                acc.setdefault(f"{net}/cluttered-mnist", {}).setdefault(pool, []).append(
                    100 * run["final"]["test_acc"])
                if pool == "soft-learned" and net == "resnet":  # τ of nested pools are recorded too
                    assert sum(k.startswith("tau_stage") for k in run["history"][-1]) == 4
    assert rec["data"]["test_acc"] == {k: {p: pytest.approx(a) for p, a in v.items()} for k, v in acc.items()}
    claims = {c["id"]: c for c in rec["claims"]}
    for net in ("cnn", "resnet"):
        per_pool = acc[f"{net}/cluttered-mnist"]
        differ = sum(bool(welch_difference(per_pool[p], per_pool["max"], 0.975).differs)
                     for p in ("attention", "soft-learned"))
        assert claims[f"same-{net}-cluttered-mnist"]["measured"] == differ
    assert len(rec["data"]["tau_final"]["cluttered-mnist"]) == 2 * 3 * 32  # 2 seeds × 3 pools × 32 channels
    stamps = {p: p.stat().st_mtime_ns for p in folder.glob("*/*/results.json")}
    with num_threads(1):  # resumed: every training is finished, none runs again
        again = run_experiment("gate-matters", profile="full", overrides=TINY, out=tmp_path / "out",
                               progress=False)
    assert again["data"]["test_acc"] == rec["data"]["test_acc"]
    assert {p: p.stat().st_mtime_ns for p in folder.glob("*/*/results.json")} == stamps and len(stamps) == 12
    names = {f.split("/")[-1] for f in rec["figures"]}
    assert names == {"gate-matters-datasets.png", "gate-matters-accuracy.png", "gate-matters-tau.png",
                     "gate-matters-attention.png"}


def test_cli_one_line_without_beyond(tmp_path, capsys):
    from gatepool.cli import main

    assert main(["reproduce", "--only", "gate-matters", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--beyond" in err and "Traceback" not in err
    assert main(["list"]) == 0
    assert "[beyond: reproduce --beyond]" in capsys.readouterr().out


def test_data_info_lists_the_generated_sets(small_canvas, capsys):
    small_canvas(256, 128)
    from gatepool.cli import main

    assert main(["data", "generate", "translated-mnist"]) == 0
    assert main(["data", "info"]) == 0
    out = capsys.readouterr().out
    assert "translated-mnist: loaded from" in out and "digit at a random place" in out
    assert "cluttered-mnist: not generated yet" in out
