"""Experiment 4 ``pool-forward``: what a 2×2 stride-2 pool does to N(0, 1) values.

    average  out = ¼ Σ v_j          Var = 1/4
    max      out = V · hardmax(V)   mean 1.03, Var 0.49   (density 4 φ(x) Φ(x)³)

The pools measured and their setup: :mod:`gatepool.lab.common.pool_variance`.
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe import avg_pool_forward, max_of_normals
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.pool_variance import QUICK, SAMPLES, SETUP, measure_pools
from gatepool.utils.plotting import pyplot

FORWARD_REF = "lecture, a 2 × 2 pool of N(0, 1) values: average Var ¼; max mean 1.03, Var 0.49"


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
            source="arithmetic",
            ref=FORWARD_REF + " (moments of N(0, 1) draws 'computed from its distribution': the library's "
            "pools on torch's Gaussian draws, which no correct pool misses)",
        ),
        Claim(
            "max-mean",
            "max pool: mean of the largest of 4 = 1.03",
            1.03,
            0.01,
            SAMPLES,
            quick_tolerance=0.02,
            depends=("window",),
            source="arithmetic",
            ref=FORWARD_REF + " (moments of N(0, 1) draws 'computed from its distribution': the library's "
            "pools on torch's Gaussian draws, which no correct pool misses)",
        ),
        Claim(
            "max-variance",
            "max pool: Var of the largest of 4 = 0.49",
            0.49,
            0.01,
            SAMPLES,
            quick_tolerance=0.02,
            depends=("window",),
            source="arithmetic",
            ref=FORWARD_REF + " (moments of N(0, 1) draws 'computed from its distribution': the library's "
            "pools on torch's Gaussian draws, which no correct pool misses)",
        ),
    ],
)
def pool_forward(ctx: Context) -> None:
    rows = measure_pools(ctx)
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
