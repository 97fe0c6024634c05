"""``gatepool bench`` prints its table, not the lines torch's profiler (kineto) logs at each use, nor the
CUDA build's warning about a missing CUDA runtime."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

PEAK = """
import torch
from gatepool.lab.bench.attention import peak_bytes
x = torch.randn(4, 8, 6, 6)
peak_bytes(lambda: torch.nn.functional.max_pool2d(x, 2))
"""

# the bench command itself, its measurement cut to one profiled call (the whole bench takes minutes)
BENCH = """
import torch
import gatepool.lab.bench.pool as pool
from gatepool.cli import main

def run(quick, device):
    x = torch.randn(4, 8, 6, 6)
    return {"peak": pool._peak(lambda t: torch.nn.functional.max_pool2d(t, 2), x, device)}

pool.run, pool.table = run, lambda record: f"the table: {record['peak']} bytes"
raise SystemExit(main(["bench", "pool", "--threads", "1"]))
"""


def python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_bench_pool_prints_no_profiler_log_lines():
    plain = python(PEAK)  # the profiler as it is: torch 2.13's logs profiler_start / profiler_stop
    assert plain.returncode == 0, plain.stderr
    bench = python(BENCH)
    assert bench.returncode == 0, bench.stderr
    assert bench.stdout.startswith("the table: ") and int(bench.stdout.split()[2]) > 0
    if "profiler_start" in plain.stderr:  # where this torch logs them, the bench must not
        assert "profiler_start" not in bench.stderr + bench.stdout, bench.stderr
    assert "USDT" not in bench.stderr + bench.stdout


# bench probe (it needs torchvision: make test-vision runs this file on the CUDA build of torch), its
# measurement stubbed, the command as it is
PROBE = """
import gatepool.lab.bench.probe as probe
from gatepool.cli import main

probe.run, probe.table = (lambda quick, device: {}), (lambda record: "the table")
raise SystemExit(main(["bench", "probe", "--threads", "1"]))
"""


def test_bench_prints_no_cuda_home_warning():
    plain = python("import torch.utils.benchmark")  # torch's CUDA build on a machine without CUDA warns
    assert plain.returncode == 0, plain.stderr
    bench = python(PROBE)
    if "needs torchvision" in bench.stderr:
        pytest.skip("bench probe needs torchvision (make test-vision)")
    assert bench.returncode == 0, bench.stderr
    assert bench.stdout.strip() == "the table"
    if "No CUDA runtime is found" in plain.stderr:  # where this torch warns, the bench must not
        assert "No CUDA runtime" not in bench.stderr, bench.stderr
