"""The orange numbers explained: Tuesday's CNN's measured σ² and E[g²], predicted from the input alone.

The lecture draws two numbers at every stage: the ideal (blue: independent N(0, 1) positions) and what
512 real digits give (orange). Here the orange ones are *predicted*: ``measure_input`` reads the 512
digits' per-position mean and variance and their correlation at every lag (that is the data), and
``predict_correlated`` carries those statistics through the model's actual weights (conv through each
filter's autocorrelation, ReLU through the bivariate normal per lag, max pool through Clark's formulas
for correlated taps, GroupNorm from the predicted group variance, the residual add, and the backward
pass with the same stencils); it never sees the batch. Each prediction is the mean over the seeds'
inits, as the measurement is; the measured value and the ideal stand beside it in the note.

The claims hold the prediction to the lecture's orange numbers (forward within 10%, the backward E[g²]
within 15%) and to our own measurement of the neighbour correlation (lags 1 and 2, every conv and pool
output, within 0.05). Where a claim is off, the rule is not tuned: the note says what was found.
"""

from __future__ import annotations

import statistics

from gatepool.analysis.probe import measure
from gatepool.analysis.probe.correlated import measure_fields, measure_input, neighbour_corr
from gatepool.analysis.probe.correlated_predict import predict_correlated
from gatepool.data import mnist_batch
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.cnn_at_init import SETUP, seeded_cnn
from gatepool.utils.plotting import pyplot

FORWARD = {"stem": 0.89, "pool1": 0.90, "block1": 1.88, "pool2": 2.02, "block2": 3.16, "block3": 4.41}
RELUS = ["block1.relu1", "block2.relu1", "block3.relu1"]
BACKWARD = {"block3": 13.3e-6, "block2": 16.7e-6, "pool2": 22.2e-6, "block1": 5.5e-6}
CORR_AT = [
    "stem",
    "pool1",
    "block1.conv1",
    "block1.conv2",
    "pool2",
    "block2.conv1",
    "block2.conv2",
    "block3.conv1",
    "block3.conv2",
]
QUICK = {"batch": 256, "seeds": [0, 1]}
REF_FWD = "lecture, Tuesday's CNN forward on 512 digits, its measured (orange) column"
REF_BWD = "lecture, Tuesday's CNN backward, E[g²] per stage (its measured column)"


def _claims(setup: dict) -> list[Claim]:
    why_fwd = (
        "the prediction from the input's statistics, mean over the seeds' inits, held to the "
        "lecture's measured number (the issue's bar: 10%); the quick profile's two inits spread as "
        "the measurement's do (network-forward: ±30%), hence its 40%"
    )
    claims = [
        Claim(
            f"predicted-{s}",
            f"predicted σ² after {s} (from the 512 digits' statistics)",
            v,
            0.10,
            why_fwd,
            kind="rel",
            quick_tolerance=0.4,
            depends=("pool",),
            source="prediction",
            ref=REF_FWD + "; rule: probe.correlated_predict",
        )
        for s, v in FORWARD.items()
    ]
    claims.append(
        Claim(
            "predicted-relu-keeps",
            "predicted E[p²] after the first ReLU of each block",
            0.64,
            0.10,
            "mean of three blocks and the seeds' inits; the lecture says 'about 0.64'",
            kind="rel",
            depends=("pool",),
            source="prediction",
            ref="lecture, Tuesday's CNN forward: 'the ReLU keeps about 0.64, not ½'",
        )
    )
    claims += [
        Claim(
            f"predicted-g2-{s}",
            f"predicted E[g²] at {s}'s output (unit noise at the logits)",
            v,
            0.15,
            "the prediction's mean over the seeds' inits against the lecture's measured number "
            "(the issue's bar: 15%); quick: two inits, ±40% (network-backward), hence 50%",
            kind="rel",
            quick_tolerance=0.5,
            depends=("pool",),
            source="prediction",
            ref=REF_BWD + "; rule: probe.correlated_predict",
        )
        for s, v in BACKWARD.items()
    ]
    for lag in (1, 2):
        claims += [
            Claim(
                f"corr{lag}-{m}",
                f"|predicted − measured| correlation at lag {lag} after {m}",
                0.0,
                0.05,
                "our bar (the issue's): 0.05 of the measured correlation, mean over the seeds",
                kind="max",
                depends=("pool",),
                source="ours",
                ref="the correlation the probe predicts, held to the one we measure on the same 512 digits",
            )
            for m in CORR_AT
        ]
    return claims


@experiment(
    "orange-numbers",
    title="the orange numbers explained: Tuesday's CNN predicted from the input's statistics",
    order=7.2,
    setup=SETUP,
    quick=QUICK,
    claims=_claims,
)
def orange_numbers(ctx: Context) -> None:
    x, _ = mnist_batch(ctx["batch"])
    stats = measure_input(x)
    runs = []
    for seed in ctx["seeds"]:
        model = seeded_cnn(ctx["pool"], seed)
        pred = predict_correlated(model, stats)
        rep = measure(model, x, backward="unit-noise", seed=seed, samples=0)
        runs.append((pred, rep, measure_fields(model, x, CORR_AT)))

    def mean(fn):
        return statistics.fmean(fn(r) for r in runs)

    for s in FORWARD:
        ctx.check(
            f"predicted-{s}",
            mean(lambda r, s=s: r[0][s].var),
            theory=mean(lambda r, s=s: r[1][s].ideal.var),
            note=f"measured {mean(lambda r, s=s: r[1][s].forward.var):.3f}, ideal "
            f"{mean(lambda r, s=s: r[1][s].ideal.var):.3f}; predicted per seed "
            + ", ".join(f"{r[0][s].var:.2f}" for r in runs),
        )
    keep = mean(lambda r: statistics.fmean(r[0][n].e2 for n in RELUS))
    ctx.check(
        "predicted-relu-keeps",
        keep,
        theory=0.5,
        note=f"measured {mean(lambda r: statistics.fmean(r[1][n].forward.e2 for n in RELUS)):.3f}",
    )
    mu = 1e-6
    for s in BACKWARD:
        ctx.check(
            f"predicted-g2-{s}",
            mean(lambda r, s=s: r[0][s].grad_e2),
            theory=mean(lambda r, s=s: r[1][s].ideal.grad_e2),
            note=f"measured {mean(lambda r, s=s: r[1][s].backward.e2) / mu:.2f}µ, ideal "
            f"{mean(lambda r, s=s: r[1][s].ideal.grad_e2) / mu:.2f}µ",
        )
    table = {}
    for lag in (1, 2):
        for m in CORR_AT:
            p = mean(lambda r, m=m, lag=lag: r[0][m].corr(lag))
            q = mean(lambda r, m=m, lag=lag: neighbour_corr(r[2][m], lag))
            table[(m, lag)] = (p, q)
            ctx.check(f"corr{lag}-{m}", abs(p - q), note=f"predicted {p:.3f}, measured {q:.3f}")
    ctx.data["forward"] = {
        s: {
            "predicted": [r[0][s].var for r in runs],
            "measured": [r[1][s].forward.var for r in runs],
            "ideal": [r[1][s].ideal.var for r in runs],
        }
        for s in FORWARD
    }
    ctx.data["backward"] = {
        s: {"predicted": [r[0][s].grad_e2 for r in runs], "measured": [r[1][s].backward.e2 for r in runs]}
        for s in BACKWARD
    }
    ctx.data["corr"] = {f"{m}@{lag}": {"predicted": p, "measured": q} for (m, lag), (p, q) in table.items()}

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for ax, stages, field, get_p, get_m, title in (
        (
            axes[0],
            list(FORWARD),
            "var",
            lambda r, s: r[0][s].var,
            lambda r, s: r[1][s].forward.var,
            "forward σ²",
        ),
        (
            axes[1],
            list(BACKWARD),
            "grad_e2",
            lambda r, s: r[0][s].grad_e2 / mu,
            lambda r, s: r[1][s].backward.e2 / mu,
            "backward E[g²] (µ)",
        ),
    ):
        pos = range(len(stages))
        ideal = [
            mean(lambda r, s=s, field=field: getattr(r[1][s].ideal, field))
            * (1 / mu if field == "grad_e2" else 1)
            for s in stages
        ]
        ax.bar([p - 0.27 for p in pos], ideal, 0.27, label="ideal (independent)", color="C0")
        ax.bar(
            list(pos),
            [mean(lambda r, s=s, get_m=get_m: get_m(r, s)) for s in stages],
            0.27,
            label="measured",
            color="C1",
        )
        ax.bar(
            [p + 0.27 for p in pos],
            [mean(lambda r, s=s, get_p=get_p: get_p(r, s)) for s in stages],
            0.27,
            label="predicted (correlated)",
            color="C2",
        )
        ax.set_xticks(list(pos), stages)
        ax.set_title(title)
        ax.legend(fontsize=7)
    pos = range(len(CORR_AT))
    for lag, mk in ((1, "o"), (2, "s")):
        axes[2].plot(
            pos, [table[(m, lag)][1] for m in CORR_AT], mk + "-", color="C1", label=f"measured, lag {lag}"
        )
        axes[2].plot(
            pos, [table[(m, lag)][0] for m in CORR_AT], mk + "--", color="C2", label=f"predicted, lag {lag}"
        )
    axes[2].set_xticks(list(pos), CORR_AT, rotation=45, fontsize=7)
    axes[2].set_title("neighbour correlation")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    ctx.figure(fig, "orange-numbers.png")
