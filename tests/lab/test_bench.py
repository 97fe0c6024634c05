"""``gatepool bench pool`` and ``gatepool bench train`` in quick mode: they run, and the JSON record they
write holds what the module docstrings document, consistent with its own raw times."""

import json
import math
import statistics

import pytest
import torch
import torch.nn as nn

from gatepool.cli import main
from gatepool.layers import GATES
from gatepool.models import create_model

pytestmark = pytest.mark.slow  # timed runs: seconds each


def bench(tmp_path, name, capsys):
    out = tmp_path / f"{name}.json"
    assert main(["bench", name, "--quick", "--threads", "1", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    return json.loads(out.read_text()), table


def test_bench_pool_quick_writes_the_documented_record(tmp_path, capsys):
    rec, table = bench(tmp_path, "pool", capsys)
    assert rec["bench"] == "pool" and rec["quick"] is True and rec["threads"] == 1
    names = ["F.max_pool2d", "F.avg_pool2d", *GATES, "soft (pure PyTorch)", "plain path"]
    tiny = ["F.max_pool2d", "F.avg_pool2d", *GATES, "unfold + softmax (PyTorch)"]
    geometry = {
        "tiled": ([16, 32, 28, 28], 2, 2, 0),
        "overlapping": ([4, 64, 56, 56], 3, 2, 1),
        "tiny-tiled": ([2, 8, 4, 4], 2, 2, 0),
        "tiny-overlapping": ([2, 8, 4, 4], 3, 2, 1),
    }
    assert rec["cases"] == list(geometry)
    for case, (shape, k, s, p) in geometry.items():
        for fmt in ("nchw",) if case.startswith("tiny") else ("nchw", "channels_last"):
            rows = {r["name"]: r for r in rec["results"] if r["format"] == fmt and r["case"] == case}
            assert list(rows) == (tiny if case.startswith("tiny") else names)
            base = statistics.median(rows["F.max_pool2d"]["times_ms"])
            for r in rows.values():
                assert (r["shape"], r["kernel_size"], r["stride"], r["padding"]) == (shape, k, s, p)
                assert len(r["times_ms"]) == r["rounds"] and all(t > 0 for t in r["times_ms"])
                assert r["threads"] == 1 and r["dtype"] == "float32" and not r["autocast"]
                assert r["median_ms"] == pytest.approx(statistics.median(r["times_ms"]))
                assert r["min_ms"] == pytest.approx(min(r["times_ms"]))
                assert r["ratio_to_max_pool2d"] == pytest.approx(r["median_ms"] / base)
                fastest = rows["F.max_pool2d"]["min_ms"]
                assert r["min_ratio_to_max_pool2d"] == pytest.approx(r["min_ms"] / fastest)
                assert (r["peak_mib"] is not None) == (fmt == "channels_last")  # none in the tiny cases
                if r["peak_mib"] is not None:  # at least the input's gradient: as large as the input
                    assert r["peak_mib"] >= math.prod(shape) * 4 / 2**20
    row = {(r["case"], r["format"], r["name"]): r for r in rec["results"]}
    assert len(rec["targets"]) == 12 + 6 + 1  # 3 gates × 2 cases × 2 formats, the tiny cases, memory
    for t in rec["targets"]:
        assert t["met"] == (t["value"] <= t["limit"])
        assert f"{t['value']:.2f}× ({'met' if t['met'] else 'NOT met'})" in table
    soft = rec["targets"][0]
    assert soft["what"] == "soft / F.max_pool2d, tiled, nchw" and soft["limit"] == 1.5
    assert soft["value"] == row[("tiled", "nchw", "soft")]["ratio_to_max_pool2d"]
    target = {t["what"]: t for t in rec["targets"]}
    tiny_attention = target["attention / F.max_pool2d, tiny-tiled, nchw"]
    assert tiny_attention["limit"] == 4.0
    assert target["soft / F.max_pool2d, tiny-overlapping, nchw"]["limit"] == 3.0
    assert tiny_attention["value"] == row[("tiny-tiled", "nchw", "attention")]["ratio_to_max_pool2d"]
    memory = rec["targets"][-1]
    peak = {name: row[("tiled", "channels_last", name)]["peak_mib"] for name in ("soft", "F.max_pool2d")}
    assert memory["value"] == pytest.approx(peak["soft"] / peak["F.max_pool2d"])


def test_bench_train_quick_writes_the_documented_record(tmp_path, capsys):
    rec, table = bench(tmp_path, "train", capsys)
    assert rec["name"] == "train" and rec["quick"] is True and rec["repeats"] == 2
    assert set(rec["ways"]) == {"ours", "ours_nchw", "ours_b64", "reference"}
    stem = next(m for m in create_model("residual_cnn", pool="max").modules() if isinstance(m, nn.Conv2d))
    stem_macs = stem(torch.zeros(1, 1, 28, 28)).numel() * stem.in_channels * math.prod(stem.kernel_size)
    assert rec["flop_per_image"] == 2 * (3 * rec["macs_per_image"] - stem_macs)  # the docstring's count
    for name, way in rec["ways"].items():
        assert len(way["seconds"]) == rec["repeats"] and all(s > 0 for s in way["seconds"])
        ips = rec["images_per_repeat"] / statistics.median(way["seconds"])
        assert way["images_per_s"] == pytest.approx(ips), name
        assert way["flops"] == pytest.approx(ips * rec["flop_per_image"])
        assert way["share_of_matmul"] == pytest.approx(way["flops"] / rec["matmul"]["flops"])
    ways = rec["ways"]
    assert rec["ratio"] == pytest.approx(ways["ours"]["images_per_s"] / ways["reference"]["images_per_s"])
    assert rec["meets"] == {"ratio": rec["ratio"] >= 4.0, "share": rec["share"] >= 0.40}
    assert ways["ours"]["batch_size"] == 128 and ways["ours_b64"]["batch_size"] == 64
    assert ways["ours"]["channels_last"] and not ways["ours_nchw"]["channels_last"]
    assert f"ours / reference = {rec['ratio']:.2f}x" in table
