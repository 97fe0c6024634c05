"""Experiment 5.5 ``pool-compound``: two 2×2 max pools backward.

Only the winner of each 2×2 window gets the gradient, twice: 1 input in 16 gets a non-zero gradient, and
E[(∂L/∂x)²] = E[g²]/16 (÷4 per pool, compounding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.layers import create_pool


def two_max_pools(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, ∂L/∂x) through two 2×2 max pools (the library's ``create_pool('max', 2)``), L = Σ g·out."""
    x = x.clone().requires_grad_(True)
    out = create_pool("max", 2)(create_pool("max", 2)(x))
    (gx,) = torch.autograd.grad(out, x, grad_outputs=g)
    return out.detach(), gx


COMPOUND_SETUP = {"batch": 64, "channels": 8, "size": 28, "seed": 0}
EXACT_SHARE = "exact: each 7×7 output's gradient lands on one of its 16 inputs (ties have probability 0)"


@experiment(
    "pool-compound",
    title="two 2×2 max pools: 1 input in 16 gets a gradient, E[g²] falls by 16",
    order=5.5,
    setup=COMPOUND_SETUP,
    claims=[
        Claim(
            "nonzero-share",
            "share of inputs with a non-zero gradient after two max pools = 1/16",
            1 / 16,
            1e-9,
            EXACT_SHARE,
            source="arithmetic",
            ref="lecture, two max pools compound: ÷16 in the backward (exact by construction for any "
            "correct max pool: one winner in 16)",
        ),
        Claim(
            "g2-ratio",
            "E[g²] at the output / E[(∂L/∂x)²] at the input = 16",
            16.0,
            1e-5,
            EXACT_SHARE + "; so the ratio is 16 up to float32 rounding",
            kind="rel",
            source="arithmetic",
            ref="lecture, two max pools compound: ÷16 in the backward (exact by construction for any "
            "correct max pool: one winner in 16)",
        ),
        Claim(
            "one-pool-ratio",
            "after one max pool the ratio is 4 (the compounding: 4 · 4)",
            4.0,
            1e-5,
            EXACT_SHARE,
            kind="rel",
            source="arithmetic",
            ref="one pool's ÷4 (pool-backward), the step of the 16: exact by construction",
        ),
    ],
)
def pool_compound(ctx: Context) -> None:
    size = ctx["size"]
    if size % 4:
        raise ValueError(f"--set size={size}: must be a multiple of 4 (two 2×2 pools)")
    gen = torch.Generator().manual_seed(ctx["seed"])
    x = torch.randn(ctx["batch"], ctx["channels"], size, size, generator=gen)  # (B, C, H, W)
    g = torch.randn(ctx["batch"], ctx["channels"], size // 4, size // 4, generator=gen)
    _, gx = two_max_pools(x, g)
    e2 = g.double().pow(2).mean().item()
    ctx.check("nonzero-share", (gx != 0).double().mean().item(), theory=1 / 16)
    ctx.check("g2-ratio", e2 / gx.double().pow(2).mean().item(), theory=16.0)
    x1 = x.clone().requires_grad_(True)
    out1 = F.max_pool2d(x1, 2)
    g1 = torch.randn(out1.shape, generator=gen)
    (gx1,) = torch.autograd.grad(out1, x1, grad_outputs=g1)
    ctx.check(
        "one-pool-ratio", g1.double().pow(2).mean().item() / gx1.double().pow(2).mean().item(), theory=4.0
    )
