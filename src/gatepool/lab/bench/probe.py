"""``gatepool bench probe``: the time of the correlated prediction for torchvision's models at init.

What is timed: ``predict_correlated(model, stats)`` (:mod:`gatepool.analysis.probe.correlated_predict`),
the whole walk, forward and the unit-noise backward, for a torchvision model at initialization (seed 0,
train mode: BatchNorm on the batch's statistics) from the statistics of one batch (``measure_input``,
taken once before the timing: it is the data). The cases (``--cases a,b``; default all):

    resnet18-noise   ResNet-18, 64 N(0, 1) images 3×64×64 (seed 0)                        target ≤ 10 s
    resnet18-mnist   ResNet-18, the first 64 MNIST training digits, normalized, resized to 64×64
                     (bilinear), 3 channels (left out, with a note, where the digits are not on disk)
                                                                                          target ≤ 10 s
    resnet50         ResNet-50, 32 N(0, 1) images 3×64×64                                 target ≤ 10 s
    vit_b_16         ViT-B/16, 32 N(0, 1) images 3×224×224                                target ≤ 30 s
    convnext_tiny    ConvNeXt-T, 32 N(0, 1) images 3×64×64 (ResNet-50's size; its first stage's GELU
                     is 384 × 16 × 16 positions)                                          no target

Timing: ``torch.utils.benchmark.Timer`` at the current torch thread count (``gatepool bench probe
--threads 2`` for the targets' two cores), interleaved rounds (:func:`attention.time_calls`), one call
per sample, the median over rounds. Targets (issues 25 and 41): ≤ 10 s for ResNet-18 and a
ResNet-50-sized model at 64×64, ≤ 30 s for ViT-B/16 at 224, on 2 CPU cores.

Needs torchvision (``pip install gatepool[vision]``; ``make test-vision``'s ``.venv-vision`` has it):
:data:`REQUIRES` names it, and ``gatepool bench probe`` says so in one line where it is missing.
"""

from __future__ import annotations

import statistics
from typing import Any, NamedTuple

import torch

from gatepool.lab.bench.attention import time_calls
from gatepool.utils.environment import machine

REQUIRES = ("torchvision",)


class Case(NamedTuple):
    model: str
    size: int
    batch: int
    data: str  # "noise" or "mnist"
    target_s: float | None


CASES = {
    "resnet18-noise": Case("torchvision:resnet18", 64, 64, "noise", 10.0),
    "resnet18-mnist": Case("torchvision:resnet18", 64, 64, "mnist", 10.0),
    "resnet50": Case("torchvision:resnet50", 64, 32, "noise", 10.0),
    "vit_b_16": Case("torchvision:vit_b_16", 224, 32, "noise", 30.0),
    "convnext_tiny": Case("torchvision:convnext_tiny", 64, 32, "noise", None),
}


def batch_of(case: Case) -> torch.Tensor | None:
    """The batch whose statistics the prediction starts from, (batch, 3, size, size); None where the
    digits are not on disk."""
    from gatepool.analysis.probe.external_models import resized_digits
    from gatepool.data import DataError, load_dataset

    if case.data == "noise":
        return torch.randn(case.batch, 3, case.size, case.size, generator=torch.Generator().manual_seed(0))
    try:
        digits = torch.as_tensor(load_dataset("mnist", "train").normalized()[: case.batch]).float()
    except DataError:
        return None
    return resized_digits(digits, case.size)


def run(quick: bool = False, device: Any = "cpu", cases: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Measure; returns the record (``gatepool bench`` sets the threads, prints and saves it). The
    prediction runs on the CPU whatever ``device`` is (it is a CPU computation in float64)."""
    import torchvision

    from gatepool.analysis.probe.correlated import measure_input
    from gatepool.analysis.probe.correlated_predict import predict_correlated
    from gatepool.analysis.probe.external_models import build_model

    names = tuple(CASES) if cases is None else cases
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"cases must be among {', '.join(CASES)}, got {', '.join(unknown)}")
    fns, notes, models = {}, [], {}
    for name in names:
        case = CASES[name]
        x = batch_of(case)
        if x is None:
            notes.append(f"{name}: the digits are not on disk (gatepool data), left out")
            continue
        if case.model not in models:
            torch.manual_seed(0)
            models[case.model] = build_model(case.model).train()
        stats = measure_input(x)
        fns[name] = lambda m=models[case.model], s=stats: predict_correlated(m, s)
    warmup, rounds = (0, 1) if quick else (1, 3)
    times = time_calls(fns, (), rounds, warmup=warmup)
    results = []
    for name, ts in times.items():
        case, median = CASES[name], statistics.median(ts)
        results.append({
            "case": name,
            "model": f"{case.model} (init, seed 0, train mode)",
            "input": case.data,
            "input_shape": [case.batch, 3, case.size, case.size],
            "median_s": median,
            "min_s": min(ts),
            "times_s": ts,
            "target_s": case.target_s,
            "met": None if case.target_s is None else median <= case.target_s,
        })
    return {
        "bench": "probe",
        "machine": machine(),
        "device": "cpu",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "threads": torch.get_num_threads(),
        "notes": notes,
        "warmup": warmup,
        "rounds": rounds,
        "timer": "torch.utils.benchmark.Timer.timeit(1) per round",
        "quick": quick,
        "results": results,
    }


def table(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"probe bench: predict_correlated at init, median of {record['rounds']} rounds; torch "
        f"{record['torch']}, torchvision {record['torchvision']}, {record['threads']} threads, "
        f"{m['cpu_count']} cpus ({m['processor'] or m['platform']})",
        f"{'case':<15} {'input':<16} {'median s':>9} {'min s':>9}  target (on 2 cores)",
    ]
    for r in record["results"]:
        data = f"{r['input']} " + "×".join(map(str, r["input_shape"]))
        met = "met" if r["met"] else "NOT met"
        target = "—" if r["target_s"] is None else f"≤ {r['target_s']:g} s ({met})"
        lines.append(f"{r['case']:<15} {data:<16} {r['median_s']:>9.2f} {r['min_s']:>9.2f}  {target}")
    lines += [f"note: {n}" for n in record["notes"]]
    return "\n".join(lines)
