"""Experiment 9 ``temperature-dial``: τ dials the gate from max (τ → 0) through SoftPool (τ = 1) to mean.

    out = Σ_j g_j v_j,   g = softmax(v/τ)

On the lecture's window at each of its temperatures, through the library's gated pool, beside the closed
form in float64 (:mod:`gatepool.lab.common.soft_window`).
"""

from __future__ import annotations

import numpy as np

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.soft_window import (
    TWO_DECIMALS,
    WINDOW,
    pool_once,
    printed,
    softmax_theory,
    window_of,
)
from gatepool.utils.checks import check_number
from gatepool.utils.plotting import pyplot

TEMPERATURES = [0.01, 0.5, 1.0, 2.0, 100.0]
LECTURE_OUT = {0.01: 9.11, 0.5: 8.97, 1.0: 8.85, 2.0: 8.45, 100.0: 6.34}
LECTURE_DIAL_GATES = {0.5: [None, None, 0.21, 0.79], 2.0: [0.03, 0.04, 0.39, 0.54]}
DIAL_REF = ("lecture, the temperature dial on the same window (its arithmetic: softmax(v/τ) of its printed "
            "window, which any correct soft pool gives; checked on the library's gated pool)")


def _dial_claims(setup: dict) -> list[Claim]:
    on_window = setup["window"] == WINDOW
    claims = [
        Claim(
            f"out-tau{t:g}",
            f"V · softmax(V/τ) at τ = {t:g}",
            LECTURE_OUT.get(t) if on_window else None,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=DIAL_REF,
        )
        for t in setup["temperatures"]
    ]
    claims += [
        Claim(
            f"gate{j + 1}-tau{t:g}",
            f"the gate on v_{j + 1} at τ = {t:g}",
            gates[j] if on_window else None,
            printed(2, 1.0),
            TWO_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=DIAL_REF,
        )
        for t, gates in LECTURE_DIAL_GATES.items()
        if t in setup["temperatures"]
        for j in range(min(len(gates), len(setup["window"])))
        if gates[j] is not None
    ]
    claims.append(
        Claim(
            "mean-limit",
            "τ → ∞ gives the mean (τ = 1e4 measured)",
            6.28 if on_window else None,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=DIAL_REF,
        )
    )
    claims.append(
        Claim(
            "max-limit",
            "τ → 0 gives the max (τ = 1e-4 measured)",
            9.11 if on_window else None,
            printed(2),
            TWO_DECIMALS,
            depends=("window",),
            source="arithmetic",
            ref=DIAL_REF,
        )
    )
    return claims


@experiment(
    "temperature-dial",
    title="τ dials the gate from max (τ→0) through SoftPool (τ=1) to mean (τ→∞)",
    order=9,
    setup={"window": WINDOW, "temperatures": TEMPERATURES},
    claims=_dial_claims,
)
def temperature_dial(ctx: Context) -> None:
    plt = pyplot()
    window = np.array(ctx["window"], dtype=np.float64)
    v = window_of(ctx)
    for t in ctx["temperatures"]:
        check_number(t, "--set temperatures (each τ)", 0, low_open=True)
        out, gates, _ = pool_once(v, "soft", float(t))
        g_th, out_th, _ = softmax_theory(window, float(t))
        ctx.check(f"out-tau{t:g}", out, theory=out_th)
        for j, shown in enumerate(LECTURE_DIAL_GATES.get(t, ())):
            if shown is not None and j < len(window):
                ctx.check(f"gate{j + 1}-tau{t:g}", gates[j], theory=float(g_th[j]))
    ctx.check("mean-limit", pool_once(v, "soft", 1e4)[0], theory=float(window.mean()))
    ctx.check("max-limit", pool_once(v, "soft", 1e-4)[0], theory=float(window.max()))

    taus = np.logspace(-2, 2, 81)
    curves = np.stack([pool_once(v, "soft", float(t))[1].numpy() for t in taus])  # (T, n)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for j in range(curves.shape[1]):
        ax1.plot(taus, curves[:, j], label=f"g{j + 1} (v={window[j]:g})")
    ax1.axhline(1 / len(window), color="grey", ls=":", lw=1, label="even split")
    ax1.set(xscale="log", xlabel="temperature τ", ylabel="gate", title="gates of softmax(V/τ)")
    ax1.legend(fontsize=8)
    outs = curves @ window
    ax2.plot(taus, outs, color="k")
    ax2.axhline(window.max(), color="C3", ls="--", lw=1, label="max")
    ax2.axhline(window.mean(), color="C0", ls="--", lw=1, label="mean")
    ax2.scatter(
        ctx["temperatures"],
        [softmax_theory(window, t)[1] for t in ctx["temperatures"]],
        zorder=3,
        label="claimed τ",
    )
    ax2.set(xscale="log", xlabel="temperature τ", ylabel="out = V·softmax(V/τ)", title="the output")
    ax2.legend(fontsize=8)
    ctx.figure(fig, "temperature-dial.png")
