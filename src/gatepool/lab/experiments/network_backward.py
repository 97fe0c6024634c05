"""Experiment 7 ``network-backward``: the gradient through all of Tuesday's CNN at initialization.

A unit-variance gradient is seeded at the logits (the lecture's "loss" L = Σ g·out, summed over the 512
images) and E[(∂L/∂·)²] is read at each stage's output (block 3, block 2, pool 2, and block 1 = pool 2's
input), with the share of exact zeros. The absolute figures depend on the head's Linear init (N(0, 1/32)
in ResidualCNN, as the lecture's ideal assumes); the growth between stages does not. Every measured claim
is the mean over ``seeds``: :mod:`gatepool.lab.common.cnn_at_init`.
"""

from __future__ import annotations

import math
import statistics

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.cnn_at_init import (
    LECTURE_BACK,
    SEED_WHY,
    SETUP,
    histograms,
    mean_ideal,
    probe_seeds,
)
from gatepool.utils.plotting import pyplot

# backward, the quick profile keeps the lecture's 512 digits: a weight's gradient sums over the batch, so
# ‖∂L/∂W‖ and rms ∂L/∂W on 256 digits would be another quantity than the lecture's
BACK_QUICK = {"seeds": [0, 1, 2]}
CONVS = [f"block{b}.conv{c}" for b in (1, 2, 3) for c in (1, 2)]
BACK_REF = "lecture, Tuesday's CNN backward, E[g²] per stage (its measured column)"
LECTURE_BACK_IDEAL = {"block3": 24.3e-6, "block2": 38.5e-6, "pool2": 90.3e-6, "block1": 22.6e-6}
RMS_CONV = "block1.conv1"  # the conv of the lecture's first rms pair g → ∂L/∂W (0.0022 → 1.21)


def _backward_claims(setup: dict) -> list[Claim]:
    steps = [("block3", "block2"), ("block2", "pool2"), ("pool2", "block1")]
    claims = []
    for a, b in steps:
        claims.append(
            Claim(
                f"ideal-{a}-to-{b}",
                f"ideal growth of E[g²] from {a} back to {b}",
                LECTURE_BACK_IDEAL[b] / LECTURE_BACK_IDEAL[a],
                0.05,
                "ratios of the rules' figures (averaged over the seeds' inits); the lecture rounds",
                kind="rel",
                depends=("pool",),
                source="prediction",
                ref="our rules (probe.predict) held to the ratios of the lecture's ideal backward column",
            )
        )
        through_pool = (a, b) == ("pool2", "block1")  # the max pool's ÷4: one winner in four, exact
        claims.append(
            Claim(
                f"{a}-to-{b}",
                f"measured growth of E[g²] from {a} back to {b}",
                LECTURE_BACK[b] / LECTURE_BACK[a],
                0.15,
                SEED_WHY,
                kind="rel",
                quick_tolerance=0.25,
                depends=("pool",),
                source="arithmetic" if through_pool else "lecture",
                ref=BACK_REF + (" (through the max pool: each window's g goes to its one winner, so the "
                                "ratio is ¼ exactly by construction, for any correct max pool; the lecture's "
                                "5.5µ/22.2µ is ¼ rounded)" if through_pool else ""),
            )
        )
    for stage in LECTURE_BACK:
        claims.append(
            Claim(
                f"ideal-g2-{stage}",
                f"ideal E[g²] at {stage}'s output",
                LECTURE_BACK_IDEAL[stage],
                0.1,
                "the rules with each init's actual weights, averaged over the seeds' inits; "
                "the lecture rounds",
                kind="rel",
                depends=("pool",),
                source="prediction",
                ref="our rules (probe.predict) held to the lecture's ideal backward column",
            )
        )
        claims.append(
            Claim(
                f"g2-{stage}",
                f"measured E[g²] at {stage}'s output",
                LECTURE_BACK[stage],
                0.4,
                "mean over seeds; one init's E[g²] differs from the next by up to ±40% (seeds 0–4 at "
                "block 3: 7.8µ to 14.4µ)",
                kind="rel",
                quick_tolerance=0.5,
                depends=("pool",),
                source="lecture",
                ref=BACK_REF,
            )
        )
    claims += [
        Claim(
            "pool-zeros",
            "after the max pool (at its input) 75% of the gradients are exact zeros",
            0.75,
            0.01,
            "exact: each window's gradient goes to one winner, ties included (torch picks one)",
            depends=("pool",),
            source="arithmetic",
            ref="lecture, Tuesday's CNN backward: the max pool zeroes three gradients in four (exact by "
            "construction for any correct max pool, as pool-backward's max-zeros)",
        ),
    ]
    claims += [
        Claim(
            f"weight-ratio-{end}",
            f"‖∂L/∂W‖/‖W‖ of every conv, stem to block 3, of one init (seed {setup['seeds'][0]}): its "
            f"{'smallest' if end == 'low' else 'largest'} is the lecture's {bar}",
            bar,
            0.5,
            "half a unit of the lecture's printed integer (the range 10–16 is one net's, so one init is "
            "measured, not a mean over inits; the other seeds' ranges are in the note)",
            quick_tolerance=0.5,
            depends=("pool",),
            source="lecture",
            ref="lecture, Tuesday's CNN backward: ‖∂L/∂W‖/‖W‖ ≈ 10–16 in every conv, stem to block 3",
        )
        for end, bar in (("low", 10.0), ("high", 16.0))
    ]
    pair_ref = ("lecture, Tuesday's CNN backward: the six rms pairs g → ∂L/∂W, the first 0.0022 → 1.21 (read "
                "as block 1's first conv: the six pairs are the six block convs in order); the other five "
                "pairs are not in our references, so ours are in the note, unjudged")
    claims += [
        Claim(
            f"rms-g-{RMS_CONV}",
            f"{RMS_CONV}: the rms of ∂L/∂(its output), mean over the seeds' inits: the lecture's 0.0022",
            0.0022,
            0.25,
            "one init's rms g differs from the next by up to ±25% (seeds 0–4: 0.0017 to 0.0027), and the "
            "lecture's is one init's",
            kind="rel",
            depends=("pool",),
            source="lecture",
            ref=pair_ref,
        ),
        Claim(
            f"rms-dw-{RMS_CONV}",
            f"{RMS_CONV}: the rms of ∂L/∂W (W its 32·32·9 weights), mean over the seeds' inits: the "
            "lecture's 1.21, a weight's gradient ~500× the gradient at the conv's output (each weight sums "
            "512·14·14 products g·x)",
            1.21,
            0.5,
            "one init's rms ∂L/∂W differs from the next by up to ±50% (seeds 0–4: 0.79 to 2.16), and the "
            "lecture's is one init's",
            kind="rel",
            depends=("pool",),
            source="lecture",
            ref=pair_ref,
        ),
    ]
    n_stem = 32 * 25  # the stem's weights: Conv2d(1, 32, 5)
    s = len(setup["seeds"])
    claims += [
        Claim(
            "stem-to-image",
            "the stem conv multiplies E[g²] by fan_out · E[w²] = 32 · 25 · (1/25) = 32 on its "
            "way to the image "
            "(E[(∂L/∂image)²] / E[(∂L/∂stem out)²], mean over the seeds' inits)",
            32.0,
            3 * math.sqrt(2 / n_stem) / math.sqrt(s),
            f"3 s.e. over {s} inits of the realized E[w²] of the stem's {n_stem} weights (relative s.d. "
            f"√(2/{n_stem}) = 5% per init)",
            kind="rel",
            depends=("pool",),
            source="lecture",
            ref="lecture, Tuesday's CNN backward: the stem multiplies the gradient by 32 on its "
                "way to the image",
        ),
        Claim(
            "spike-stem",
            "the gradient histogram's spike at 0 below the first max pool: share of exact zeros in "
            "∂L/∂(stem output)",
            0.75,
            0.01,
            "exact: each window's gradient goes to one winner, ties included (torch picks one)",
            depends=("pool",),
            source="arithmetic",
            ref="lecture, Tuesday's CNN backward, its gradient histograms: a spike at 0 below each max pool "
            "(its height, 3/4, is exact by construction for any correct max pool)",
        ),
    ]
    return claims


@experiment(
    "network-backward",
    title="Tuesday's CNN backward: E[(∂L/∂·)²] per stage, ÷4 at the max pool",
    order=7,
    setup=SETUP,
    quick=BACK_QUICK,
    claims=_backward_claims,
)
def network_backward(ctx: Context) -> None:
    reports = probe_seeds(ctx, backward="unit-noise")
    g2 = {s: [r[s].backward.e2 for r in reports] for s in LECTURE_BACK}
    first = reports[0]
    ideal = {s: mean_ideal(reports, s) for s in LECTURE_BACK}
    for a, b in [("block3", "block2"), ("block2", "pool2"), ("pool2", "block1")]:
        ideal_ratio = ideal[b] / ideal[a] if ideal[a] and ideal[b] is not None else None
        ctx.check(f"ideal-{a}-to-{b}", ideal_ratio)
        ctx.check(f"{a}-to-{b}", statistics.fmean(x / y for x, y in zip(g2[b], g2[a])), theory=ideal_ratio)
    for stage in LECTURE_BACK:
        ctx.check(f"ideal-g2-{stage}", ideal[stage])
        ctx.check(
            f"g2-{stage}",
            statistics.fmean(g2[stage]),
            theory=ideal[stage],
            note="seeds: " + ", ".join(f"{v / 1e-6:.1f}µ" for v in g2[stage]),
        )
    ctx.check("pool-zeros", statistics.fmean(r["block1"].backward.zero_share for r in reports), theory=0.75)
    ranges = []
    for r in reports:  # per init: ‖∂L/∂W‖/‖W‖ of the stem and the six block convs
        ratios = [p.ratio for p in r.params if p.name.removesuffix(".weight") in ["stem", *CONVS]]
        ranges.append((min(ratios), max(ratios)))
    others = "; ".join(f"seed {s}: {lo:.1f}–{hi:.1f}" for s, (lo, hi) in zip(ctx["seeds"], ranges))
    ctx.check("stem-to-image", statistics.fmean(r["(input)"].backward.e2 / r["stem"].backward.e2
                                                for r in reports),
              note="seeds: " + ", ".join(f"{r['(input)'].backward.e2 / r['stem'].backward.e2:.1f}"
                                         for r in reports))
    ctx.check("spike-stem", statistics.fmean(r["stem"].backward.zero_share for r in reports), theory=0.75)
    pairs = {name: ([r[name].backward.rms for r in reports],
                    [next(p.grad_rms for p in r.params if p.name == f"{name}.weight") for r in reports])
             for name in CONVS}  # per conv: (rms g at its output, rms ∂L/∂W) per seed
    mean_pairs = "; ".join(f"{n} {statistics.fmean(g):.2g} → {statistics.fmean(w):.3g}"
                           for n, (g, w) in pairs.items())
    g_rms, w_rms = pairs[RMS_CONV]
    ctx.check(f"rms-g-{RMS_CONV}", statistics.fmean(g_rms),
              note="seeds: " + ", ".join(f"{v:.4f}" for v in g_rms)
              + f"; the six pairs g → ∂L/∂W (means over the seeds): {mean_pairs}")
    ctx.check(f"rms-dw-{RMS_CONV}", statistics.fmean(w_rms),
              note="seeds: " + ", ".join(f"{v:.3f}" for v in w_rms) + "; ratio to rms g per seed: "
              + ", ".join(f"{w / g:.0f}" for g, w in zip(g_rms, w_rms)))
    ctx.check("weight-ratio-low", ranges[0][0], note=f"per init, stem to block 3: {others}")
    ctx.check("weight-ratio-high", ranges[0][1], note=f"per init, stem to block 3: {others}")
    mu = 1e-6
    for p in first.params:
        name = p.name.removesuffix(".weight")
        if name in ["stem", *CONVS]:
            ctx.note(
                f"{name}: rms g at its output {first[name].backward.rms:.2g} → rms ∂L/∂W {p.grad_rms:.3g}, "
                f"‖∂L/∂W‖/‖W‖ {p.ratio:.1f} (seed {ctx['seeds'][0]})"
            )
    ctx.data["grad_e2"] = g2

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(LECTURE_BACK)
    pos = range(len(names))
    ax.bar([p - 0.2 for p in pos], [ideal[s] / mu for s in names], 0.4, label="ideal (rules)")
    ax.bar([p + 0.2 for p in pos], [statistics.fmean(g2[s]) / mu for s in names], 0.4, label="measured")
    ax.set_xticks(list(pos), [f"{s} out" for s in names])
    ax.set(
        ylabel="E[(∂L/∂·)²] (µ = 1e-6)", yscale="log", title="backward, unit-variance gradient at the logits"
    )
    ax.legend(fontsize=8)
    ctx.figure(fig, "network-backward.png")
    ctx.figure(histograms(first, "backward"), "network-backward-histograms.png")
