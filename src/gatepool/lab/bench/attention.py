"""``gatepool bench attention``: time and peak memory of our attention against torch's SDPA.

Batch 1, 1 head, d = 64, float32 (on ``device``, see below), forward under ``torch.no_grad()``,
t = 256, 1024, 4096 tokens (self-attention: t queries, t keys). Three ways, timed by
``torch.utils.benchmark.Timer`` one round at a time (each way once per round, so background load hits
all alike; :func:`time_calls`), median over rounds:

    torch SDPA                F.scaled_dot_product_attention, the baseline
    ours (fused)              gatepool.layers.attention.scaled_dot_product_attention (calls torch's kernel)
    ours (return_weights)     the explicit path: the (t, t) gate is materialised and returned

Peak memory is what torch's allocator holds at its highest during one call, output included, from the
profiler's allocation events (``torch.profiler`` with ``profile_memory=True``: tracemalloc does not see
torch's allocations, and process RSS is blurred by the C allocator's caching). Its growth is summarised
by the exponent ``log(peak(t₂)/peak(t₁)) / log(t₂/t₁)`` between the two largest t: 2 means ∝ t².

Targets: ours (fused) ≤ 1.2 × torch SDPA at every t; its memory exponent < 1.5 (not t²).

``device`` (auto | cpu | cuda | mps): on a GPU the tensors live there, the Timer synchronizes the device
before it reads its clock, and peak memory is ``torch.cuda.max_memory_allocated`` during the call.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from gatepool.utils.environment import device_info, machine, resolve_device

TOKENS, QUICK_TOKENS = (256, 1024, 4096), (256, 1024)
DIM = 64
TIME_TARGET, EXPONENT_TARGET = 1.2, 1.5


def ways() -> dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]]:
    from gatepool.layers.attention import scaled_dot_product_attention

    return {
        "torch SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        "ours (fused)": lambda q, k, v: scaled_dot_product_attention(q, k, v),
        "ours (return_weights)": lambda q, k, v: scaled_dot_product_attention(q, k, v, return_weights=True),
    }


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a GPU runs asynchronously): before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_calls(
    fns: dict[str, Callable[..., Any]], args: tuple, rounds: int, *, number: int = 1, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of each ``fn(*args)``: ``rounds`` samples, each the mean of ``number`` calls.

    ``torch.utils.benchmark.Timer`` at the current torch thread count (it synchronizes an accelerator
    before reading its clock, and runs two calls of its own before each sample), interleaved: each round
    times every way once, so background load hits all ways alike. ``warmup`` calls of each way come first
    (first-call costs: allocations, kernel selection).
    """
    threads = torch.get_num_threads()  # the Timer's default is 1
    timers = {name: Timer("fn(*args)", globals={"fn": fn, "args": args}, num_threads=threads)
              for name, fn in fns.items()}  # fmt: skip
    for fn in fns.values():
        for _ in range(warmup):
            fn(*args)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, timer in timers.items():
            times[name].append(timer.timeit(number).mean)
    return times


def peak_bytes(fn: Callable[[], Any], device: torch.device | None = None) -> int:
    """Highest bytes held by torch's allocator during ``fn()`` (allocations made inside it)."""
    from torch.profiler import ProfilerActivity, profile

    if device is not None and device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = fn()
        sync(device)
        del out
        return torch.cuda.max_memory_allocated(device) - before

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    del out
    held = peak = 0
    for _, nbytes in events:  # frees come as negative sizes
        held += nbytes
        peak = max(peak, held)
    return peak


def run(quick: bool = False, device: Any = "auto") -> dict[str, Any]:
    """Measure; returns the record (``gatepool bench`` sets the threads, prints and saves it)."""
    device = resolve_device(device)
    torch.manual_seed(0)
    tokens = QUICK_TOKENS if quick else TOKENS
    warmup, rounds = (1, 3) if quick else (3, 15)
    fns = ways()
    results = []
    with torch.no_grad():
        for t in tokens:
            q, k, v = (torch.randn(1, 1, t, DIM).to(device) for _ in range(3))
            times = time_calls(fns, (q, k, v), rounds, warmup=warmup)  # one call per sample
            base = statistics.median(times["torch SDPA"])
            for name, fn in fns.items():
                med = statistics.median(times[name])
                results.append({
                    "tokens": t,
                    "name": name,
                    "median_ms": 1e3 * med,
                    "min_ms": 1e3 * min(times[name]),
                    "ratio_to_torch": med / base,
                    "peak_mib": peak_bytes(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), device) / 2**20,
                    "times_ms": [1e3 * s for s in times[name]],
                })  # fmt: skip

    def row(t: int, name: str) -> dict:
        return next(r for r in results if r["tokens"] == t and r["name"] == name)

    t1, t2 = tokens[-2], tokens[-1]
    exponents = {}
    for name in fns:
        p1, p2 = row(t1, name)["peak_mib"], row(t2, name)["peak_mib"]
        exponents[name] = math.log(p2 / p1) / math.log(t2 / t1) if p1 > 0 and p2 > 0 else None
    fused_ratio = max(r["ratio_to_torch"] for r in results if r["name"] == "ours (fused)")
    return {
        "bench": "attention",
        "machine": machine(),
        **device_info(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": 1,
        "heads": 1,
        "dim": DIM,
        "dtype": "float32",
        "tokens": list(tokens),
        "warmup": warmup,
        "rounds": rounds,
        "timer": "torch.utils.benchmark.Timer.timeit(1) per round",
        "quick": quick,
        "results": results,
        "memory_exponent": {"between": [t1, t2], **exponents},
        "target": {
            "fused_ratio_max": TIME_TARGET,
            "fused_ratio": fused_ratio,
            "fused_time_met": fused_ratio <= TIME_TARGET,
            "fused_memory_exponent_max": EXPONENT_TARGET,
            "fused_memory_exponent": exponents["ours (fused)"],
            "fused_memory_met": exponents["ours (fused)"] is not None
            and exponents["ours (fused)"] < EXPONENT_TARGET,
        },
    }


def table(record: dict[str, Any]) -> str:
    machine = record["machine"]
    lines = [
        f"attention bench: batch 1, 1 head, d = {record['dim']}, float32, forward (no grad), median of "
        f"{record['rounds']} rounds; torch {record['torch']}, {record['threads']} threads, "
        f"{machine['cpu_count']} cpus ({machine['processor'] or machine['platform']}), device "
        f"{record.get('device', 'cpu')} {record.get('device_name', '')}".rstrip(),
        f"{'t':>6} {'way':<22} {'median ms':>10} {'min ms':>10} {'× torch':>8} {'peak MiB':>10}",
    ]
    for r in record["results"]:
        lines.append(
            f"{r['tokens']:>6} {r['name']:<22} {r['median_ms']:>10.3f} {r['min_ms']:>10.3f} "
            f"{r['ratio_to_torch']:>8.2f} {r['peak_mib']:>10.2f}"
        )
    exps = record["memory_exponent"]
    t1, t2 = exps["between"]
    shown = ", ".join(f"{name} {e:.2f}" for name, e in exps.items() if name != "between" and e is not None)
    lines.append(f"memory exponent between t = {t1} and {t2} (2 = grows as t²): {shown}")
    tg = record["target"]
    met = {True: "met", False: "NOT met"}
    lines.append(
        f"target ours (fused) ≤ {tg['fused_ratio_max']}× torch: worst {tg['fused_ratio']:.2f}× "
        f"({met[tg['fused_time_met']]}); memory exponent < {tg['fused_memory_exponent_max']}: "
        f"{met[tg['fused_memory_met']]}"
    )
    return "\n".join(lines)

