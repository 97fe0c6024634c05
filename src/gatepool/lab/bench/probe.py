"""``gatepool bench probe``: the time of the correlated prediction for torchvision's ResNet-18 at 64×64.

What is timed: ``predict_correlated(model, stats)`` (:mod:`gatepool.analysis.probe.correlated_predict`),
the whole walk, forward and the unit-noise backward, for ``torchvision.models.resnet18`` at
initialization (seed 0, train mode: BatchNorm on the batch's statistics) from the statistics of a
batch of 64 images 3×64×64 (``measure_input``, taken once before the timing: it is the data). Two
inputs, as the probe's docs measure them:

    noise    N(0, 1) images (seed 0)
    mnist    the first 64 MNIST training digits, normalized, resized to 64×64 (bilinear), 3 channels
             (left out, with a note, where the digits are not on disk)

Timing: ``torch.utils.benchmark.Timer`` at the current torch thread count (``gatepool bench probe
--threads 2`` for the target's two cores), interleaved rounds (:func:`attention.time_calls`), one call
per sample, the median over rounds. Target (issue 25): ≤ 10 s for a prediction on 2 CPU cores.

Needs torchvision (``pip install gatepool[vision]``; ``make test-vision``'s ``.venv-vision`` has it):
:data:`REQUIRES` names it, and ``gatepool bench probe`` says so in one line where it is missing.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from gatepool.lab.bench.attention import time_calls
from gatepool.utils.environment import machine

REQUIRES = ("torchvision",)
BATCH, SIZE = 64, 64
TARGET_S = 10.0


def inputs() -> dict[str, torch.Tensor]:
    """The batches whose statistics the prediction starts from: (64, 3, 64, 64) each."""
    from gatepool.analysis.probe.external_models import resized_digits
    from gatepool.data import DataError, load_dataset

    g = torch.Generator().manual_seed(0)
    out = {"noise": torch.randn(BATCH, 3, SIZE, SIZE, generator=g)}
    try:
        digits = torch.as_tensor(load_dataset("mnist", "train").normalized()[:BATCH]).float()
    except DataError:
        return out
    out["mnist"] = resized_digits(digits, SIZE)
    return out


def run(quick: bool = False, device: Any = "cpu") -> dict[str, Any]:
    """Measure; returns the record (``gatepool bench`` sets the threads, prints and saves it). The
    prediction runs on the CPU whatever ``device`` is (it is a CPU computation in float64)."""
    import torchvision

    from gatepool.analysis.probe.correlated import measure_input
    from gatepool.analysis.probe.correlated_predict import predict_correlated
    from gatepool.analysis.probe.external_models import build_model

    torch.manual_seed(0)
    model = build_model("torchvision:resnet18").train()
    batches = inputs()
    stats = {name: measure_input(x) for name, x in batches.items()}
    fns = {name: (lambda s=s: predict_correlated(model, s)) for name, s in stats.items()}
    warmup, rounds = (0, 1) if quick else (1, 3)
    times = time_calls(fns, (), rounds, warmup=warmup)
    results = [
        {
            "input": name,
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "times_s": ts,
        }
        for name, ts in times.items()
    ]
    worst = max(r["median_s"] for r in results)
    return {
        "bench": "probe",
        "machine": machine(),
        "device": "cpu",
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "threads": torch.get_num_threads(),
        "model": "torchvision:resnet18 (init, seed 0, train mode)",
        "input_shape": [BATCH, 3, SIZE, SIZE],
        "inputs": list(batches),
        "notes": []
        if "mnist" in batches
        else ["mnist: the digits are not on disk (gatepool data), left out"],
        "warmup": warmup,
        "rounds": rounds,
        "timer": "torch.utils.benchmark.Timer.timeit(1) per round",
        "quick": quick,
        "results": results,
        "target": {"seconds_max": TARGET_S, "worst_median_s": worst, "met": worst <= TARGET_S},
    }


def table(record: dict[str, Any]) -> str:
    m, shape = record["machine"], "×".join(map(str, record["input_shape"]))
    lines = [
        f"probe bench: predict_correlated, {record['model']}, input {shape}, "
        f"median of {record['rounds']} rounds; torch {record['torch']}, torchvision {record['torchvision']}, "
        f"{record['threads']} threads, {m['cpu_count']} cpus ({m['processor'] or m['platform']})",
        f"{'input':<8} {'median s':>9} {'min s':>9}",
    ]
    for r in record["results"]:
        lines.append(f"{r['input']:<8} {r['median_s']:>9.2f} {r['min_s']:>9.2f}")
    lines += [f"note: {n}" for n in record["notes"]]
    t = record["target"]
    met = "met" if t["met"] else "NOT met"
    lines.append(f"target ≤ {t['seconds_max']:g} s (on 2 cores): worst {t['worst_median_s']:.2f} s ({met})")
    return "\n".join(lines)
