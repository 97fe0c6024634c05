"""What pool-forward and pool-backward share: their setup, and the average and max pools measured on
the same N(0, 1) maps.

    average  out = ¼ Σ v_j          Var = 1/4;            each input gets g/4: E[(∂L/∂v)²] = E[g²]/16
    max      out = V · hardmax(V)   mean 1.03, Var 0.49   (density 4 φ(x) Φ(x)³);
             only the winner gets g: E[(∂L/∂v)²] = E[g²]/4, and 3/4 of the inputs get an exact zero

Our gated pools (``gatepool.layers``) run on i.i.d. N(0, 1) maps and are measured by
``gatepool.analysis.probe.measure`` with a unit-variance gradient seeded at their output; the theory
beside them is ``gatepool.analysis.probe.theory`` (the max by numerical integration of its density).
"""

from __future__ import annotations

import torch

from gatepool.analysis.probe import measure
from gatepool.lab.claims import Context
from gatepool.layers import create_pool
from gatepool.utils.checks import check_int

SETUP = {"batch": 512, "channels": 32, "size": 14, "window": 2, "seed": 0}
QUICK = {"batch": 64}
SAMPLES = "512·32·49 windows: the standard error is below 0.005"


def measure_pools(ctx: Context) -> dict[str, dict]:
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
