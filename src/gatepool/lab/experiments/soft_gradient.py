"""Experiment 10 ``soft-gradient``: the soft gate passes a gradient to every input.

    ∂out/∂v_j = g_j (1 + (v_j − out)/τ)        (hard max: 1 for the winner, 0 elsewhere)

On the lecture's window, by autograd through the library's gated pool, beside the closed form in float64
(:mod:`gatepool.lab.common.soft_window`).
"""

from __future__ import annotations

import numpy as np

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.soft_window import (
    THREE_DECIMALS,
    WINDOW,
    pool_once,
    printed,
    softmax_theory,
    window_of,
)
from gatepool.utils.plotting import pyplot

GRADIENT_REF = "lecture, the soft gate's backward on the same window"


def _gradient_claims(setup: dict) -> list[Claim]:
    on_window = setup["window"] == WINDOW
    n = len(setup["window"])
    hard = [0.0, 0.0, 0.0, 1.0]
    soft = [-0.010, -0.017, 0.200, 0.827]
    claims = [
        Claim(
            f"hard-{j + 1}",
            f"max pool: ∂out/∂v_{j + 1}",
            hard[j] if on_window else None,
            1e-6,
            "exact: the winner passes the gradient, the rest get exact zeros",
            depends=("window",),
            source="arithmetic",
            ref=GRADIENT_REF + " (0/1 by the max's definition: any correct max pool meets it)",
        )
        for j in range(n)
    ]
    claims += [
        Claim(
            f"soft-{j + 1}",
            f"SoftPool: ∂out/∂v_{j + 1} = g_j(1 + (v_j − out))",
            soft[j] if on_window else None,
            printed(3, 1.0),
            THREE_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=GRADIENT_REF + " (its arithmetic: the closed form g_j(1 + v_j − out) on its printed window, "
            "which autograd of any correct soft pool gives; checked on the library's gated pool)",
        )
        for j in range(n)
    ]
    return claims


@experiment(
    "soft-gradient",
    title="the soft gate passes a gradient to every input",
    order=10,
    setup={"window": WINDOW},
    claims=_gradient_claims,
)
def soft_gradient(ctx: Context) -> None:
    v = window_of(ctx)
    window = np.array(ctx["window"], dtype=np.float64)
    _, _, grad_hard = pool_once(v, "max")
    out_soft, _, grad_soft = pool_once(v, "soft", 1.0)
    hard_th = (window == window.max()).astype(float)
    soft_th = softmax_theory(window, 1.0)[2]
    for j in range(len(window)):
        ctx.check(f"hard-{j + 1}", grad_hard[j], theory=float(hard_th[j]))
        ctx.check(
            f"soft-{j + 1}",
            grad_soft[j],
            theory=float(soft_th[j]),
            note=f"closed form g_j(1 + (v_j − out)) = {soft_th[j]:.4f}",
        )
    ctx.note(f"Σ ∂out/∂v = {grad_soft.sum().item():.4f} for the soft gate (shift-equivariance makes it 1)")

    plt = pyplot()
    x = np.arange(len(window))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.bar(x - 0.2, grad_hard.numpy(), width=0.4, label="max pool (hard)")
    ax.bar(x + 0.2, grad_soft.numpy(), width=0.4, label="SoftPool (soft)")
    ax.axhline(0, color="k", lw=0.8)
    labels = [f"v={w:.2f}" + ("\n< out − 1" if w < float(out_soft) - 1 else "") for w in window]
    ax.set(xticks=x, xticklabels=labels, ylabel="∂out/∂v",  # g_j(1 + v_j − out) < 0 below out − τ
           title="τ = 1: inputs more than τ below the output are pushed down")
    ax.legend(fontsize=8)
    ctx.figure(fig, "soft-gradient.png")
