"""attention_cost, top-k share, token strengths and the two figures; and the attention bench's parts."""

from __future__ import annotations

import json

import pytest
import torch

from gatepool.analysis.attention_maps import (
    attention_cost,
    plot_attention_cost,
    plot_attention_map,
    token_strengths,
    top_k_share,
)

PNG = b"\x89PNG\r\n\x1a\n"


def test_attention_cost():
    assert attention_cost(144)["gates"] == 144 * 144 == 20736
    every_pixel = attention_cost(224 * 224)
    assert every_pixel["gates"] == 50176**2
    assert every_pixel["bytes"] == 4 * 50176**2  # about 10 GB
    patches = attention_cost((224 // 16) ** 2)
    assert round(every_pixel["gates"] / patches["gates"]) == 256**2  # (16·16)² = 65,536
    c = attention_cost(100, heads=8, layers=12, bytes_per_value=2)
    assert c["gates"] == 100 * 100 * 8 * 12 and c["bytes"] == 2 * c["gates"]
    for bad in (dict(tokens=0), dict(tokens=1.5), dict(tokens=10, heads=0), dict(tokens=True)):
        with pytest.raises(ValueError):
            attention_cost(**bad)


def test_top_k_share_and_token_strengths():
    row = torch.tensor([0.1, 0.5, 0.05, 0.3, 0.05])
    info = top_k_share(row, k=2)
    assert info["share"] == pytest.approx(0.8) and info["even_split"] == pytest.approx(0.4)
    assert info["tokens"] == [1, 3]
    with pytest.raises(ValueError, match="k"):
        top_k_share(row, k=6)
    tokens = torch.randn(2, 6, 4)
    s = token_strengths(tokens, grid=(2, 3))
    assert s.shape == (2, 2, 3)
    assert s[1, 1, 2].item() == pytest.approx(tokens[1, 5].pow(2).sum().sqrt().item(), rel=1e-6)


def test_figures_are_written(tmp_path):
    g = torch.softmax(torch.randn(144) * 3, 0)
    strengths = torch.rand(12, 12)
    path = tmp_path / "map.png"
    info = plot_attention_map(g, strengths, (2, 6), path, image=torch.rand(28, 28), title="a 7")
    assert (tmp_path / "map.png").read_bytes()[:8] == PNG
    want = g.topk(3).values.sum().item()
    assert info["share"] == pytest.approx(want, rel=1e-6) and info["even_split"] == pytest.approx(3 / 144)
    assert info["top_rc"][0] == divmod(int(g.argmax()), 12)
    with pytest.raises(ValueError, match="query"):
        plot_attention_map(g, strengths, (12, 0), tmp_path / "bad.png")
    rows = plot_attention_cost([("12×12", 144), ("224² pixels", 50176)], tmp_path / "cost.png")
    assert (tmp_path / "cost.png").read_bytes()[:8] == PNG and rows[1]["gates"] == 50176**2


def test_bench_peak_bytes_sees_torch_allocations():
    from gatepool.lab.bench.attention import peak_bytes

    held = peak_bytes(lambda: torch.ones(1024, 1024))  # 4 MiB, returned so still held
    assert 4 * 2**20 <= held < 5 * 2**20
    temp = peak_bytes(lambda: torch.ones(1024, 1024).sum())  # freed inside, but the peak counts it
    assert temp >= 4 * 2**20


def test_bench_runs_on_tiny_sizes(monkeypatch, capsys, tmp_path):
    import gatepool.lab.bench.attention as bench
    from gatepool.cli import main

    monkeypatch.setattr(bench, "QUICK_TOKENS", (16, 64))
    assert main(["bench", "attention", "--json", "--quick", "--out", str(tmp_path / "rec.json")]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record == json.loads((tmp_path / "rec.json").read_text())
    assert {r["name"] for r in record["results"]} == {"torch SDPA", "ours (fused)", "ours (return_weights)"}
    rows = record["results"]
    weights64 = next(r for r in rows if r["tokens"] == 64 and r["name"] == "ours (return_weights)")
    assert weights64["peak_mib"] * 2**20 >= 64 * 64 * 4  # the explicit path holds the (t, t) gate
    assert "target" in record and "memory_exponent" in record
    assert "attention bench" in bench.table(record)
