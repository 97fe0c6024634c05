"""``gatepool bench pool``'s cases, one at a time: the tiny input's rows (one thread, every gate, the
reference formula), the CUDA cases and their targets (checked as data: no GPU here), a bfloat16 case under
autocast as CUDA runs the stem's (on the CPU, small), and ``--cases``."""

import math

import pytest
import torch

from gatepool.cli import main
from gatepool.lab.bench import pool
from gatepool.layers import GATES, soft_pool2d
from gatepool.utils.threads import num_threads


@pytest.mark.parametrize("k, s, p", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_the_reference_formula_is_soft_pool(k, s, p):
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(pool.unfold_softmax(k, s, p)(x), soft_pool2d(x, k, s, p))


def test_the_cases_by_device():
    cpu = {c.name: c for c in pool.cases_for(torch.device("cpu"))}
    cuda = {c.name: c for c in pool.cases_for(torch.device("cuda"))}  # a device name: no GPU needed
    assert list(cpu) == ["tiled", "overlapping", "tiny-tiled", "tiny-overlapping"]
    assert list(cuda) == ["tiled", "overlapping", "stem-tiled", "stem-overlapping", *list(cpu)[2:]]
    for name in ("stem-tiled", "stem-overlapping"):
        stem = cuda[name]
        assert stem.shape == (128, 64, 112, 112) and stem.dtype == torch.bfloat16
        assert stem.formats == ("channels_last",)
    assert cuda["overlapping"].shape == (256, 32, 28, 28) == cuda["tiled"].shape
    overlapping = cuda["overlapping"]
    assert (overlapping.kernel_size, overlapping.stride, overlapping.padding) == (3, 2, 1)
    assert cpu["overlapping"].shape == (64, 64, 56, 56)  # the CPU keeps its sizes
    assert cpu["tiny-tiled"].shape == (2, 8, 4, 4) and cpu["tiny-tiled"].tiny


def _rows(cases, formats_of, ratio: float, peak: float) -> list[dict]:
    names = ["F.max_pool2d", *GATES]
    return [
        {"case": c, "format": f, "name": n, "ratio_to_max_pool2d": 1.0 if n == "F.max_pool2d" else ratio,
         "peak_mib": 10.0 if n == "F.max_pool2d" else 10.0 * peak}  # fmt: skip
        for c in cases
        for f in formats_of(c)
        for n in names
    ]


def test_the_cuda_targets():
    cases = [c.name for c in pool.CUDA_CASES]
    formats = {c.name: c.formats for c in pool.CUDA_CASES}
    got = {t["what"]: t for t in pool.targets(_rows(cases, formats.get, 1.4, 1.05), "cuda")}
    assert got["soft / F.max_pool2d, tiled, nchw"]["limit"] == 1.5
    assert got["attention / F.max_pool2d, overlapping, channels_last"]["limit"] == 2.0
    assert got["soft-learned / F.max_pool2d, stem-tiled, channels_last"]["limit"] == 1.3
    assert got["attention / F.max_pool2d, stem-overlapping, channels_last"]["limit"] == 1.5
    assert got["peak memory of soft / F.max_pool2d, stem-overlapping, channels_last"]["limit"] == 1.1
    assert len(got) == 3 * 2 * 2 + 3 * 2 + 3 * 4  # fp32 cases × formats, the stem's, memory in 4 cases
    assert not any("tiny" in what for what in got)  # the tiny input's targets are the CPU's
    assert not got["soft / F.max_pool2d, stem-tiled, channels_last"]["met"]  # 1.4 > 1.3
    assert got["soft / F.max_pool2d, tiled, nchw"]["met"]  # 1.4 ≤ 1.5
    assert all(got[w]["met"] for w in got if w.startswith("peak"))  # 1.05 ≤ 1.1
    assert pool.targets(_rows(["tiny-tiled"], lambda c: ("nchw",), 1.0, 1.0), "mps") == []


@pytest.mark.slow  # timed: a few seconds
def test_the_tiny_case_runs_at_one_thread_beside_max_pool(capsys):
    with num_threads(2):
        rec = pool.run(quick=True, device="cpu", cases=("tiny-overlapping",))
        assert torch.get_num_threads() == 2  # restored
    assert rec["cases"] == ["tiny-overlapping"] and rec["threads"] == 2
    rows = {r["name"]: r for r in rec["results"]}
    assert list(rows) == ["F.max_pool2d", "F.avg_pool2d", *GATES, "unfold + softmax (PyTorch)"]
    for r in rows.values():
        assert r["threads"] == 1 and r["shape"] == [2, 8, 4, 4] and (r["kernel_size"], r["padding"]) == (3, 1)
        assert r["peak_mib"] is None and r["number"] == pool.TINY_NUMBER[True]
        assert all(t > 0 for t in r["times_ms"]) and math.isfinite(r["ratio_to_max_pool2d"])
    assert rows["F.max_pool2d"]["ratio_to_max_pool2d"] == 1.0
    assert [t["what"] for t in rec["targets"]] == [
        f"{gate} / F.max_pool2d, tiny-overlapping, nchw" for gate in ("soft", "soft-learned", "attention")
    ]
    assert "tiny-overlapping: input (2, 8, 4, 4) float32, k = 3, s = 2, p = 1; 1 thread(s)" in pool.table(rec)
    assert f", {torch.backends.cpu.get_cpu_capability()}); device cpu" in pool.table(rec)  # the kernels' set


@pytest.mark.slow  # timed: a few seconds
def test_a_bfloat16_case_runs_every_gate_under_autocast():
    case = pool.Case("stem-overlapping", (2, 16, 10, 10), (2, 16, 10, 10), 3, 2, 1, torch.bfloat16,
                     ("channels_last",))  # fmt: skip
    rows = pool.measure(case, torch.device("cpu"), quick=True)
    assert [r["name"] for r in rows] == ["F.max_pool2d", "F.avg_pool2d", *GATES, "soft (pure PyTorch)",
                                         "plain path"]  # fmt: skip
    for r in rows:
        assert r["dtype"] == "bfloat16" and r["autocast"] and r["format"] == "channels_last"
        assert r["peak_mib"] > 0 and all(t > 0 for t in r["times_ms"])


def test_unknown_cases_are_refused_in_one_line(capsys):
    assert main(["bench", "pool", "--quick", "--cases", "tiny-tiled,stem-tiled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "stem-tiled not among tiled, overlapping, tiny-tiled, tiny-overlapping (on cpu)" in err[0]
