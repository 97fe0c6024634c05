"""``gatepool bench pool``: forward + backward time and peak memory of every gate against torch's pools.

The cases (``CASES`` on the CPU and on MPS, ``CUDA_CASES`` on a CUDA device), each at its dtype and in its
memory formats, and the tiny input (``TINY``) on every device:

    tiled             (256, 32, 28, 28), k = s = 2        float32, NCHW and channels_last (Tuesday's CNN)
    overlapping       (64, 64, 56, 56), k = 3, s = 2, p = 1   float32, NCHW and channels_last
                      (on CUDA (256, 32, 28, 28), as the GPU targets are stated)
    stem-tiled        (128, 64, 112, 112), k = s = 2      CUDA only: a ResNet stem's map, bfloat16 under
    stem-overlapping  (128, 64, 112, 112), k = 3, s = 2, p = 1   torch.autocast, channels_last (the stem's
                                                          pool as AMP training runs it)
    tiny-tiled        (2, 8, 4, 4), k = s = 2             float32, NCHW, at one thread: the per-call cost
    tiny-overlapping  (2, 8, 4, 4), k = 3, s = 2, p = 1   of the wrappers, not of the arithmetic

and the ways, each ``y = pool(x); y.backward(grad)``:

    F.max_pool2d, F.avg_pool2d           torch's kernels, the baseline (same geometry)
    max, avg, soft, soft-learned,        our GatedPool2d with each gate (channels = C), as a user builds it
    attention, conv                      (the fused kernels where they run, gatepool.layers.fused_pool)
    soft (pure PyTorch)                  soft without the fused kernel: the tiled fast path where windows
                                         tile, else the plain path (not in the tiny cases)
    plain path                           gatepool.layers.windows.soft_pool_unfold (not in the tiny cases)
    unfold + softmax (PyTorch)           the tiny cases' reference line: the formula written in PyTorch
                                         (:func:`unfold_softmax`), what a wrapper-free soft pool costs

Timing: ``torch.utils.benchmark.Timer`` (at the torch thread count; the tiny cases at 1), interleaved:
each round times every way once (``number`` calls), so background load hits all ways alike; the median
over rounds of the per-call time is reported, as a ratio to F.max_pool2d of the same case and memory
format (the targets' value), and beside it the ratio of the fastest rounds (on a busy machine the least
disturbed sample of each way, the better estimate of a tiny call's cost). Peak memory: the most bytes
torch's allocator holds during one forward + backward, beside (on the CPU from its profiler, channels_last
rows only; on CUDA ``torch.cuda.max_memory_allocated`` around the call, every row but the tiny ones).

Targets, where each was set: on the CPU (issue 28) soft, soft-learned and attention ≤ 1.5× in tiled and
overlapping, both formats, and the peak memory of soft ≤ 2× that of F.max_pool2d (tiled, channels_last);
(issue 44) the tiny input's cost ≤ 3× max pool's for soft and soft-learned, ≤ 4× for attention. On CUDA
(issue 44) soft and soft-learned ≤ 1.5× in float32 and ≤ 1.3× at the stem in bfloat16, attention ≤ 2.0×
and ≤ 1.5×; the peak memory of each ≤ 1.1× max pool's (channels_last).

``device`` (auto | cpu | cuda | mps): the input and the pools' weights live there (on CUDA the soft
family runs the Triton kernels of ``gatepool.layers.triton_pool`` where triton is installed, else its
pure-PyTorch paths); the Timer synchronizes the device.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from gatepool.lab.bench.attention import peak_bytes
from gatepool.utils.environment import device_info, machine, resolve_device
from gatepool.utils.threads import num_threads


@dataclass(frozen=True)
class Case:
    """One input and window: ``shape`` (``quick_shape`` with ``--quick``), kernel, stride, padding, the
    input's dtype (a half dtype runs under ``torch.autocast``), its memory formats, and whether it is a
    tiny case (one thread, many calls a sample, the reference line instead of the library's paths)."""

    name: str
    shape: tuple[int, ...]
    quick_shape: tuple[int, ...]
    kernel_size: int
    stride: int
    padding: int
    dtype: torch.dtype = torch.float32
    formats: tuple[str, ...] = ("nchw", "channels_last")
    tiny: bool = False


TINY = (
    Case("tiny-tiled", (2, 8, 4, 4), (2, 8, 4, 4), 2, 2, 0, formats=("nchw",), tiny=True),
    Case("tiny-overlapping", (2, 8, 4, 4), (2, 8, 4, 4), 3, 2, 1, formats=("nchw",), tiny=True),
)
CASES = (
    Case("tiled", (256, 32, 28, 28), (16, 32, 28, 28), 2, 2, 0),
    Case("overlapping", (64, 64, 56, 56), (4, 64, 56, 56), 3, 2, 1),
    *TINY,
)
CUDA_CASES = (
    Case("tiled", (256, 32, 28, 28), (16, 32, 28, 28), 2, 2, 0),
    Case("overlapping", (256, 32, 28, 28), (16, 32, 28, 28), 3, 2, 1),
    Case("stem-tiled", (128, 64, 112, 112), (8, 64, 112, 112), 2, 2, 0, torch.bfloat16, ("channels_last",)),
    Case("stem-overlapping", (128, 64, 112, 112), (8, 64, 112, 112), 3, 2, 1, torch.bfloat16,
         ("channels_last",)),  # fmt: skip
    *TINY,
)
SPEED = ("soft", "soft-learned", "attention")  # the gates with speed targets


def _speed(cases: tuple[str, ...], formats: tuple[str, ...], soft: float, attention: float) -> list:
    """Speed targets: soft and soft-learned ≤ ``soft`` × F.max_pool2d, attention ≤ ``attention`` ×."""
    return [(cases, formats, way, attention if way == "attention" else soft) for way in SPEED]


BOTH = ("nchw", "channels_last")
TARGETS = {  # device type: [(cases, formats, way, the most × F.max_pool2d)]
    "cpu": _speed(("tiled", "overlapping"), BOTH, 1.5, 1.5)
    + _speed(("tiny-tiled", "tiny-overlapping"), ("nchw",), 3.0, 4.0),
    "cuda": _speed(("tiled", "overlapping"), BOTH, 1.5, 2.0)
    + _speed(("stem-tiled", "stem-overlapping"), ("channels_last",), 1.3, 1.5),
}
MEMORY_TARGETS = {  # device type: [(cases, ways, the most × F.max_pool2d's peak, channels_last)]
    "cpu": [(("tiled",), ("soft",), 2.0)],
    "cuda": [(("tiled", "overlapping", "stem-tiled", "stem-overlapping"), SPEED, 1.1)],
}
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}
TINY_ROUNDS = 200, 3  # rounds of a tiny case (full, quick), each of TINY_NUMBER calls a way: short
TINY_NUMBER = 5, 20  # samples, so that on a busy machine some run undisturbed


def cases_for(device: torch.device) -> tuple[Case, ...]:
    """The cases ``gatepool bench pool`` measures on ``device``."""
    return CUDA_CASES if device.type == "cuda" else CASES


def unfold_softmax(k: int, s: int, p: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """SoftPool written in PyTorch, the reference line: out = Σ_j softmax(v)_j v_j over each window
    (``F.unfold``, a softmax over the K taps, a weighted sum; padded taps masked out of the softmax)."""

    def pool(x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W)
        b, c, h, w = x.shape
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        v = F.unfold(x, k, padding=p, stride=s).view(b, c, k * k, ho * wo)  # (B, C, K, L)
        scores = v
        if p:
            inside = F.unfold(x.new_ones(1, 1, h, w), k, padding=p, stride=s).view(1, 1, k * k, ho * wo)
            scores = v.masked_fill(inside == 0, float("-inf"))
        g = torch.softmax(scores, dim=2)  # (B, C, K, L)
        return (g * v).sum(2).view(b, c, ho, wo)  # (B, C, Ho, Wo)

    return pool


def ways(
    channels: int, k: int, s: int, p: int, device: torch.device | None = None, tiny: bool = False
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Every way to pool with window (k, s, p), by name (the learned gates' weights on ``device``); the
    tiny cases' ways end with the reference formula instead of the library's pure-PyTorch paths."""
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
    if tiny:
        out["unfold + softmax (PyTorch)"] = unfold_softmax(k, s, p)
    else:
        out["soft (pure PyTorch)"] = pure_pytorch
        out["plain path"] = plain
    return out


def autocast(
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]], dtype: torch.dtype, device: torch.device
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each way under ``torch.autocast(device, dtype)`` (as AMP training runs a pool); float32: as is."""
    if dtype == torch.float32:
        return fns

    def wrap(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def under_autocast(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast(device.type, dtype=dtype):
                return fn(x)

        return under_autocast

    return {name: wrap(fn) for name, fn in fns.items()}


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


def measure(case: Case, device: torch.device, quick: bool) -> list[dict[str, Any]]:
    """The rows of one case: every way in each of its memory formats (a tiny case at one thread)."""
    shape = case.quick_shape if quick else case.shape
    k, s, p = case.kernel_size, case.stride, case.padding
    if case.tiny:
        rounds, number = TINY_ROUNDS[quick], TINY_NUMBER[quick]
    else:
        rounds, number = (3, 1) if quick else (7, 3)
    rows = []
    with num_threads(1) if case.tiny else contextlib.nullcontext():
        fns = autocast(ways(shape[1], k, s, p, device, tiny=case.tiny), case.dtype, device)
        x = torch.randn(shape).to(device, case.dtype)
        for fmt in case.formats:
            xf = x.contiguous(memory_format=FORMATS[fmt])
            times = time_ways(fns, xf, rounds, number)
            base, fastest = statistics.median(times["F.max_pool2d"]), min(times["F.max_pool2d"])
            with_peak = not case.tiny and (device.type == "cuda" or fmt == "channels_last")
            peaks = {n: _peak(fn, xf, device) for n, fn in fns.items()} if with_peak else {}
            for name, ts in times.items():
                rows.append(
                    {
                        "case": case.name,
                        "shape": list(shape),
                        "kernel_size": k,
                        "stride": s,
                        "padding": p,
                        "dtype": str(case.dtype).removeprefix("torch."),
                        "autocast": case.dtype != torch.float32,
                        "format": fmt,
                        "threads": torch.get_num_threads(),
                        "rounds": rounds,
                        "number": number,
                        "name": name,
                        "median_ms": 1e3 * statistics.median(ts),
                        "min_ms": 1e3 * min(ts),
                        "ratio_to_max_pool2d": statistics.median(ts) / base,
                        "min_ratio_to_max_pool2d": min(ts) / fastest,
                        "times_ms": [1e3 * t for t in ts],
                        "peak_mib": peaks[name] / 2**20 if name in peaks else None,
                    }
                )
    return rows


def run(quick: bool = False, device: Any = "auto", cases: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Measure ``cases`` (names; None: every case of the device); returns the record (``gatepool bench``
    sets the threads, prints and saves it). Targets are reported for the cases measured."""
    from gatepool.layers import fused_pool

    device = resolve_device(device)
    known = {case.name: case for case in cases_for(device)}
    unknown = [name for name in cases or () if name not in known]
    if unknown:
        raise ValueError(f"cases: {', '.join(unknown)} not among {', '.join(known)} (on {device.type})")
    torch.manual_seed(0)
    chosen = [case for name, case in known.items() if cases is None or name in cases]
    results = [row for case in chosen for row in measure(case, device, quick)]
    return {
        "bench": "pool",
        "machine": machine(),
        **device_info(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "fused_kernels": fused_pool.usable(torch.empty(0, device=device)),  # C on the CPU, Triton on CUDA
        "seed": 0,
        "quick": quick,
        "cases": [case.name for case in chosen],
        "results": results,
        "targets": targets(results, device.type),
    }


def _peak(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, device: torch.device) -> int:
    x = x.detach().requires_grad_()
    grad = torch.ones_like(fn(x))
    return peak_bytes(lambda: fn(x).backward(grad), device)


def targets(results: list[dict[str, Any]], device_type: str = "cpu") -> list[dict[str, Any]]:
    """Each target of ``device_type`` (:data:`TARGETS`, :data:`MEMORY_TARGETS`) with the measured value
    and whether it is met, for the cases in ``results`` (a device type without targets: none)."""
    row = {(r["case"], r["format"], r["name"]): r for r in results}
    measured = {r["case"] for r in results}
    out = []
    for cases, formats, way, limit in TARGETS.get(device_type, []):
        for case in (c for c in cases if c in measured):
            for fmt in formats:
                value = row[(case, fmt, way)]["ratio_to_max_pool2d"]
                out.append({"what": f"{way} / F.max_pool2d, {case}, {fmt}", "limit": limit, "value": value,
                            "met": value <= limit})  # fmt: skip
    for cases, names, limit in MEMORY_TARGETS.get(device_type, []):
        for case in (c for c in cases if c in measured):
            base = row[(case, "channels_last", "F.max_pool2d")]["peak_mib"]
            for way in names:
                value = row[(case, "channels_last", way)]["peak_mib"] / base
                out.append({"what": f"peak memory of {way} / F.max_pool2d, {case}, channels_last",
                            "limit": limit, "value": value, "met": value <= limit})  # fmt: skip
    return out


def _device(record: dict[str, Any]) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H200)`` (records from before devices: the CPU)."""
    name = record.get("device_name")
    return record.get("device", "cpu") + (f" ({name})" if name else "")


def table(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"pool bench: forward + backward, median over interleaved rounds; torch {record['torch']}, "
        f"{record['threads']} threads, {m['cpu_count']} cpus ({m['processor'] or m['platform']}, "
        f"{m.get('cpu_capability', 'its kernels not recorded')}); device "
        f"{_device(record)}; fused kernels: {'yes' if record['fused_kernels'] else 'no'}",
    ]
    for case in dict.fromkeys(r["case"] for r in record["results"]):
        rows = [r for r in record["results"] if r["case"] == case]
        r0 = rows[0]
        dtype = r0["dtype"] + (" under autocast" if r0["autocast"] else "")
        lines += [
            "",
            f"{case}: input {tuple(r0['shape'])} {dtype}, k = {r0['kernel_size']}, s = {r0['stride']}, "
            f"p = {r0['padding']}; {r0['threads']} thread(s), {r0['rounds']} rounds of {r0['number']} "
            "call(s)",
            f"{'way':<27} {'format':<14} {'median ms':>10} {'min ms':>10} {'× max_pool2d':>13} "
            f"{'(of min)':>9} {'peak MiB':>9}",
        ]
        for r in rows:
            peak = f"{r['peak_mib']:>9.1f}" if r["peak_mib"] is not None else f"{'':>9}"
            digits = 4 if r0["case"].startswith("tiny") or r["median_ms"] < 1 else 2
            lines.append(f"{r['name']:<27} {r['format']:<14} {r['median_ms']:>10.{digits}f} "
                         f"{r['min_ms']:>10.{digits}f} {r['ratio_to_max_pool2d']:>13.2f} "
                         f"{r['min_ratio_to_max_pool2d']:>9.2f} {peak}")  # fmt: skip
    lines.append("")
    for t in record["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        lines.append(f"target {t['what']} ≤ {t['limit']}×: {t['value']:.2f}× ({verdict})")
    return "\n".join(lines)
