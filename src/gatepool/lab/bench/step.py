"""``gatepool bench step``: a training step of torchvision's ResNet with its pools converted to each gate.

What is timed, per net: one training step as AMP training runs it, channels_last,

    with torch.autocast(device, bfloat16):  loss = cross_entropy(net(x), y)      # x: (B, 3, S, S)
    loss.backward(); sgd.step(); sgd.zero_grad(set_to_none=True)                 # SGD, momentum 0.9

for torchvision's ``model`` (the defaults below) at random init (seed 0), ``torch.backends.cudnn.benchmark``
on (as ImageNet recipes train; restored after), as it is (max pool, the baseline) and with its pools
converted to each gate (``gatepool.layers.convert.convert(net, gate, example_input=…)``: ResNet's
stem max pool, 3×3 stride 2 padding 1; the head's global average pool stays), each eager and, with
``compile``, through ``torch.compile`` (the net compiled, the optimizer step eager). Every net starts
from the same weights and sees the same batch (random images and labels, seed 0).

Defaults, by device: on CUDA ResNet-50 at 224 × 224, batch 128 (the ImageNet recipe, one GPU's share),
eager and compiled; elsewhere ResNet-18 at 112 × 112, batch 16, eager only (about a minute on two CPU
cores; ResNet-18 has ResNet-50's stem, so its pool sees the same (B, 64, 56, 56) map while the rest of
the step is 2.3× cheaper: the gate's share of a step is larger, the comparison stricter).

Timing: ``warmup`` steps of each net first (first-call costs; a compiled net's compile), then ``steps``
rounds, each one step of every net (interleaved: background load hits every net alike), the device
synchronized before and after each step; the median over rounds is reported, and its ratio to the
max-pool net's in the same mode. On CUDA also the peak memory of one step beyond what the nets hold
(``torch.cuda.max_memory_allocated``). ``budget``: a net whose warm-up would start after this many
seconds of the bench is left out ("skipped"), so a slow compile cannot run on for long; a net whose
conversion, warm-up or compile raises is "failed", with the error's first line; the others are timed. A
SIGTERM (``timeout``'s) stops the warm-ups where they are, and the rounds ``GRACE_S`` after it (at least
one round is timed): the nets warmed up are timed over the rounds done, and the record says which were
stopped, so a time limit does not lose the run.

Targets (issue 44, ResNet-50 at 224 on a GPU, eager and compiled): soft ≤ 1.05 × the max-pool net's
step time, attention ≤ 1.10 ×; reported on CUDA only.

Needs torchvision (``pip install gatepool[vision]``; ``make test-vision``'s ``.venv-vision`` has it):
:data:`REQUIRES` names it, and ``gatepool bench step`` says so in one line where it is missing.
"""

from __future__ import annotations

import contextlib
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.lab.bench.attention import sync
from gatepool.utils.checks import check_int, check_number
from gatepool.utils.environment import device_info, machine, resolve_device

REQUIRES = ("torchvision",)
DEFAULTS = {  # device type ("cuda", or any other: "cpu"): what the bench runs without options
    "cuda": {"model": "resnet50", "size": 224, "batch": 128, "steps": 20, "warmup": 3, "compile": True},
    "cpu": {"model": "resnet18", "size": 112, "batch": 16, "steps": 10, "warmup": 2, "compile": False},
}
QUICK = {"steps": 3, "warmup": 1}
BUDGET_S = 300.0
GRACE_S = 5.0  # after a SIGTERM the timed rounds go on this long (at least one round), then stop
LR, MOMENTUM = 1e-3, 0.9
TARGETS = {"soft": 1.05, "attention": 1.10}  # × the max-pool net's step, each mode, on CUDA


def defaults(device: Any) -> dict[str, Any]:
    """The settings ``gatepool bench step`` uses on ``device`` where no option says otherwise."""
    return dict(DEFAULTS["cuda" if torch.device(device).type == "cuda" else "cpu"])


@dataclass
class Net:
    """One timed net: its gate ("max": the model as torchvision builds it), mode, and what it holds."""

    gate: str
    mode: str  # "eager" or "compiled"
    model: nn.Module | None = None
    step: Callable[[], None] | None = None
    replaced: list[str] = field(default_factory=list)
    status: str = "measured"  # "measured", "skipped: …" or "failed: …"
    warmup_s: float = 0.0
    peak_mib: float | None = None
    times: list[float] = field(default_factory=list)


def build(model: str, gate: str, x: torch.Tensor, device: torch.device) -> tuple[nn.Module, list[str]]:
    """torchvision's ``model`` (random init, seed 0) with its pools converted to ``gate`` ("max": as
    built), channels_last on ``device``; returns it and the names of the pools replaced. The seed is set
    before the model is built, so the gates' own weights are the same in every mode too."""
    from gatepool.analysis.convert_zoo import build as build_model
    from gatepool.layers.convert import convert

    net = build_model(f"tv:{model}", seed=0)
    replaced = []
    if gate != "max":
        net, done = convert(net, gate, example_input=x[:2].float().cpu())
        replaced = [r.name for r in done]
    return net.to(device, memory_format=torch.channels_last), replaced


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One step (forward under bf16 autocast, backward, SGD with momentum) of ``model``."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(step: Callable[[], None], device: torch.device) -> float:
    """Seconds one ``step()`` takes, the device synchronized before and after."""
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - start


def run(
    quick: bool = False,
    device: Any = "auto",
    *,
    model: str | None = None,
    size: int | None = None,
    batch: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    gates: tuple[str, ...] | None = None,
    compile: bool | None = None,
    budget: float = BUDGET_S,
) -> dict[str, Any]:
    """Measure; returns the record (``gatepool bench`` sets the threads, prints and saves it). Every
    setting left None takes :func:`defaults` (``quick``: :data:`QUICK`'s steps and warm-up)."""
    import torchvision

    from gatepool.layers import GATES

    device = resolve_device(device)
    given = dict(model=model, size=size, batch=batch, steps=steps, warmup=warmup, compile=compile)
    settings = defaults(device) | (QUICK if quick else {})
    settings |= {k: v for k, v in given.items() if v is not None}
    for name in ("size", "batch", "steps", "warmup"):
        check_int(settings[name], name, 1)
    check_number(budget, "budget", 0)
    if settings["model"] not in torchvision.models.list_models(torchvision.models):
        raise ValueError(f"model: {settings['model']!r} is not a torchvision classification model "
                         "(torchvision.models.list_models(torchvision.models))")  # fmt: skip
    gates = tuple(g for g in (GATES if gates is None else gates) if g != "max")
    unknown = [g for g in gates if g not in GATES]
    if unknown:
        raise ValueError(f"gates: {', '.join(unknown)} not among {', '.join(GATES)}")

    g = torch.Generator().manual_seed(0)
    b, s = settings["batch"], settings["size"]
    x = torch.randn(b, 3, s, s, generator=g).to(device, memory_format=torch.channels_last)  # (B, 3, S, S)
    y = torch.randint(0, 1000, (b,), generator=g).to(device)  # (B,)
    modes = ("eager", "compiled") if settings["compile"] else ("eager",)
    order = ("max", *sorted(gates, key=lambda gate: gate not in TARGETS))  # targeted gates compile first
    nets = [Net(gate, mode) for mode in modes for gate in (("max", *gates) if mode == "eager" else order)]

    start = time.perf_counter()
    # cuDNN's benchmark mode as ImageNet recipes train (each conv's fastest algorithm), set through torch's
    # own context manager: it restores the flag after, and works where the flags are frozen (torch's tests)
    cudnn = torch.backends.cudnn
    keep = {"enabled": cudnn.enabled, "deterministic": cudnn.deterministic, "allow_tf32": cudnn.allow_tf32}
    with _terminable() as stop, cudnn.flags(benchmark=True, **keep):
        for net in nets:
            if stop.requested:
                net.status = "skipped: the bench was asked to stop (SIGTERM) before its warm-up"
                continue
            try:
                prepare(net, settings, x, y, device, start, budget, nets, stop)
            except _Stop:  # between prepare's steps
                net.status, net.model, net.step = "stopped: the bench was asked to stop (SIGTERM)", None, None
        stop.raises = False  # from here a SIGTERM is only noted
        ready = [net for net in nets if net.status == "measured"]
        for i in range(settings["steps"]):
            if i and stop.requested and time.perf_counter() - stop.at > GRACE_S:
                break  # ``timeout -k 10`` kills 10 s after its SIGTERM: what was timed is returned first
            for net in ready:
                net.times.append(timed(net.step, device))
    for net in nets:  # the nets go before the record is built: on a GPU their memory is freed
        net.model = net.step = None

    results = [row(net, nets, b) for net in nets]
    return {
        "bench": "step",
        "machine": machine(),
        **device_info(device),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "triton": _triton_version(),
        "threads": torch.get_num_threads(),
        "model": f"torchvision:{settings['model']} (random init, seed 0)",
        "input_shape": [b, 3, s, s],
        "autocast": "bfloat16",
        "memory_format": "channels_last",
        "cudnn_benchmark": True,
        "optimizer": f"SGD(lr={LR}, momentum={MOMENTUM})",
        "warmup": settings["warmup"],
        "steps": settings["steps"],
        "compile": settings["compile"],
        "budget_s": budget,
        "stopped": stop.requested,  # by a SIGTERM: some nets were not warmed up, or fewer rounds ran
        "seed": 0,
        "quick": quick,
        "results": results,
        "targets": targets(results) if device.type == "cuda" else [],
    }


def prepare(
    net: Net,
    settings: dict[str, Any],
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
    start: float,
    budget: float,
    nets: list[Net],
    stop: _Stop,
) -> None:
    """Build, convert, compile and warm up ``net``; its status says where that stopped, if it did."""
    if net.mode == "compiled":
        base = next(n for n in nets if n.gate == "max" and n.mode == "compiled")
        if net is not base and base.status != "measured":
            net.status = "skipped: the compiled max-pool net was not measured"
            return
    if time.perf_counter() - start > budget:
        net.status = f"skipped: the bench's budget of {budget:g} s was spent before its warm-up"
        return
    began = time.perf_counter()
    try:
        net.model, net.replaced = build(settings["model"], net.gate, x, device)
        module = torch.compile(net.model) if net.mode == "compiled" else net.model
        net.step = training_step(module, x, y)
        for _ in range(settings["warmup"] - 1):
            timed(net.step, device)
        net.peak_mib = _peak_mib(net.step, device)  # the last warm-up step
    except Exception as e:  # a gate that cannot run this net (or compile) is reported, the others timed
        first = (str(e).strip().splitlines() or [""])[0]
        net.status = f"failed: {type(e).__name__}: {first}"[:300]
        if stop.requested:  # the SIGTERM came in its warm-up (a compile may wrap it in its own error)
            net.status = "stopped: the bench was asked to stop (SIGTERM) in its warm-up"
        net.model = net.step = None
    net.warmup_s = time.perf_counter() - began


class _Stop(Exception):
    """A SIGTERM (``timeout``'s signal) while the bench runs: raised once in a warm-up, then only noted."""

    def __init__(self) -> None:
        super().__init__("stopped by SIGTERM")
        self.requested = False
        self.raises = True
        self.at = 0.0  # when it came (time.perf_counter)

    def __call__(self, signum: int, frame: Any) -> None:
        self.requested, self.at = True, time.perf_counter()
        if self.raises:
            self.raises = False
            raise self


@contextlib.contextmanager
def _terminable() -> Iterator[_Stop]:
    """SIGTERM handled by a :class:`_Stop` for the block (in the main thread; elsewhere only the flag,
    never set): a bench cut short by ``timeout`` still returns what it timed, and the command saves it."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, old)


def _peak_mib(step: Callable[[], None], device: torch.device) -> float | None:
    """One ``step()``; on CUDA the most MiB it held beyond what was allocated before (else None)."""
    if device.type != "cuda":
        step()
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def row(net: Net, nets: list[Net], batch: int) -> dict[str, Any]:
    """The record's row for ``net``: its times, and its ratio to the max-pool net of its mode."""
    out: dict[str, Any] = {
        "gate": net.gate,
        "mode": net.mode,
        "status": net.status,
        "replaced": net.replaced,
        "warmup_s": net.warmup_s,
        "peak_mib": net.peak_mib,
        "times_ms": [1e3 * t for t in net.times],
        "median_ms": None,
        "min_ms": None,
        "images_per_s": None,
        "ratio_to_max": None,
    }
    if net.times:
        median = statistics.median(net.times)
        out |= {"median_ms": 1e3 * median, "min_ms": 1e3 * min(net.times), "images_per_s": batch / median}
        base = next(n for n in nets if n.gate == "max" and n.mode == net.mode)
        if base.times:
            out["ratio_to_max"] = median / statistics.median(base.times)
    return out


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target (:data:`TARGETS`, each mode measured) with its value and whether it is met."""
    out = []
    for r in results:
        limit = TARGETS.get(r["gate"])
        if limit is not None and r["ratio_to_max"] is not None:
            out.append({"what": f"{r['gate']} / max-pool net, {r['mode']}", "limit": limit,
                        "value": r["ratio_to_max"], "met": r["ratio_to_max"] <= limit})  # fmt: skip
    return out


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def table(record: dict[str, Any]) -> str:
    m, shape = record["machine"], "×".join(map(str, record["input_shape"]))
    name = record.get("device_name")
    lines = [
        f"step bench: {record['model']}, input {shape} channels_last, bf16 autocast, "
        f"{record['optimizer']}; median of {record['steps']} steps after {record['warmup']} warm-up; "
        f"torch {record['torch']}, torchvision {record['torchvision']}, {record['threads']} threads, "
        f"{m['cpu_count']} cpus ({m['processor'] or m['platform']}); device {record['device']}"
        + (f" ({name})" if name else ""),
        f"{'gate':<14} {'mode':<9} {'median ms':>10} {'min ms':>10} {'images/s':>9} {'× max':>7} "
        f"{'peak MiB':>9} {'warm-up s':>10}",
    ]
    for r in record["results"]:
        if r["median_ms"] is None:
            lines.append(f"{r['gate']:<14} {r['mode']:<9} {r['status']}")
            continue
        ratio = f"{r['ratio_to_max']:>7.3f}" if r["ratio_to_max"] is not None else f"{'':>7}"
        peak = f"{r['peak_mib']:>9.0f}" if r["peak_mib"] is not None else f"{'':>9}"
        lines.append(f"{r['gate']:<14} {r['mode']:<9} {r['median_ms']:>10.1f} {r['min_ms']:>10.1f} "
                     f"{r['images_per_s']:>9.1f} {ratio} {peak} {r['warmup_s']:>10.1f}")  # fmt: skip
    for t in record["targets"]:
        verdict = "met" if t["met"] else "NOT met"
        lines.append(f"target {t['what']} ≤ {t['limit']}×: {t['value']:.3f}× ({verdict})")
    return "\n".join(lines)
