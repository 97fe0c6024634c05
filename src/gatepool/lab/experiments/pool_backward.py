"""Experiment 5 ``pool-backward``: max pool passes the gradient to the winner only; average to everyone.

    average  each input gets g/4: E[(∂L/∂v)²] = E[g²]/16
    max      only the winner gets g: E[(∂L/∂v)²] = E[g²]/4, and 3/4 of the inputs get an exact zero

The pools measured and their setup: :mod:`gatepool.lab.common.pool_variance`.
"""

from __future__ import annotations

from gatepool.analysis.probe import avg_pool_backward, max_pool_backward
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.pool_variance import QUICK, SAMPLES, SETUP, measure_pools

BACKWARD_REF = "lecture, the same pools backward: max passes g to one input in four, average g/4 to all"
BACKWARD_EXACT = (
    BACKWARD_REF + " (exact for any correct pool: each output's g goes to one input of four, or g/4 to "
    "each, so the ratios are 1/4 and 1/16 and the zero shares 3/4 and 0 by construction)"
)


@experiment(
    "pool-backward",
    title="max pool: only the winner gets the gradient; average: everyone gets g/4",
    order=5,
    setup=SETUP,
    quick=QUICK,
    claims=[
        Claim(
            "max-grad",
            "max pool: E[(∂L/∂x)²] = ¼ E[g²]",
            0.25,
            0.01,
            SAMPLES,
            quick_tolerance=0.02,
            depends=("window", "size"),
            source="arithmetic",
            ref=BACKWARD_EXACT,
        ),
        Claim(
            "max-zeros",
            "max pool: share of inputs with an exact-zero gradient = 3/4",
            0.75,
            0.001,
            "exact up to ties, which have probability 0 for continuous inputs",
            depends=("window", "size"),
            source="arithmetic",
            ref=BACKWARD_EXACT,
        ),
        Claim(
            "avg-grad",
            "average pool: E[(∂L/∂x)²] = (¼)² E[g²]",
            0.0625,
            0.003,
            SAMPLES,
            quick_tolerance=0.005,
            depends=("window", "size"),
            source="arithmetic",
            ref=BACKWARD_EXACT,
        ),
        Claim(
            "avg-zeros",
            "average pool: no input gets an exact zero",
            0.0,
            0.0001,
            "a zero needs g exactly 0 (probability 0)",
            depends=("window", "size"),
            source="arithmetic",
            ref=BACKWARD_EXACT,
        ),
    ],
)
def pool_backward(ctx: Context) -> None:
    rows = measure_pools(ctx)
    k, size = ctx["window"], ctx["size"]
    n = k * k
    covered = ((size // k) * k / size) ** 2  # inputs in no window (size not a multiple of k) get no gradient
    g2 = {gate: r["out"].backward.e2 for gate, r in rows.items()}  # E[g²] actually seeded (≈ 1)
    max_g, max_zero = max_pool_backward(n, 1.0)
    ctx.check(
        "max-grad",
        rows["max"]["in"].backward.e2 / g2["max"],
        theory=covered * max_g,
        note=f"E[g²] seeded at the output: {g2['max']:.4f}",
    )
    ctx.check("max-zeros", rows["max"]["in"].backward.zero_share, theory=1 - covered * (1 - max_zero))
    ctx.check("avg-grad", rows["avg"]["in"].backward.e2 / g2["avg"], theory=covered * avg_pool_backward(n))
    ctx.check("avg-zeros", rows["avg"]["in"].backward.zero_share, theory=1 - covered)
