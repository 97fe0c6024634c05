"""``gatepool bench pool``: forward + backward time and peak memory of every gate against torch's pools.

Two geometries, float32, in NCHW and in channels_last:

    tiled        (256, 32, 28, 28), k = s = 2          the pools of Tuesday's CNN
    overlapping  (64, 64, 56, 56),  k = 3, s = 2, p = 1  the ResNet stem's pool

and the ways, each ``y = pool(x); y.backward(grad)``:

    F.max_pool2d, F.avg_pool2d           torch's kernels, the baseline (same geometry)
    max, avg, soft, soft-learned,        our GatedPool2d with each gate (channels = C): the fused kernels
    attention, conv                      for the soft family when they are built (gatepool.layers.fused_pool)
    soft (pure PyTorch)                  soft without the fused kernel: the tiled fast path where windows
                                         tile, else the plain path
    plain path                           gatepool.layers.windows.soft_pool_unfold: unfold, softmax, sum

Timing: ``torch.utils.benchmark.Timer`` (at the torch thread count), interleaved: each round times every
way once (``number`` calls), so background load hits all ways alike; the median over rounds of the
per-call time is reported, as a ratio to F.max_pool2d of the same geometry and memory format. Peak
memory: the most bytes torch's allocator holds during one forward + backward (its profiler), beside.
Targets (issue 28): soft, soft-learned and attention ≤ 1.5× in both geometries and both formats; peak
memory of soft ≤ 2× that of F.max_pool2d (tiled, channels_last).

``device`` (auto | cpu | cuda | mps): the input and the pools' weights live there (on CUDA the soft
family runs the Triton kernels of ``gatepool.layers.triton_pool`` where triton is installed, else its
pure-PyTorch paths); the Timer synchronizes the device, and peak memory on CUDA is
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from gatepool.lab.bench.attention import peak_bytes
from gatepool.utils.environment import device_info, machine, resolve_device

CASES = {  # name: (shape, quick shape, kernel, stride, padding)
    "tiled": ((256, 32, 28, 28), (16, 32, 28, 28), 2, 2, 0),
    "overlapping": ((64, 64, 56, 56), (4, 64, 56, 56), 3, 2, 1),
}
TARGETS = [  # (case, formats, way, the most × F.max_pool2d)
    (case, ("nchw", "channels_last"), way, 1.5)
    for case in ("tiled", "overlapping")
    for way in ("soft", "soft-learned", "attention")
]
MEMORY_TARGET = 2.0  # peak bytes of soft / F.max_pool2d, tiled, channels_last
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def ways(
    channels: int, k: int, s: int, p: int, device: torch.device | None = None
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Every way to pool with window (k, s, p), by name (the learned gates' weights on ``device``)."""
    from gatepool.layers import GATES, GatedPool2d
    from gatepool.layers.soft_pool import soft_pool_tiled
    from gatepool.layers.windows import pool_geometry, soft_pool_unfold

    def plain(x: torch.Tensor) -> torch.Tensor:
        return soft_pool_unfold(x, pool_geometry(x, 2, k, s, p))[0]

    def pure_pytorch(x: torch.Tensor) -> torch.Tensor:
        geo = pool_geometry(x, 2, k, s, p)
        return soft_pool_tiled(x, geo, 1.0) if geo.tiles else soft_pool_unfold(x, geo)[0]

    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "F.max_pool2d": lambda x: F.max_pool2d(x, k, s, p),
        "F.avg_pool2d": lambda x: F.avg_pool2d(x, k, s, p),
    }
    for gate in GATES:
        out[gate] = GatedPool2d(k, s, p, gate=gate, channels=channels).to(device)
    out["soft (pure PyTorch)"] = pure_pytorch
    out["plain path"] = plain
    return out


def time_ways(
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, rounds: int, number: int
) -> dict[str, list[float]]:
    """Seconds per forward + backward call of each way: one sample (a mean of ``number`` calls) a round."""
    x = x.detach().requires_grad_()
    timers = {}
    for name, fn in fns.items():
        grad = torch.ones_like(fn(x))  # one upstream gradient per output shape
        timers[name] = Timer(
            "fn(x).backward(grad); x.grad = None",
            globals={"fn": fn, "x": x, "grad": grad},
            num_threads=torch.get_num_threads(),
        )
        timers[name].timeit(1)  # warm-up: first-call costs (and the kernels' build) paid here
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, timer in timers.items():
            times[name].append(timer.timeit(number).mean)
    return times


def run(quick: bool = False, device: Any = "auto") -> dict[str, Any]:
    """Measure; returns the record (``gatepool bench`` sets the threads, prints and saves it)."""
    from gatepool.layers import fused_pool

    device = resolve_device(device)
    torch.manual_seed(0)
    rounds, number = (3, 1) if quick else (7, 3)
    results = []
    for case, (shape, quick_shape, k, s, p) in CASES.items():
        shape = quick_shape if quick else shape
        fns = ways(shape[1], k, s, p, device)
        x = torch.randn(shape).to(device)
        for fmt, memory_format in FORMATS.items():
            xf = x.contiguous(memory_format=memory_format)
            times = time_ways(fns, xf, rounds, number)
            base = statistics.median(times["F.max_pool2d"])
            peaks = {n: _peak(fn, xf, device) for n, fn in fns.items()} if fmt == "channels_last" else {}
            for name, ts in times.items():
                results.append(
                    {
                        "case": case,
                        "shape": list(shape),
                        "kernel_size": k,
                        "stride": s,
                        "padding": p,
                        "format": fmt,
                        "name": name,
                        "median_ms": 1e3 * statistics.median(ts),
                        "min_ms": 1e3 * min(ts),
                        "ratio_to_max_pool2d": statistics.median(ts) / base,
                        "times_ms": [1e3 * t for t in ts],
                        "peak_mib": peaks[name] / 2**20 if name in peaks else None,
                    }
                )
    return {
        "bench": "pool",
        "machine": machine(),
        **device_info(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "fused_kernels": fused_pool.usable(torch.empty(0, device=device)),  # C on the CPU, Triton on CUDA
        "dtype": "float32",
        "rounds": rounds,
        "number": number,
        "quick": quick,
        "results": results,
        "targets": targets(results),
    }


def _peak(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, device: torch.device) -> int:
    x = x.detach().requires_grad_()
    grad = torch.ones_like(fn(x))
    return peak_bytes(lambda: fn(x).backward(grad), device)


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it is met."""
    row = {(r["case"], r["format"], r["name"]): r for r in results}
    out = []
    for case, formats, way, limit in TARGETS:
        for fmt in formats:
            value = row[(case, fmt, way)]["ratio_to_max_pool2d"]
            out.append({"what": f"{way} / F.max_pool2d, {case}, {fmt}", "limit": limit, "value": value,
                        "met": value <= limit})  # fmt: skip
    soft, base = row[("tiled", "channels_last", "soft")], row[("tiled", "channels_last", "F.max_pool2d")]
    value = soft["peak_mib"] / base["peak_mib"]
    out.append({"what": "peak memory of soft / F.max_pool2d, tiled, channels_last", "limit": MEMORY_TARGET,
                "value": value, "met": value <= MEMORY_TARGET})  # fmt: skip
    return out


def _device(record: dict[str, Any]) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H200)`` (records from before devices: the CPU)."""
    name = record.get("device_name")
    return record.get("device", "cpu") + (f" ({name})" if name else "")


def table(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"pool bench: float32, forward + backward, median of {record['rounds']} rounds of {record['number']} "
        f"call(s); torch {record['torch']}, {record['threads']} threads, {m['cpu_count']} cpus "
        f"({m['processor'] or m['platform']}); device {_device(record)}; fused kernels: "
        f"{'yes' if record['fused_kernels'] else 'no'}",
    ]
    for case in CASES:
        rows = [r for r in record["results"] if r["case"] == case]
        r0 = rows[0]
        lines += [
            "",
            f"{case}: input {tuple(r0['shape'])}, k = {r0['kernel_size']}, s = {r0['stride']}, "
            f"p = {r0['padding']}",
            f"{'way':<20} {'format':<14} {'median ms':>10} {'min ms':>10} {'× max_pool2d':>13} "
            f"{'peak MiB':>9}",
        ]
        for r in rows:
            peak = f"{r['peak_mib']:>9.1f}" if r["peak_mib"] is not None else f"{'':>9}"
            lines.append(f"{r['name']:<20} {r['format']:<14} {r['median_ms']:>10.2f} {r['min_ms']:>10.2f} "
                         f"{r['ratio_to_max_pool2d']:>13.2f} {peak}")  # fmt: skip
    lines.append("")
    for t in record["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        lines.append(f"target {t['what']} ≤ {t['limit']}×: {t['value']:.2f}× ({verdict})")
    return "\n".join(lines)
