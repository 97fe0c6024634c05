"""``gatepool bench step`` on the CPU, small (ResNet-18 at 32 × 32, batch 2, a step or two): the record
holds what the module docstring documents, consistent with its own times; a net that cannot be built is
reported as failed and the others still timed; the budget skips the nets it leaves out; ``--compile``
times each net through ``torch.compile`` (its compile stubbed here: a ResNet's takes minutes on a CPU).
Needs torchvision (``make test-vision``); skipped without it."""

from __future__ import annotations

import json
import os
import signal
import statistics

import pytest
import torch

pytest.importorskip("torchvision")

from gatepool.cli import main  # noqa: E402
from gatepool.lab.bench import step  # noqa: E402

SMALL = ["--quick", "--threads", "1", "--device", "cpu", "--size", "32", "--batch", "2", "--warmup", "1"]


def bench(tmp_path, capsys, *args: str) -> tuple[dict, str]:
    out = tmp_path / "step.json"
    assert main(["bench", "step", *SMALL, *args, "--out", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().out


def test_bench_step_writes_the_documented_record(tmp_path, capsys):
    cudnn_benchmark = torch.backends.cudnn.benchmark
    rec, table = bench(tmp_path, capsys, "--steps", "2", "--gates", "soft")
    assert torch.backends.cudnn.benchmark == cudnn_benchmark and rec["cudnn_benchmark"]  # on, then restored
    assert rec["bench"] == "step" and rec["model"].startswith("torchvision:resnet18")
    assert rec["input_shape"] == [2, 3, 32, 32] and rec["steps"] == 2 and rec["warmup"] == 1
    assert rec["autocast"] == "bfloat16" and rec["memory_format"] == "channels_last"
    assert rec["compile"] is False and rec["targets"] == []  # the CPU default: eager; targets: CUDA's
    assert [(r["gate"], r["mode"]) for r in rec["results"]] == [("max", "eager"), ("soft", "eager")]
    base, soft = rec["results"]
    assert base["replaced"] == [] and soft["replaced"] == ["maxpool"]  # ResNet's stem pool
    for r in rec["results"]:
        assert r["status"] == "measured" and len(r["times_ms"]) == 2 and all(t > 0 for t in r["times_ms"])
        assert r["median_ms"] == pytest.approx(statistics.median(r["times_ms"]))
        assert r["images_per_s"] == pytest.approx(2 / (r["median_ms"] / 1e3))
        assert r["peak_mib"] is None and r["warmup_s"] > 0  # peak memory: CUDA only
        assert f"{r['median_ms']:.1f}" in table
    assert base["ratio_to_max"] == 1.0
    assert soft["ratio_to_max"] == pytest.approx(soft["median_ms"] / base["median_ms"])


def test_a_net_that_fails_is_reported_and_the_others_timed(tmp_path, capsys, monkeypatch):
    real = step.build

    def build(model, gate, x, device):
        if gate == "attention":
            raise RuntimeError("no kernel for this\nsecond line")
        return real(model, gate, x, device)

    monkeypatch.setattr(step, "build", build)
    rec, table = bench(tmp_path, capsys, "--steps", "1", "--gates", "attention,soft")
    rows = {r["gate"]: r for r in rec["results"]}
    assert list(rows) == ["max", "attention", "soft"]
    assert rows["attention"]["status"] == "failed: RuntimeError: no kernel for this"
    assert rows["attention"]["times_ms"] == [] and rows["attention"]["ratio_to_max"] is None
    assert rows["soft"]["status"] == rows["max"]["status"] == "measured"
    assert "attention      eager     failed: RuntimeError: no kernel for this" in table


def test_compiled_nets_are_timed_through_torch_compile(tmp_path, capsys, monkeypatch):
    compiled = []

    def fake_compile(model, **kwargs):  # the plumbing, not inductor: it returns the model as it is
        compiled.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    rec, _ = bench(tmp_path, capsys, "--steps", "1", "--gates", "avg,soft", "--compile")
    order = [(r["gate"], r["mode"]) for r in rec["results"]]
    assert order == [("max", "eager"), ("avg", "eager"), ("soft", "eager"),
                     ("max", "compiled"), ("soft", "compiled"), ("avg", "compiled")]  # fmt: skip
    assert len(compiled) == 3 and len({id(m) for m in compiled}) == 3  # one compile a net
    for r in rec["results"]:
        assert r["status"] == "measured"
        base = next(b for b in rec["results"] if b["gate"] == "max" and b["mode"] == r["mode"])
        assert r["ratio_to_max"] == pytest.approx(r["median_ms"] / base["median_ms"])


def test_the_budget_skips_the_nets_that_would_start_after_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    rec, table = bench(tmp_path, capsys, "--steps", "1", "--gates", "soft", "--compile", "--budget", "0")
    assert [r["status"].split(":")[0] for r in rec["results"]] == ["skipped"] * 4
    assert rec["results"][0]["status"] == "skipped: the bench's budget of 0 s was spent before its warm-up"
    assert "skipped: the compiled max-pool net was not measured" == rec["results"][3]["status"]
    assert rec["budget_s"] == 0


def test_a_sigterm_keeps_what_was_timed(tmp_path, capsys, monkeypatch):
    real = step.build

    def build(model, gate, x, device):  # the signal `timeout` sends, in the second net's warm-up
        if gate == "soft":
            os.kill(os.getpid(), signal.SIGTERM)
        return real(model, gate, x, device)

    monkeypatch.setattr(step, "build", build)
    before = signal.getsignal(signal.SIGTERM)
    rec, _ = bench(tmp_path, capsys, "--steps", "1", "--gates", "soft,attention")
    assert signal.getsignal(signal.SIGTERM) == before  # put back
    status = {r["gate"]: r["status"] for r in rec["results"]}
    assert status == {
        "max": "measured",
        "soft": "stopped: the bench was asked to stop (SIGTERM) in its warm-up",
        "attention": "skipped: the bench was asked to stop (SIGTERM) before its warm-up",
    }
    assert rec["stopped"] and len(rec["results"][0]["times_ms"]) == 1


def test_an_unknown_model_is_refused_in_one_line(capsys):
    assert main(["bench", "step", *SMALL, "--model", "resnet7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'resnet7' is not a torchvision classification model" in err[0]
