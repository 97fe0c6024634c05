"""Experiment 4.5 ``max-normals``: the max of n normals moves right and narrows.

    Φ(1)           P(x ≤ 1) = 0.8413 for x ~ N(0, 1)  ("84%")
    2×2 max pool   P(max ≤ 1) = Φ(1)⁴ = 0.5010: half the outputs exceed 1 ("50%")
    max of n       density n φ(x) Φ(x)^(n−1): as n grows (1, 2, 4, 9, 16) the mean moves right and the
                   spread narrows (exact moments by numerical integration, ``scipy.integrate.quad``)

Sampled claims carry 3 standard errors (each claim's ``why`` says how it is computed).
"""

from __future__ import annotations

import math
from functools import cache

import torch

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.layers import create_pool
from gatepool.utils.checks import check_int


def phi(x: float) -> float:
    """Φ(x), the N(0, 1) distribution function."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@cache
def max_moments(n: int) -> tuple[float, float, float]:
    """(mean, std, kurtosis) of the largest of n i.i.d. N(0, 1): integrals of n φ(x) Φ(x)^(n−1)."""
    check_int(n, "n")
    from scipy import integrate, special

    def density(x: float) -> float:
        return n * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * special.ndtr(x) ** (n - 1)

    def moment(fn) -> float:
        return integrate.quad(lambda x: fn(x) * density(x), -math.inf, math.inf, limit=200)[0]

    mean = moment(lambda x: x)
    var = moment(lambda x: (x - mean) ** 2)
    m4 = moment(lambda x: (x - mean) ** 4)
    return mean, math.sqrt(var), m4 / (var * var)


NS = [1, 2, 4, 9, 16]
TORCH_ONLY = " (torch's own randn{x}, no code of ours: a property of the normal distribution, sampled)"
MAX_SETUP = {"samples": 1_000_000, "ns": NS, "seed": 0}
MAX_QUICK = {"samples": 200_000}


def _max_claims(setup: dict) -> list[Claim]:
    n_s = setup["samples"]
    p1, p4 = phi(1.0), phi(1.0) ** 4
    se1, se4 = math.sqrt(p1 * (1 - p1) / n_s), math.sqrt(p4 * (1 - p4) / n_s)
    claims = [
        Claim(
            "phi-1",
            "Φ(1) = 84%: the share of N(0, 1) samples ≤ 1",
            0.84,
            0.005 + 3 * se1,
            f"the lecture prints two digits (±0.005), plus 3 s.e. √(p(1−p)/{n_s}) = {3 * se1:.4f}",
            source="arithmetic",
            ref="lecture, the max of n normals: 'Φ(1) = 84%'" + TORCH_ONLY.format(x=""),
        ),
        Claim(
            "pool-exceeds-1",
            "a 2×2 max pool's output exceeds 1 with probability 1 − Φ(1)⁴ ≈ 50%",
            0.50,
            0.005 + 3 * se4,
            f"the lecture prints two digits (±0.005), plus 3 s.e. √(p(1−p)/{n_s}) = {3 * se4:.4f}",
            source="arithmetic",
            ref="lecture, the max of n normals: 'all four only 50% of the time' (Φ(1)⁴ of torch's draws "
            "through the library's max pool, which no correct max pool misses)",
        ),
        Claim(
            "moves-right",
            f"the mean of the max grows with n = {setup['ns']}",
            True,
            0,
            "the steps (≥ 0.15 between these n) are > 100 s.e.",
            kind="equal",
            source="arithmetic",
            ref="lecture, the max of n normals: it moves right as n grows" + TORCH_ONLY.format(x=" and max"),
        ),
        Claim(
            "narrows",
            f"the std of the max shrinks with n = {setup['ns']}",
            True,
            0,
            "the steps (≥ 0.05 between these n) are > 50 s.e.",
            kind="equal",
            source="arithmetic",
            ref="lecture, the max of n normals: it narrows as n grows" + TORCH_ONLY.format(x=" and max"),
        ),
    ]
    for n in setup["ns"]:
        mean, std, kurt = max_moments(int(n))
        se_m = std / math.sqrt(n_s)
        se_s = std * math.sqrt((kurt - 1) / 4) / math.sqrt(n_s)
        claims += [
            Claim(
                f"mean-n{n}",
                f"mean of the max of {n} N(0, 1) = {mean:.4f}",
                mean,
                3 * se_m,
                f"3 s.e. σ/√{n_s} = {3 * se_m:.2g}",
                source="identity",
                ref="the exact moment, integrating n φ Φ^(n−1) with scipy.integrate.quad, against torch's "
                "randn and max: a property of the normal distribution, sampled",
            ),
            Claim(
                f"std-n{n}",
                f"std of the max of {n} N(0, 1) = {std:.4f}",
                std,
                3 * se_s,
                f"3 s.e. σ·√((κ − 1)/4)/√{n_s} = {3 * se_s:.2g} (κ = {kurt:.2f}, by integration)",
                source="identity",
                ref="the exact moment, integrating n φ Φ^(n−1) with scipy.integrate.quad, against torch's "
                "randn and max: a property of the normal distribution, sampled",
            ),
        ]
    return claims


@experiment(
    "max-normals",
    title="the max of n normals moves right and narrows; Φ(1)⁴ = 50% of 2×2 max pools exceed 1",
    order=4.5,
    setup=MAX_SETUP,
    quick=MAX_QUICK,
    claims=_max_claims,
)
def max_normals(ctx: Context) -> None:
    n_s = ctx["samples"]
    check_int(n_s, "--set samples", 100)
    gen = torch.Generator().manual_seed(ctx["seed"])
    x = torch.randn(n_s, generator=gen)
    ctx.check("phi-1", (x <= 1).double().mean().item(), theory=phi(1.0))
    windows = torch.randn(n_s, 1, 2, 2, generator=gen)  # (N, C=1, 2, 2): one window per sample
    pooled = create_pool("max", 2)(windows).reshape(-1)
    ctx.check("pool-exceeds-1", (pooled > 1).double().mean().item(), theory=1 - phi(1.0) ** 4)
    means, stds = [], []
    for n in ctx["ns"]:
        m = torch.randn(n_s, int(n), generator=gen).max(dim=1).values.double()
        means.append(m.mean().item())
        stds.append(m.std().item())
        ctx.check(f"mean-n{n}", means[-1], theory=max_moments(int(n))[0])
        ctx.check(f"std-n{n}", stds[-1], theory=max_moments(int(n))[1])
    order_ok = list(ctx["ns"]) == sorted(set(ctx["ns"]))
    ctx.check("moves-right", order_ok and all(a < b for a, b in zip(means, means[1:])), theory=True)
    ctx.check(
        "narrows",
        order_ok and all(a > b for a, b in zip(stds, stds[1:])),
        theory=True,
        note="n: mean/std " + ", ".join(f"{n}: {m:.3f}/{s:.3f}" for n, m, s in zip(ctx["ns"], means, stds)),
    )
