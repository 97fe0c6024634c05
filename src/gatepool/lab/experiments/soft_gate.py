"""Experiment 8 ``soft-gate``: max pool is ``V · hardmax(V)``; soften it to SoftPool, ``V · softmax(V)``.

    out = Σ_j g_j v_j,   g = softmax(v)

On the lecture's window of four scores, through the library's gated pool, beside the closed form in
float64 (:mod:`gatepool.lab.common.soft_window`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.soft_window import (
    LECTURE_EXP,
    THREE_DECIMALS,
    TWO_DECIMALS,
    WINDOW,
    pool_once,
    printed,
    softmax_theory,
    window_of,
)
from gatepool.utils.plotting import pyplot

LECTURE_EXP_SUM = 13794.0
DISPLAYED_WINDOW = [3.44, 4.11, 8.44, 9.11]
WINDOW_REF = "lecture, the soft gate on the 7's strongest top-edge window (e^v = 31, 61, 4,647, 9,054)"
SOFT_RESTATED = (" (its arithmetic: softmax of its printed window, which any correct soft pool gives, as "
                 "max-out for the max; checked on the library's gated pool)")


def _soft_gate_claims(setup: dict) -> list[Claim]:
    n = len(setup["window"])
    on_window = setup["window"] == WINDOW
    lecture_gates = [0.002, 0.004, 0.337, 0.656]
    claims = [
        Claim(
            f"exp-{j + 1}",
            f"the printed window's v_{j + 1} = {DISPLAYED_WINDOW[j]} "
            f"gives the printed e^v = {LECTURE_EXP[j]:,.0f}",
            LECTURE_EXP[j],
            0.5 + LECTURE_EXP[j] * math.expm1(0.005),
            "both are rounded: half a unit of e^v plus e^v · (e^0.005 − 1) for the window's two decimals",
            source="arithmetic",
            ref=WINDOW_REF + " (math.exp of the lecture's printed v: its own arithmetic, no code of ours)",
        )
        for j in range(4)
    ]
    claims += [
        Claim(
            "exp-sum",
            "arithmetic: Σ e^v over the window (v = ln of the printed e^v) is the printed 13,794",
            LECTURE_EXP_SUM,
            0.5 + 4 * 0.5,
            "half a unit of the printed sum plus half a unit of each of the four printed e^v "
            "it is built from",
            depends=("window",),
            source="arithmetic",
            ref=WINDOW_REF + " (the window is defined from the printed e^v, so the sum re-adds them)",
        ),
        Claim(
            "max-out",
            "max pool = V · hardmax(V) picks the largest value",
            9.11,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=WINDOW_REF + " (the window's largest printed value, by the max's definition: any correct max "
            "pool meets it, as hard-1…4)",
        ),
        Claim(
            "soft-out",
            "SoftPool (τ = 1) = V · softmax(V)",
            8.85,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=WINDOW_REF + SOFT_RESTATED,
        ),
    ]
    claims += [
        Claim(
            f"soft-gate-{j + 1}",
            f"SoftPool gate on v_{j + 1}",
            lecture_gates[j] if on_window and n == 4 else None,
            printed(3, 1.0),
            THREE_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=WINDOW_REF + SOFT_RESTATED,
        )
        for j in range(n)
    ]
    return claims


@experiment(
    "soft-gate",
    title="max pool is V·hardmax(V); SoftPool is V·softmax(V)",
    order=8,
    setup={"window": WINDOW},
    claims=_soft_gate_claims,
)
def soft_gate(ctx: Context) -> None:
    v = window_of(ctx)
    for j, shown in enumerate(DISPLAYED_WINDOW):
        ctx.check(
            f"exp-{j + 1}", math.exp(shown), note=f"ln {LECTURE_EXP[j]:,.0f} = {math.log(LECTURE_EXP[j]):.4f}"
        )
    ctx.check("exp-sum", float(torch.exp(v.double()).sum()), theory=float(np.exp(ctx["window"]).sum()))
    g_th, out_th, _ = softmax_theory(np.array(ctx["window"], dtype=np.float64), 1.0)
    out_max, gates_max, _ = pool_once(v, "max")
    out_soft, gates_soft, _ = pool_once(v, "soft", 1.0)
    ctx.check("max-out", out_max, theory=max(ctx["window"]))
    ctx.check("soft-out", out_soft, theory=out_th)
    for j, (g, t) in enumerate(zip(gates_soft.tolist(), g_th)):
        ctx.check(f"soft-gate-{j + 1}", g, theory=float(t))
    ctx.data.update(hard_gates=gates_max, soft_gates=gates_soft)
    ctx.note(
        f"window v = ln e^v = {[round(x, 3) for x in ctx['window']]}; hardmax gates "
        f"{[round(float(g), 4) for g in gates_max]}, softmax gates {[round(float(g), 4) for g in gates_soft]}"
    )
    ctx.figure(_gate_panel(), "gate-family.png")


def _gate_panel():
    """ReLU → SiLU beside hardmax → softmax: the same step made soft, as a gate times its input."""
    plt = pyplot()
    y = np.linspace(-4, 4, 401)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(y, np.maximum(y, 0), label="ReLU = H(y) · y")
    ax1.plot(y, y / (1 + np.exp(-y)), label="SiLU = σ(y) · y")
    ax1.plot(y, (y > 0).astype(float), ls=":", color="C0", label="gate H(y)")
    ax1.plot(y, 1 / (1 + np.exp(-y)), ls=":", color="C1", label="gate σ(y)")
    ax1.set(xlabel="y", title="an activation is a gate times its input")
    ax1.legend(fontsize=8)
    window = np.array(WINDOW)
    x = np.arange(len(window))
    hard = (window == window.max()).astype(float)
    soft = softmax_theory(window, 1.0)[0]
    ax2.bar(x - 0.2, hard, width=0.4, label="hardmax(V): max pool")
    ax2.bar(x + 0.2, soft, width=0.4, label="softmax(V): SoftPool")
    ax2.set(xticks=x, xticklabels=[f"v={v:.2f}" for v in window], ylabel="gate", title="a pool is a gate too")
    ax2.legend(fontsize=8)
    return fig
