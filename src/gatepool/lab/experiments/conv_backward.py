"""Experiment 3 ``conv-backward``: a unit gradient doubles through the He conv and halves through the ReLU.

    E[(∂L/∂p̂)²] = fan_out · σ_W² · E[g²] = 288 · (2/288) · 1 = 2,  then through the ReLU: ½ · 2 = 1

The step, its setup and the ideal: :mod:`gatepool.lab.common.conv_variance`.
"""

from __future__ import annotations

from gatepool.analysis.probe import measure
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.conv_variance import QUICK, SEED_SPREAD, SETUP, STEP, boxed_step, interior

BACKWARD_REF = "lecture, the same step backward: 2.01 after the conv, 1.01 after the ReLU"


@experiment(
    "conv-backward",
    title="a unit gradient doubles through the He conv and halves through the ReLU",
    order=3,
    setup=SETUP,
    quick=QUICK,
    claims=[
        Claim(
            "after-conv",
            "E[(∂L/∂p̂)²] = 288 · (2/288) · 1 = 2 (lecture measured 2.01)",
            2.00,
            0.12,
            SEED_SPREAD + " (of 2)",
            depends=STEP, source="lecture", ref=BACKWARD_REF,
        ),
        Claim(
            "after-relu",
            "E[(∂L/∂x̂)²] through the ReLU = ½ · 2 = 1 (lecture measured 1.01)",
            1.00,
            0.06,
            SEED_SPREAD,
            depends=STEP, source="lecture", ref=BACKWARD_REF,
        ),
    ],
)
def conv_backward(ctx: Context) -> None:
    step, x = boxed_step(ctx)
    rep = measure(step, x, backward="unit-noise", maps=True, seed=ctx["seed"])
    inner = interior(ctx)
    w = step.conv.weight
    ideal_conv = w.shape[0] * w[0, 0].numel() * w.pow(2).mean().item()  # fan_out · E[w²] · 1
    after_conv = rep["relu"].maps["grad_e2"][inner].mean().item()  # ∂L/∂p̂ = ∂L/∂(relu output)
    after_relu = rep["gn"].maps["grad_e2"][inner].mean().item()  # ∂L/∂x̂ = ∂L/∂(gn output)
    alive = 1 - rep["relu"].forward.zero_share  # the ReLU passes the gradient of its positive inputs
    ctx.check(
        "after-conv",
        after_conv,
        theory=ideal_conv,
        note=f"whole map {rep['relu'].backward.e2:.3f} (border positions receive from fewer outputs)",
    )
    ctx.check(
        "after-relu", after_relu, theory=ideal_conv * alive, note=f"share of ReLU inputs > 0: {alive:.3f}"
    )
