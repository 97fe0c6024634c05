"""The correlated probe over a zoo: how much of each model the prediction covers, and how closely.

    check_model(model, x)     measure(model, x, correlated=True) on N(0, 1) images, counted: a Check
    summarize(report)         the counts of one report (no model run)
    zoo_models(zoo)           "tv:NAME" for torchvision's classifiers (or one a family), "timm:NAME" one a
                              timm family (:data:`TIMM_FAMILIES`: the smallest member of each)
    sweep(names, path=...)    check_named over many models, each result appended to a JSON file as it
                              comes; a rerun skips the models the file holds (a long run is never lost),
                              ``budget`` seconds stops it before the next model

Per model, over the report's rows (``(input)`` and ``(output)`` included, as ``gatepool probe`` prints
them):

    modules      the rows measured (but for the modules inside one predicted whole, as timm's
                 ``Attention``'s qkv and proj: its row stands for them)
    with a rule  those with a correlated prediction (``predicted.var`` not None)
    forward      predicted Var / measured Var within [0.9, 1.1] (``forward_within``: 0.15 on real data)
    backward     predicted E[g²] / measured E[g²] within [0.85, 1.15] (unit-noise backward)
    worst        the row and ratio farthest from 1 (|log ratio|), forward or backward
    no rule      the first row without a prediction, with the walk's reason (the node and its op, or
                 the row's module not reached by the walk): named, never guessed
    target       the issue's: at least 90% of the rows within the forward bound and 90% within the
                 backward bound (:func:`meets`)

BatchNorm in train mode (the model as built), N(0, 1) inputs: the setting of the issue's targets.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from gatepool.analysis.probe.measure import measure
from gatepool.analysis.probe.report import ProbeReport

__all__ = ["BACKWARD_WITHIN", "FORWARD_WITHIN", "TARGET", "TIMM_FAMILIES", "Check", "check_model",
           "check_named", "family_pick", "meets", "summarize", "sweep", "table", "zoo_models"]  # fmt: skip

FORWARD_WITHIN = 0.10
BACKWARD_WITHIN = 0.15
TARGET = 0.90  # the share of a model's rows that must be within each bound
SIZES = (64, 96, 128, 224, 256)  # the input sides tried, from --size up: a model's smallest that runs
# one model a timm family, the smallest member of each (pretrained=False: random weights), convnets first
TIMM_FAMILIES = (
    "resnet18", "resnet10t", "resnetv2_18", "regnetx_002", "efficientnet_b0", "mixnet_s", "mnasnet_small",
    "mobilenetv3_small_050", "mobilenetv4_conv_small_035", "lcnet_050", "ghostnet_050", "rexnet_100",
    "densenet121", "dla46_c", "dpn48b", "hrnet_w18_small", "inception_v3", "nf_regnet_b0",
    "res2net50_14w_8s", "resnest14d", "selecsls42", "tresnet_m", "vgg11", "legacy_xception", "xception41",
    "cs3darknet_s", "repvgg_a0", "gernet_s", "mobileone_s0", "hgnetv2_b0", "repvit_m0_9", "convnext_atto",
    "edgenext_xx_small", "poolformer_s12", "convmixer_768_32", "starnet_s050", "mambaout_femto",
    "fastvit_t8", "efficientformer_l1", "levit_128s", "mobilevit_xxs", "efficientvit_b0", "efficientvit_m0",
    "vit_tiny_patch16_224", "deit_tiny_patch16_224", "cait_xxs24_224", "beit_base_patch16_224",
    "xcit_nano_12_p16_224", "convit_tiny", "pit_ti_224", "crossvit_tiny_240", "coat_lite_tiny",
    "pvt_v2_b0", "twins_svt_small", "volo_d1_224", "swin_tiny_patch4_window7_224", "maxvit_pico_rw_256",
    "tiny_vit_5m_224", "gcvit_xxtiny", "davit_tiny", "mixer_s32_224", "resmlp_12_224",
)  # fmt: skip


@dataclass
class Check:
    """One model's line of the table; ``error`` set (and the counts 0) when the probe itself failed."""

    model: str
    size: int | None = None
    modules: int = 0
    with_rule: int = 0
    forward: int = 0
    backward: int = 0
    worst: str = ""
    worst_ratio: float | None = None
    no_rule: str = ""
    seconds: float = 0.0
    error: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["worst_ratio"] is not None and not math.isfinite(d["worst_ratio"]):
            d["worst_ratio"] = None
        return d


def _ratio(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or not (math.isfinite(predicted) and math.isfinite(measured)):
        return None
    if measured <= 0:
        return 1.0 if predicted == measured else math.inf
    return predicted / measured


def summarize(report: ProbeReport, name: str = "", forward_within: float = FORWARD_WITHIN) -> Check:
    """The counts of ``report`` (a ``measure(..., correlated=True)`` result) as a :class:`Check`."""
    c = Check(name)
    worst = 0.0
    whole = {r.name for r in report.rows.values() if r.predicted is not None and r.predicted.var is not None}
    for r in report.rows.values():
        if r.forward is None:
            continue
        if _inside(r.name, whole) and (r.predicted is None or r.predicted.var is None):
            continue  # inside a module predicted whole (timm's Attention: its qkv, its proj): that row's
        c.modules += 1
        p = r.predicted
        if p is None or p.var is None:
            if not c.no_rule:
                why = p.note if p is not None and p.note else "not reached by the walk"
                c.no_rule = f"{r.name} ({r.kind}): {why}"
            continue
        c.with_rule += 1
        f = _ratio(p.var, r.forward.var)
        b = _ratio(p.grad_e2, r.backward.e2 if r.backward is not None else None)
        c.forward += f is not None and abs(f - 1) <= forward_within
        c.backward += b is not None and abs(b - 1) <= BACKWARD_WITHIN
        for kind, ratio in (("forward", f), ("backward", b)):
            if ratio is None:
                continue
            off = abs(math.log(ratio)) if 0 < ratio < math.inf else math.inf
            if off > worst:
                worst, c.worst, c.worst_ratio = off, f"{r.name} {kind}", ratio
    return c


def meets(c: Check) -> bool:
    """Does the model meet the issue's target: ``TARGET`` of its rows within the forward bound and
    ``TARGET`` within the backward bound (a model the probe failed on does not)?"""
    return not c.error and c.modules > 0 and min(c.forward, c.backward) >= TARGET * c.modules


def _inside(name: str, whole: set[str]) -> bool:
    """Is module ``name`` inside one of ``whole`` (a dotted prefix)?"""
    parts = name.split(".")
    return any(".".join(parts[:i]) in whole for i in range(1, len(parts)))


def _size_for(model: nn.Module, size: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest of ``size`` and the larger ``sizes`` at which the model runs (eval, a dry forward)."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        for s in sorted({size, *(t for t in sizes if t > size)}):
            try:
                with torch.no_grad():
                    model(torch.zeros(2, 3, s, s))
                return s
            except Exception:  # noqa: BLE001 - the model refuses this size: try the next
                continue
        return None
    finally:
        for m, t in modes.items():
            m.training = t


def check_model(model: nn.Module, x: torch.Tensor, name: str = "", forward_within: float = FORWARD_WITHIN
                ) -> Check:  # fmt: skip
    """``measure(model, x, correlated=True)`` (unit-noise backward, no ideal column, no measured fields),
    counted and timed."""
    start = time.perf_counter()
    report = measure(model, x, correlated=True, measured_fields=False, prediction=False, samples=0)
    c = summarize(report, name, forward_within)
    c.seconds = time.perf_counter() - start
    c.size = x.shape[-1]
    if report.error:
        c.error = report.error
    elif report.warnings and c.with_rule == 0:
        c.error = report.warnings[0]  # the walk could not trace the model: say why
    return c


def check_named(name: str, *, size: int = 64, batch: int = 32, seed: int = 0,
                sizes: tuple[int, ...] = SIZES) -> Check:  # fmt: skip
    """Build ``name`` ("tv:NAME" / "timm:NAME", seed ``seed``), find its input size, check it on
    ``batch`` N(0, 1) images (a generator seeded with ``seed``)."""
    from gatepool.analysis.convert_zoo import build

    try:
        model = build(name, seed)
    except Exception as e:  # noqa: BLE001 - a model that does not build is a line of the table
        return Check(name, error=f"build: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    s = _size_for(model, size, sizes)
    if s is None:
        return Check(name, error=f"runs at none of {sorted({size, *(t for t in sizes if t > size)})}")
    x = torch.randn(batch, 3, s, s, generator=torch.Generator().manual_seed(seed))  # (B, 3, S, S)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return check_model(model, x, name)
    except Exception as e:  # noqa: BLE001 - a bug of the walk on one model must not stop the sweep
        text = str(e).splitlines()[0] if str(e) else ""
        return Check(name, s, seconds=time.perf_counter() - start, error=f"{type(e).__name__}: {text}")


_PREFER = ("pico", "nano", "tiny", "small", "18", "b0", "_t", "_s", "mini", "x0_5", "0_5", "400mf", "1_1",
           "11", "050", "100")  # fmt: skip


def family_pick(names: list[str]) -> str:
    """The smallest-sounding of one family's model names (its size words first, then the shortest)."""

    def rank(n: str):
        return (next((i for i, p in enumerate(_PREFER) if p in n), len(_PREFER)), len(n), n)

    return min(names, key=rank)


def zoo_models(zoo: str, *, per_family: bool = False) -> list[str]:
    """torchvision's classifiers ("tv:NAME"; ``per_family``: one a module of torchvision.models) or one
    model a timm family ("timm:NAME"). ImportError when the library is missing."""
    if zoo == "torchvision":
        import torchvision.models as tvm

        names = tvm.list_models(module=tvm)
        if per_family:
            families: dict[str, list[str]] = {}
            for n in names:
                families.setdefault(tvm.get_model_builder(n).__module__, []).append(n)
            names = sorted(family_pick(v) for v in families.values())
        return [f"tv:{n}" for n in names]
    if zoo == "timm":
        import timm

        return [f"timm:{n}" for n in TIMM_FAMILIES if timm.is_model(n)]
    raise ValueError(f"zoo must be 'torchvision' or 'timm', got {zoo!r}")


def sweep(names: list[str], *, size: int = 64, batch: int = 32, seed: int = 0, path: str | None = None,
          budget: float | None = None, header: str = "", done=None, data: str = "noise",
          check=None) -> tuple[list[Check], list[str]]:  # fmt: skip
    """:func:`check_named` over ``names`` (or ``check(name)``, e.g. on a data set's images: then ``data``
    names it); with ``path``, the results so far are written there (JSON: ``header``, ``settings`` and
    ``results``) after every model, and a model whose result the file already holds (at the same size,
    batch, seed and data) is not run again. ``budget`` (seconds): no model starts after it is spent.
    ``done(check)`` is called after each model run. Returns the checks of ``names`` in order (read back
    or run) and the names left for a later run."""
    import json
    import os

    settings = {"size": size, "batch": batch, "seed": seed, "data": data}
    results: dict[str, dict] = {}
    if path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("settings") != settings:
            raise ValueError(f"{path} holds a run at {old.get('settings')}, not {settings}: resume it with "
                             f"those, or give another file")  # fmt: skip
        results = {r["model"]: r for r in old["results"]}
    start, left = time.perf_counter(), []
    for name in names:
        if name in results:
            continue
        if budget is not None and time.perf_counter() - start > budget:
            left.append(name)
            continue
        c = check_named(name, size=size, batch=batch, seed=seed) if check is None else check(name)
        results[name] = c.to_dict()
        if done is not None:
            done(c)
        if path:
            with open(path + ".tmp", "w") as f:
                json.dump({"header": header, "settings": settings, "results": list(results.values())}, f,
                          indent=1)  # fmt: skip
            os.replace(path + ".tmp", path)
    return [Check(**results[n]) for n in names if n in results], left


def table(checks: list[Check], forward_within: float = FORWARD_WITHIN) -> str:
    """The Markdown table of ``checks``, and under it how many meet the target."""
    head = (f"| model | size | modules | with a rule | fwd within {forward_within:.0%} | bwd within 15% | "
            f"worst (ratio) | first without a rule | target (≥ {TARGET:.0%} both) | s |")  # fmt: skip
    lines = [head, "|" + "---|" * 10]
    for c in checks:
        target = "holds" if meets(c) else "**not met**"
        if c.error and not c.modules:
            lines.append(f"| {c.model} | {c.size or '–'} | – | – | – | – | – | {c.error[:160]} | {target} | "
                         f"{c.seconds:.1f} |")  # fmt: skip
            continue
        worst = f"{c.worst} ({c.worst_ratio:.3g})" if c.worst_ratio is not None else "–"
        lines.append(
            f"| {c.model} | {c.size} | {c.modules} | {c.with_rule} | {c.forward} | {c.backward} | {worst} | "
            f"{(c.error or c.no_rule or '—')[:160].replace('|', '/')} | {target} | {c.seconds:.1f} |"
        )
    lines += ["", f"{sum(map(meets, checks))} of {len(checks)} models meet the target."]
    return "\n".join(lines)
