"""Experiments 4–5: what a 2×2 stride-2 pool does to N(0, 1) values, forward and backward.

    average  out = ¼ Σ v_j          Var = 1/4;            each input gets g/4: E[(∂L/∂v)²] = E[g²]/16
    max      out = V · hardmax(V)   mean 1.03, Var 0.49   (density 4 φ(x) Φ(x)³);
             only the winner gets g: E[(∂L/∂v)²] = E[g²]/4, and 3/4 of the inputs get an exact zero

Our gated pools (``gatepool.layers``) run on i.i.d. N(0, 1) maps and are measured by
``gatepool.analysis.probe.measure`` with a unit-variance gradient seeded at their output; the theory
beside them
is ``gatepool.analysis.probe.theory`` (the max by numerical integration of its density).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe import (
    avg_pool_backward,
    avg_pool_forward,
    max_of_normals,
    max_pool_backward,
    measure,
)
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.layers import create_pool
from gatepool.utils.checks import check_int
from gatepool.utils.plotting import pyplot

SETUP = {"batch": 512, "channels": 32, "size": 14, "window": 2, "seed": 0}
QUICK = {"batch": 64}
FORWARD_REF = "lecture, a 2 × 2 pool of N(0, 1) values: average Var ¼; max mean 1.03, Var 0.49"
BACKWARD_REF = "lecture, the same pools backward: max passes g to one input in four, average g/4 to all"
BACKWARD_EXACT = (
    BACKWARD_REF + " (exact for any correct pool: each output's g goes to one input of four, or g/4 to "
    "each, so the ratios are 1/4 and 1/16 and the zero shares 3/4 and 0 by construction)"
)
SAMPLES = "512·32·49 windows: the standard error is below 0.005"


def _pools(ctx: Context) -> dict[str, dict]:
    """Measure avg and max pools on the same N(0, 1) maps; returns the probe rows per gate."""
    k = ctx["window"]
    check_int(k, "--set window", 1, ctx["size"])
    gen = torch.Generator().manual_seed(ctx["seed"])
    x = torch.randn(ctx["batch"], ctx["channels"], ctx["size"], ctx["size"], generator=gen)  # (B, C, H, W)
    rows = {}
    for gate in ("avg", "max"):
        rep = measure(
            create_pool(gate, k),
            x,
            backward="unit-noise",
            seed=ctx["seed"],
            samples=20000,
        )
        rows[gate] = {"in": rep["(input)"], "out": rep["(output)"]}
    return rows


@experiment(
    "pool-forward",
    title="2×2 pools of N(0,1): average Var ¼; max mean 1.03, Var 0.49",
    order=4,
    setup=SETUP,
    quick=QUICK,
    claims=[
        Claim(
            "avg-variance",
            "average pool: Var = 1/4",
            0.25,
            0.01,
            SAMPLES,
            quick_tolerance=0.02,
            depends=("window",),
            source="lecture",
            ref=FORWARD_REF,
        ),
        Claim(
            "max-mean",
            "max pool: mean of the largest of 4 = 1.03",
            1.03,
            0.01,
            SAMPLES,
            quick_tolerance=0.02,
            depends=("window",),
            source="lecture",
            ref=FORWARD_REF,
        ),
        Claim(
            "max-variance",
            "max pool: Var of the largest of 4 = 0.49",
            0.49,
            0.01,
            SAMPLES,
            quick_tolerance=0.02,
            depends=("window",),
            source="lecture",
            ref=FORWARD_REF,
        ),
    ],
)
def pool_forward(ctx: Context) -> None:
    rows = _pools(ctx)
    n = ctx["window"] ** 2
    mean_th, var_th = max_of_normals(n)
    ctx.check("avg-variance", rows["avg"]["out"].forward.var, theory=avg_pool_forward(n))
    ctx.check("max-mean", rows["max"]["out"].forward.mean, theory=mean_th)
    ctx.check("max-variance", rows["max"]["out"].forward.var, theory=var_th)
    ctx.note(f"theory by integrating {n}·φ(x)·Φ(x)^{n - 1}: mean {mean_th:.4f}, variance {var_th:.4f}")

    plt = pyplot()
    from scipy.stats import norm

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), sharex=True)
    grid = torch.linspace(-4, 4, 401).numpy()
    for ax, (title, row, curve) in zip(
        axes,
        [
            ("input N(0, 1)", rows["max"]["in"], norm.pdf(grid)),
            (f"average of {n}: N(0, 1/{n})", rows["avg"]["out"], norm.pdf(grid, scale=(1 / n) ** 0.5)),
            (
                f"max of {n}: {n}φ(x)Φ(x)^{n - 1}",
                rows["max"]["out"],
                n * norm.pdf(grid) * norm.cdf(grid) ** (n - 1),
            ),
        ],
    ):
        ax.hist(row.samples.numpy(), bins=80, density=True, alpha=0.5, label="measured")
        ax.plot(grid, curve, "k", lw=1.2, label="density")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    ctx.figure(fig, "pool-forward.png")


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
    rows = _pools(ctx)
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
