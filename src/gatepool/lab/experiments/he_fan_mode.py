"""Experiment 1.6 ``he-fan-mode``: He init with C_in ≠ C_out; fan_in keeps the forward, fan_out the backward.

    p = ReLU(x), x ~ N(0, 1), y = conv3×3(p), upstream g ~ N(0, 1) at y:
    forward   E[y²]          = C_in · k² · σ_W² · ½
    backward  E[(∂L/∂x)²]    = C_out · k² · σ_W² · ½      (½: the ReLU passes half)
    fan_in  mode σ_W² = 2/(C_in k²):  forward 1,  backward C_out/C_in
    fan_out mode σ_W² = 2/(C_out k²): forward C_in/C_out,  backward 1

Sampled quantities carry a tolerance of 3 standard errors (stated per claim).
"""

from __future__ import annotations

import math
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.utils.checks import check_int


def fan_mode_moments(
    c_in: int, c_out: int, mode: str, batch: int, size: int, seed: int
) -> tuple[float, float]:
    """(E[y²], E[(∂L/∂x)²]) for y = conv3×3(ReLU(x)), torch's kaiming_normal_(mode, 'relu'), interior only."""
    gen = torch.Generator().manual_seed(seed)
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    torch.manual_seed(seed)
    nn.init.kaiming_normal_(conv.weight, mode=mode, nonlinearity="relu")
    x = torch.randn(batch, c_in, size, size, generator=gen).requires_grad_(True)  # (B, C_in, H, W)
    y = conv(F.relu(x))  # (B, C_out, H, W)
    g = torch.randn(y.shape, generator=gen)
    (gx,) = torch.autograd.grad(y, x, grad_outputs=g)
    inner = (slice(None), slice(None), slice(1, -1), slice(1, -1))  # no padding in the sums
    return y.detach()[inner].pow(2).mean().item(), gx[inner].pow(2).mean().item()


FAN_SETUP = {"c_in": 16, "c_out": 64, "batch": 64, "size": 16, "seeds": [0, 1, 2, 3, 4, 5, 6, 7]}
FAN_QUICK = {"batch": 16, "seeds": [0, 1, 2, 3]}

TORCH_INIT = (" (torch's own kaiming_normal_ and Conv2d on random draws, no code of ours: the rule's "
              "expectation sampled, as he-torch; he-block checks the library's own init)")


def _fan_claims(setup: dict) -> list[Claim]:
    s = len(setup["seeds"])
    ratio = setup["c_out"] / setup["c_in"]
    n_w = setup["c_in"] * setup["c_out"] * 9
    fwd_sd = 2 * (1 / (2 * math.pi)) * math.sqrt(2) / math.sqrt(setup["c_out"])
    bwd_sd = math.sqrt(2 / n_w)
    tol_f = 3 * math.sqrt(fwd_sd**2 + bwd_sd**2) / math.sqrt(s) + 0.01
    tol_b = 3 * bwd_sd / math.sqrt(s) + 0.01
    why_f = (
        f"3 s.e. of the mean of {s} inits (per-init relative s.d. {fwd_sd:.3f} from the realized weights, "
        "derived in the file), plus 1% for the finite input sample"
    )
    why_b = (
        f"3 s.e. of the mean of {s} inits (per-init relative s.d. √(2/{n_w}) = {bwd_sd:.3f}), plus 1% for "
        "the finite input sample"
    )
    rule = (
        "lecture, He init with C_in ≠ C_out: one mode keeps the forward σ², the other the backward, not both"
    )
    dep = ("c_in", "c_out")
    return [
        Claim(
            "fan-in-forward",
            "fan_in mode keeps the forward E[y²] = 1",
            1.0,
            tol_f,
            why_f,
            kind="rel",
            depends=dep,
            source="arithmetic",
            ref=rule + TORCH_INIT,
        ),
        Claim(
            "fan-in-backward",
            f"fan_in mode scales the backward by C_out/C_in = {ratio:g}",
            ratio,
            tol_b,
            why_b,
            kind="rel",
            depends=dep,
            source="identity",
            ref=f"C_out/C_in for our {setup['c_in']}→{setup['c_out']} conv (the lecture gives the rule only)"
            + TORCH_INIT,
        ),
        Claim(
            "fan-out-forward",
            f"fan_out mode scales the forward by C_in/C_out = {1 / ratio:g}",
            1 / ratio,
            tol_f,
            why_f,
            kind="rel",
            depends=dep,
            source="identity",
            ref=f"C_in/C_out for our {setup['c_in']}→{setup['c_out']} conv (the lecture gives the rule only)"
            + TORCH_INIT,
        ),
        Claim(
            "fan-out-backward",
            "fan_out mode keeps the backward E[(∂L/∂x)²] = 1",
            1.0,
            tol_b,
            why_b,
            kind="rel",
            depends=dep,
            source="arithmetic",
            ref=rule + TORCH_INIT,
        ),
    ]


@experiment(
    "he-fan-mode",
    title="He init with C_in ≠ C_out (16→64): fan_in keeps the forward, fan_out the backward",
    order=1.6,
    setup=FAN_SETUP,
    quick=FAN_QUICK,
    claims=_fan_claims,
)
def he_fan_mode(ctx: Context) -> None:
    c_in, c_out = ctx["c_in"], ctx["c_out"]
    check_int(c_in, "--set c_in")
    check_int(c_out, "--set c_out")
    rows = {}
    for mode in ("fan_in", "fan_out"):
        rows[mode] = [fan_mode_moments(c_in, c_out, mode, ctx["batch"], ctx["size"], s) for s in ctx["seeds"]]
    theory = {"fan_in": (1.0, c_out / c_in), "fan_out": (c_in / c_out, 1.0)}
    for mode, key in (("fan_in", "fan-in"), ("fan_out", "fan-out")):
        fwd = [r[0] for r in rows[mode]]
        bwd = [r[1] for r in rows[mode]]
        seeds = "seeds: " + ", ".join(f"{f:.3f}/{b:.3f}" for f, b in zip(fwd, bwd)) + " (forward/backward)"
        ctx.check(f"{key}-forward", statistics.fmean(fwd), theory=theory[mode][0], note=seeds)
        ctx.check(f"{key}-backward", statistics.fmean(bwd), theory=theory[mode][1], note=seeds)
