"""Experiment 13.1 ``conv-reach``: pooling widens the reach; three conv + pool stages see all 28 pixels.

Stages of a k×k conv then a p×p stride-p pool, their receptive width read off autograd's support
(:mod:`gatepool.lab.common.receptive_field`): with 5×5 convs and 2×2 pools three stages see all 28
pixels, where stacked convs alone need seven layers.
"""

from __future__ import annotations

from typing import Any

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.receptive_field import layers_to_see


def _conv_reach_claims(setup: dict[str, Any]) -> list[Claim]:
    k, p, pool = setup["rf_kernel"], setup["rf_pixels"], setup["rf_pool"]
    return [
        Claim("pool-stages-to-see-28", f"stages of a {k}×{k} conv then a {pool}×{pool} stride-{pool} pool a "
              f"unit needs to see all {p} pixels (read off autograd's support at each stage's output)", 3, 0,
              "a count: exact", kind="equal", depends=("rf_kernel", "rf_pixels", "rf_pool"),
              source="arithmetic",
              ref="lecture, the reach of stacked convs: 'three pooling stages would be needed to reach that "
              f"far' (all {p} pixels; a stage read as the conv stem's: a {k}×{k} conv then a 2×2 pool; the "
              "receptive width is fixed by the stages' construction)"),
    ]


@experiment("conv-reach", title="pooling widens the reach: three conv + pool stages see all 28 pixels",
            order=13.1, setup={"rf_kernel": 5, "rf_pixels": 28, "rf_pool": 2}, claims=_conv_reach_claims)
def conv_reach(ctx: Context) -> None:
    k, pixels, pool = ctx["rf_kernel"], ctx["rf_pixels"], ctx["rf_pool"]
    stages, widths = layers_to_see(pixels, k, pool)
    ctx.check("pool-stages-to-see-28", stages)
    ctx.note(f"receptive field after S stages of a {k}×{k} conv and a {pool}×{pool} pool, measured by "
             "autograd: "
             + ", ".join(f"S={i}: {w}" for i, w in enumerate(widths)) + f" pixels; without pools "
             f"{layers_to_see(pixels, k)[0]} convs are needed")
    ctx.data["receptive_widths"] = widths
