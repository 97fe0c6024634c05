"""Experiment 17: what attention costs. One gate per (query, key) pair per head per layer:

    gates = t²,        bytes = t² · bytes_per_value

The lecture's table is arithmetic, and stays so here (``arithmetic-*``, from
``gatepool.analysis.attention_maps.attention_cost``): 12×12 tokens (144) → 2.1·10⁴ gates; 24×24 (576) →
3.3·10⁵; a 224×224 image cut into 16×16 patches (196 tokens) → 3.8·10⁴; every pixel of it (50,176 tokens)
→ 2.5·10⁹, about 10 GB at 4 bytes. Patches cut that by (224²/196)² = 16⁴ = 65,536.

What is measured: our attention's explicit path (the t × t gate materialised,
``scaled_dot_product_attention(..., return_weights=True)``) and torch's SDPA, timed and their peak memory
taken (``gatepool.lab.bench.attention.peak_bytes``: the allocator's highest hold during one forward) at
t = 144, 288, … up to ``max_tokens`` (batch 1, one head, d = 16, float32). The slope of log(peak) over
log(t), fitted over the upper half of those t, is the memory's exponent: the lecture's t² says 2 for the
explicit gate; SDPA, which never holds the gate, should grow as t (exponent 1).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import torch

from gatepool.analysis.attention_maps import attention_cost, plot_attention_cost
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.utils.checks import check_int
from gatepool.utils.plotting import pyplot

LECTURE_GATES = {144: 2.1e4, 576: 3.3e5, 196: 3.8e4, 50176: 2.5e9}
TWO_DIGITS = "the lecture prints two significant digits: ± half a unit in the second one"
TABLE_REF = "lecture, the cost of attention: its table of t² gates (arithmetic, not a measurement)"
DIM = 16


def _half_unit(value: float) -> float:
    """Half a unit in the second significant digit of ``value`` (2.1e4 → 500)."""
    return 0.5 * 10 ** (math.floor(math.log10(value)) - 1)


def _label(t: int, image: int, patch: int) -> str:
    if t == image * image:
        return f"{image}×{image} pixels"
    if patch > 0 and image % patch == 0 and t == (image // patch) ** 2:
        return f"{image}² in {patch}×{patch} patches"
    r = math.isqrt(t)
    return f"{r}×{r} tokens" if r * r == t else f"{t} tokens"


def _claims(setup: dict) -> list[Claim]:
    image, patch, bpv = setup["image"], setup["patch"], setup["bytes_per_value"]
    claims = [
        Claim(f"arithmetic-{t}",
              f"arithmetic: gates per head per layer for {t} tokens ({_label(t, image, patch)})"
              " = t²", LECTURE_GATES.get(t), _half_unit(LECTURE_GATES[t]) if t in LECTURE_GATES else 0.0,
              TWO_DIGITS if t in LECTURE_GATES else "exact: off the lecture's counts the theory is t²",
              source="arithmetic", ref=TABLE_REF)
        for t in setup["tokens"]
    ]  # fmt: skip
    claims += [
        Claim(f"bytes-{image * image}", f"arithmetic: every pixel of {image}×{image} as a token: "
              f"bytes of one gate matrix at {bpv} bytes per value", 1e10, 0.5e9,
              "the lecture says 'about 10 GB': to the GB, ±0.5 GB",
              depends=("image", "bytes_per_value"), source="arithmetic", ref=TABLE_REF),
        Claim("patch-saving", f"arithmetic: {patch}×{patch} patches cut the gates of a {image}×{image} "
              "image by (pixels per patch)²", 65000, 1000,
              "the lecture says 'about 65,000', i.e. to the thousand (16⁴ = 65,536)",
              depends=("image", "patch"), source="arithmetic", ref=TABLE_REF),
        Claim("memory-exponent-explicit",
              "measured: the explicit gate's peak memory grows as t^2 (fitted exponent)",
              2.0, 0.0, "the fit's error, measured in this run: twice the slope's standard error plus the "
              "spread of the local slopes",
              source="arithmetic",
              ref="lecture, the cost of attention: a t × t gate per head per layer, memory ∝ t² (the "
              "explicit path holds that gate by construction: its peak memory cannot grow otherwise)"),
        Claim("memory-exponent-sdpa",
              "measured: torch's SDPA, which never holds the gate, grows slower than t^1.5",
              1.5, 0.0, "between t (the output) and t² (the gate): 1.5 splits them", kind="max",
              source="ours", ref="the lecture's t² is the explicit gate's; a fused kernel is what avoids it"),
    ]  # fmt: skip
    return claims


def fit_exponent(tokens: list[int], values: list[float]) -> tuple[float, float]:
    """Slope of log(value) on log(t) by least squares, and its error: twice the slope's standard error
    plus the spread of the local slopes between neighbouring t (how far the curve is from a line: the
    smaller terms, such as the O(t) queries and keys beside a t² gate, bend it)."""
    if len(tokens) < 3:
        raise ValueError(f"a fitted exponent needs at least three token counts, got {tokens}")
    x, y = np.log(np.asarray(tokens, float)), np.log(np.asarray(values, float))
    (slope, _), cov = np.polyfit(x, y, 1, cov=True)
    local = np.diff(y) / np.diff(x)
    return float(slope), float(2 * math.sqrt(max(cov[0, 0], 0.0)) + (local.max() - local.min()))


def measure_cost(tokens: list[int], rounds: int = 3, seed: int = 0) -> list[dict]:
    """Per t and way (explicit gate, torch SDPA): median forward seconds over ``rounds`` (one call each,
    timed by ``torch.utils.benchmark.Timer``, the ways interleaved: ``bench.attention.time_calls``) and
    peak bytes."""
    from gatepool.lab.bench.attention import peak_bytes, time_calls, ways

    chosen = {"explicit": ways()["ours (return_weights)"], "sdpa": ways()["torch SDPA"]}
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for t in tokens:
        q, k, v = (torch.randn(1, 1, t, DIM, generator=gen) for _ in range(3))  # (B, H, T, d)
        with torch.no_grad():
            times = time_calls(chosen, (q, k, v), rounds)  # after one warm-up call each
            for name, fn in chosen.items():
                peak = peak_bytes(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v))
                rows.append({"tokens": t, "way": name, "seconds": statistics.median(times[name]),
                             "peak_bytes": peak})  # fmt: skip
    return rows


@experiment("attention-cost", order=17,
            title="attention holds t² gates per head per layer; patches make images affordable",
            setup={"tokens": [144, 576, 196, 50176], "image": 224, "patch": 16, "bytes_per_value": 4,
                   "max_tokens": 9216},
            quick={"max_tokens": 2304}, claims=_claims)
def attention_cost_experiment(ctx: Context) -> None:
    image, patch, bpv = ctx["image"], ctx["patch"], ctx["bytes_per_value"]
    if not ctx["tokens"]:
        raise ValueError("--set tokens: need one or more token counts")
    for t in ctx["tokens"]:
        check_int(t, "--set tokens (each)")
    if check_int(image, "--set image") % check_int(patch, "--set patch"):
        raise ValueError(f"--set image/patch: the patch must tile the image, got {image=}, {patch=}")
    check_int(bpv, "--set bytes_per_value")
    check_int(ctx["max_tokens"], "--set max_tokens", 576, 16384)  # 16384: a 1 GB gate

    rows = []
    for t in ctx["tokens"]:
        gates = attention_cost(t, bytes_per_value=bpv)["gates"]
        ctx.check(f"arithmetic-{t}", gates, theory=t * t)
        rows.append({"tokens": t, "label": _label(t, image, patch), "gates": gates})
    pixels, patches = image * image, (image // patch) ** 2
    big = attention_cost(pixels, bytes_per_value=bpv)
    ctx.check(f"bytes-{pixels}", big["bytes"], theory=pixels**2 * bpv,
              note=f"{big['gates']:.3g} gates × {bpv} bytes = {big['bytes'] / 1e9:.3g} GB")
    saving = big["gates"] / attention_cost(patches)["gates"]
    ctx.check("patch-saving", saving, theory=patch**4, note=f"({pixels:,} / {patches:,})² = {saving:,.0f}")
    ctx.data["rows"] = rows
    path = ctx.out / "attention-cost.png"
    plot_attention_cost([(r["label"], r["tokens"]) for r in rows], path, bytes_per_value=bpv)
    ctx.figures.append(str(path))

    grid = [144 * 2**i for i in range(8) if 144 * 2**i <= ctx["max_tokens"]]  # 144, 288, ... (doubling)
    measured = measure_cost(grid)
    ctx.data["measured"] = measured
    upper = grid[(len(grid) - 1) // 2 :]  # the upper half (≥ 3 points): there the t² (or t) term dominates
    for way, claim in (("explicit", "memory-exponent-explicit"), ("sdpa", "memory-exponent-sdpa")):
        peaks = [r["peak_bytes"] for r in measured if r["way"] == way and r["tokens"] in upper]
        slope, err = fit_exponent(upper, peaks)
        bar = ctx.bar(claim)
        wide = way == "explicit" and bar is not None and err > 0.5 * abs(bar)  # a tolerance that wide decides
        ctx.check(claim, slope, tolerance=err if way == "explicit" else None,  # nothing: undecided
                  undecided=f"the fit's error ±{err:.2f} is wider than half the bar" if wide else "",
                  note=f"fit over t = {upper}: {slope:.4f} ± {err:.4f}; peak at t = {upper[-1]}: "
                       f"{peaks[-1] / 2**20:.1f} MiB")  # fmt: skip
    _cost_figure(ctx, measured)


def _cost_figure(ctx: Context, measured: list[dict]) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for way, color in (("explicit", "C3"), ("sdpa", "C0")):
        rows = [r for r in measured if r["way"] == way]
        t = [r["tokens"] for r in rows]
        ax1.plot(t, [r["peak_bytes"] / 2**20 for r in rows], "o-", color=color, label=way)
        ax2.plot(t, [1e3 * r["seconds"] for r in rows], "o-", color=color, label=way)
    t = np.array([r["tokens"] for r in measured if r["way"] == "explicit"], float)
    ax1.plot(t, 4 * t**2 / 2**20, ":", color="k", label="t² float32 values")
    ax1.set(xscale="log", yscale="log", xlabel="tokens t", ylabel="peak MiB",
            title="peak memory, one forward")
    ax2.set(xscale="log", yscale="log", xlabel="tokens t", ylabel="ms", title="time, one forward (median)")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    ctx.figure(fig, "attention-cost-measured.png")
