"""``gatepool bench pool``: forward + backward time of every gate against torch's own pools.

Input (256, 32, 28, 28) float32, 2×2 windows with stride 2 (the pools of Tuesday's CNN), in NCHW and in
channels_last. Timed in one process, one round at a time (every way once per round, so background load
hits all ways alike), median over rounds of ``y = pool(x); y.backward(grad)``:

    F.max_pool2d, F.avg_pool2d           torch's kernels, the baseline
    max, avg, soft, soft-learned,        our GatedPool2d with each gate (channels = 32)
    attention, conv
    unfold+softmax                       the plain soft pool: x.unfold → softmax → Σ g·v, autograd

Each is reported as a ratio to F.max_pool2d in the same memory format.
Target: soft ≤ 1.5 × F.max_pool2d in channels_last.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from gatepool.utils.environment import machine

TARGET = 1.5
SHAPE, QUICK_SHAPE = (256, 32, 28, 28), (16, 32, 28, 28)


def unfold_softmax_pool(x: torch.Tensor) -> torch.Tensor:
    """The plain soft pool, k = s = 2: unfold the windows, softmax over each, weighted sum."""
    n, c, h, w = x.shape
    windows = x.unfold(2, 2, 2).unfold(3, 2, 2).reshape(n, c, h // 2, w // 2, 4)  # (N, C, H/2, W/2, 4)
    return (torch.softmax(windows, dim=-1) * windows).sum(-1)


def ways(channels: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Every way to pool, by name."""
    from gatepool.layers import GATES, GatedPool2d

    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "F.max_pool2d": lambda x: F.max_pool2d(x, 2),
        "F.avg_pool2d": lambda x: F.avg_pool2d(x, 2),
    }
    for gate in GATES:
        out[gate] = GatedPool2d(2, gate=gate, channels=channels)
    out["unfold+softmax"] = unfold_softmax_pool
    return out


def time_ways(
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, warmup: int, rounds: int
) -> dict[str, list[float]]:
    """Seconds of forward + backward per way, one sample per round."""
    x = x.detach().requires_grad_()
    grads = {}
    for name, fn in fns.items():  # warm-up, and one upstream gradient per output shape
        for _ in range(warmup):
            y = fn(x)
            grads[name] = torch.ones_like(y)
            y.backward(grads[name])
            x.grad = None
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(x).backward(grads[name])
            times[name].append(time.perf_counter() - t0)
            x.grad = None
    return times


def run(quick: bool = False) -> dict[str, Any]:
    """Measure; returns the record (``gatepool bench`` sets the threads, prints and saves it)."""
    torch.manual_seed(0)
    shape = QUICK_SHAPE if quick else SHAPE
    warmup, rounds = (1, 3) if quick else (3, 15)
    fns = ways(shape[1])
    results = []
    x = torch.randn(shape)
    for fmt, memory_format in (("nchw", torch.contiguous_format), ("channels_last", torch.channels_last)):
        times = time_ways(fns, x.contiguous(memory_format=memory_format), warmup, rounds)
        base = statistics.median(times["F.max_pool2d"])
        for name, ts in times.items():
            med = statistics.median(ts)
            results.append(
                {
                    "format": fmt,
                    "name": name,
                    "median_ms": 1e3 * med,
                    "min_ms": 1e3 * min(ts),
                    "ratio_to_max_pool2d": med / base,
                    "times_ms": [1e3 * t for t in ts],
                }
            )
    soft_cl = next(r for r in results if r["format"] == "channels_last" and r["name"] == "soft")
    return {
        "bench": "pool",
        "machine": machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "input_shape": list(shape),
        "kernel_size": 2,
        "stride": 2,
        "dtype": "float32",
        "warmup": warmup,
        "rounds": rounds,
        "quick": quick,
        "results": results,
        "target": {
            "soft_channels_last_ratio_max": TARGET,
            "soft_channels_last_ratio": soft_cl["ratio_to_max_pool2d"],
        },
    }


def table(record: dict[str, Any]) -> str:
    machine = record["machine"]
    lines = [
        f"pool bench: input {tuple(record['input_shape'])} float32, k = s = 2, forward + backward, "
        f"median of {record['rounds']} rounds; torch {record['torch']}, {record['threads']} threads, "
        f"{machine['cpu_count']} cpus ({machine['processor'] or machine['platform']})",
        f"{'way':<16} {'format':<14} {'median ms':>10} {'min ms':>10} {'× max_pool2d':>13}",
    ]
    for r in record["results"]:
        lines.append(
            f"{r['name']:<16} {r['format']:<14} {r['median_ms']:>10.2f} {r['min_ms']:>10.2f} "
            f"{r['ratio_to_max_pool2d']:>13.2f}"
        )
    t = record["target"]
    ok = "met" if t["soft_channels_last_ratio"] <= t["soft_channels_last_ratio_max"] else "NOT met"
    lines.append(
        f"target soft ≤ {t['soft_channels_last_ratio_max']}× F.max_pool2d (channels_last): "
        f"{t['soft_channels_last_ratio']:.2f}× ({ok})"
    )
    return "\n".join(lines)

