"""Experiment 1 ``conv-forward``: block 1's boxed step keeps σ² = 1 forward.

    p̂ = ReLU(GroupNorm(x)),  ŷ = conv3×3(p̂),  C_in = C_out = 32,  σ_W² = 2/288,  14×14 maps
    E[x̂²] = 1,  E[p̂²] = ½ (mean 1/√(2π) = 0.40, Var ½ − 1/(2π) = 0.34),
    σ²(ŷ) = fan_in · σ_W² · E[p̂²] = 288 · (2/288) · ½ = 1        (away from the border)

The step, its setup and the ideal beside the measurement: :mod:`gatepool.lab.common.conv_variance`.
"""

from __future__ import annotations

from gatepool.analysis.probe import measure, relu_moments
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.conv_variance import (
    QUICK,
    SEED_SPREAD,
    SETUP,
    STEP,
    boxed_step,
    ideal_conv_var,
    interior,
)

FORWARD_REF = "lecture, block 1's boxed step forward: 288 · (2/288) · ½ = 1 (measured there 0.97)"

_relu_mean, _relu_var, _relu_e2, _ = relu_moments()


@experiment(
    "conv-forward",
    title="block 1's boxed step keeps σ² = 1: 288 · (2/288) · ½",
    order=1,
    setup=SETUP,
    quick=QUICK,
    claims=[
        Claim(
            "after-norm",
            "after GroupNorm E[x̂²] = 1.00",
            1.00,
            0.01,
            "GroupNorm normalizes each group exactly (up to eps)",
            depends=STEP, source="arithmetic",
            ref=FORWARD_REF + " (E[x̂²] = 1 is GroupNorm's definition: any correct GroupNorm meets it)",
        ),
        Claim(
            "relu-e2",
            "after ReLU E[p̂²] = ½",
            0.50,
            0.01,
            "512·32·196 samples: s.e. < 0.001",
            quick_tolerance=0.02,
            depends=STEP, source="arithmetic",
            ref=FORWARD_REF + " (the half-normal's moment for x̂ ~ N(0, 1) after GroupNorm: torch's ReLU on "
            "Gaussian draws, which no correct torch misses)",
        ),
        Claim(
            "relu-mean",
            "after ReLU the mean is 1/√(2π) = 0.40",
            0.40,
            0.01,
            "the lecture prints two decimals",
            quick_tolerance=0.02,
            depends=STEP, source="arithmetic",
            ref=FORWARD_REF + " (the half-normal's moment for x̂ ~ N(0, 1) after GroupNorm: torch's ReLU on "
            "Gaussian draws, which no correct torch misses)",
        ),
        Claim(
            "relu-variance",
            "after ReLU the variance is ½ − 1/(2π) = 0.34",
            0.34,
            0.01,
            "the lecture prints two decimals",
            quick_tolerance=0.02,
            depends=STEP, source="arithmetic",
            ref=FORWARD_REF + " (the half-normal's moment for x̂ ~ N(0, 1) after GroupNorm: torch's ReLU on "
            "Gaussian draws, which no correct torch misses)",
        ),
        Claim(
            "relu-spike",
            "after ReLU half the values are exactly 0: the spike at 0 holds ½ of p̂",
            0.50,
            0.01,
            "512·32·196 samples: s.e. < 0.001",
            quick_tolerance=0.02,
            depends=STEP,
            source="arithmetic",
            ref="lecture, Tuesday's CNN forward, the ideal distributions: 'Every branch starts with a "
            "GroupNorm: N(0, 1). ReLU keeps half, E[p̂²] = ½, with a spike at 0' (GroupNorm of Gaussian "
            "values is symmetric, so any correct ReLU zeroes half of them)",
        ),
        Claim(
            "conv-variance",
            "σ²(ŷ) = 288 · (2/288) · ½ = 1 away from the border (lecture measured 0.97)",
            1.00,
            0.06,
            SEED_SPREAD,
            depends=STEP, source="lecture", ref=FORWARD_REF,
        ),
    ],
)
def conv_forward(ctx: Context) -> None:
    step, x = boxed_step(ctx)
    rep = measure(step, x, backward=None, maps=True)
    gn, relu, conv = rep["gn"].forward, rep["relu"].forward, rep["conv"]
    m, v, e2, _ = relu_moments()
    ctx.check("after-norm", gn.e2, theory=1.0)
    ctx.check("relu-e2", relu.e2, theory=e2)
    ctx.check("relu-mean", relu.mean, theory=m)
    ctx.check("relu-variance", relu.var, theory=v)
    ctx.check("relu-spike", relu.zero_share, theory=0.5)
    mid = conv.maps["var"][interior(ctx)].mean().item()
    ctx.check(
        "conv-variance",
        mid,
        theory=ideal_conv_var(step, relu.e2),
        note=f"over the whole map (border included) σ² = {conv.forward.var:.3f}; ideal with this init "
        f"{ideal_conv_var(step, relu.e2):.3f}",
    )
