"""Experiments 4.5, 5.5, 6.5 and 7.5: the max of n normals, two pools backward, the skewed stream, the head.

    Φ(1)           P(x ≤ 1) = 0.8413 for x ~ N(0, 1)  ("84%")
    2×2 max pool   P(max ≤ 1) = Φ(1)⁴ = 0.5010: half the outputs exceed 1 ("50%")
    max of n       density n φ(x) Φ(x)^(n−1): as n grows (1, 2, 4, 9, 16) the mean moves right and the
                   spread narrows (exact moments by numerical integration, ``scipy.integrate.quad``)
    two max pools  only the winner of each 2×2 window gets the gradient, twice: 1 input in 16 gets a
                   non-zero gradient, and E[(∂L/∂x)²] = E[g²]/16 (÷4 per pool, compounding)
    the stream     on real digits the values of Tuesday's CNN are right-skewed after each pool and block,
                   skew = E[(x − μ)³]/σ³ > 0 (a max keeps the large values; the residual carries them on);
                   the stem before it (a conv with random-sign filters) has no sign of its own
    the head       forward, GroupNorm → ReLU → mean over 49 positions narrows each channel to a tight bump
                   (at least the ÷49 of independent positions: measured on real digits);
                   backward from the logits (unit-variance g) through Linear(32, 10) → mean over 49
                   positions → ReLU → GroupNorm, the lecture's ideal chain:
                       ×10/32 (= 0.31: fan_out · E[w²] with E[w²] = 1/32)
                       ÷49²   (each of the 49 positions gets g/49)
                       ×½     (the ReLU passes the half of its inputs that are positive)
                       ÷2.68  (GroupNorm divides by its input's σ: the rules' ideal σ² after block 3)
                   = 0.31/2401 · ½ / 2.68 = 24.3e-6 at block 3's output. Each factor is measured as the
                   ratio of E[(∂L/∂·)²] after and before its module, with autograd, through the real head
                   (each seed's init) fed the lecture's ideal stream: i.i.d. N(0, 2.68) values of block 3's
                   shape for 512 images. On real digits (``*-digits``, ours) the stream is block 3's
                   measured output (σ² ≈ 4.5, right-skewed): the ReLU passes less than ½ and GroupNorm
                   divides by more than 2.68.

Sampled claims carry 3 standard errors (each claim's ``why`` says how it is computed).
"""

from __future__ import annotations

import math
import statistics
from functools import cache

import torch
import torch.nn.functional as F

from gatepool.data import mnist_batch
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.layers import create_pool
from gatepool.models import ResidualCNN
from gatepool.utils.checks import check_int

STAGES = ["stem", "pool1", "block1", "pool2", "block2", "block3"]

# ----------------------------------------------------------------------------- helpers (tested directly)


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


def skewness(x: torch.Tensor) -> float:
    """E[(x − μ)³]/σ³ over every value of ``x`` (float64)."""
    d = x.double().reshape(-1)
    d = d - d.mean()
    return (d.pow(3).mean() / d.pow(2).mean().pow(1.5)).item()


def two_max_pools(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, ∂L/∂x) through two 2×2 max pools (the library's ``create_pool('max', 2)``), L = Σ g·out."""
    x = x.clone().requires_grad_(True)
    out = create_pool("max", 2)(create_pool("max", 2)(x))
    (gx,) = torch.autograd.grad(out, x, grad_outputs=g)
    return out.detach(), gx


def head_factors(model: ResidualCNN, images: torch.Tensor, seed: int, stream: torch.Tensor | None = None
                 ) -> dict[str, float]:  # fmt: skip
    """E[(∂L/∂·)²] ratios through the head, unit-variance g at the logits.

    ``stream`` (B, 32, 7, 7): the head's input as given (the lecture's ideal: i.i.d. N(0, 2.68)) instead of
    block 3's output on ``images``.

    fc: at fc's input / at the logits; avg: at the pool's input / at its output; relu: at the ReLU's
    input / at its output; norm: at the norm's output / at its input (the divisor); also the ReLU's share
    of positive inputs, the end-to-end ratio (block 3's output / the logits) and, forward, how much the
    average pool narrows each channel (:func:`narrowing`).
    """
    head = model.head
    with torch.no_grad():
        feat = images
        for name in STAGES if stream is None else ():
            feat = getattr(model, name)(feat)  # ends as (B, 32, 7, 7): block 3's output
    feat = (feat if stream is None else stream.clone()).requires_grad_(True)
    a = head.norm(feat)
    b = head.relu(a)
    c = head.pool(b)
    f = head.flatten(c)
    logits = head.fc(f)
    g = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed))
    ga, gb, gf, gfeat = torch.autograd.grad(logits, (a, b, f, feat), grad_outputs=g)

    def e2(t: torch.Tensor) -> float:
        return t.double().pow(2).mean().item()

    return {
        "fc": e2(gf) / e2(g),
        "avg": e2(gb) / e2(gf),
        "relu": e2(ga) / e2(gb),
        "norm": e2(ga) / e2(gfeat),
        "positive": (a > 0).double().mean().item(),
        "chain": e2(gfeat) / e2(g),
        "var": feat.detach().double().var().item(),
        "narrowing": narrowing(b.detach(), c.detach()),
    }


def narrowing(before: torch.Tensor, pooled: torch.Tensor) -> float:
    """How much the head's average pool narrows each channel, averaged over the channels: the variance of
    the ReLU's output (over images and positions) over that of the pooled feature (over images).

    ``before`` (B, C, H, W), ``pooled`` (B, C, 1, 1). A mean of H·W independent positions divides by H·W.
    """
    c = before.shape[1]
    spread = before.double().transpose(0, 1).reshape(c, -1).var(1)  # (C,)
    return (spread / pooled.double().reshape(-1, c).var(0)).mean().item()


# ----------------------------------------------------------------------------- 4.5 max-normals

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
            source="lecture",
            ref="lecture, the max of n normals: 'Φ(1)⁴ = 50%'",
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
                source="ours",
                ref="the exact moment, integrating n φ Φ^(n−1) with scipy.integrate.quad",
            ),
            Claim(
                f"std-n{n}",
                f"std of the max of {n} N(0, 1) = {std:.4f}",
                std,
                3 * se_s,
                f"3 s.e. σ·√((κ − 1)/4)/√{n_s} = {3 * se_s:.2g} (κ = {kurt:.2f}, by integration)",
                source="ours",
                ref="the exact moment, integrating n φ Φ^(n−1) with scipy.integrate.quad",
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


# ----------------------------------------------------------------------------- 5.5 pool-compound

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


# ----------------------------------------------------------------------------- 6.5 stream-skew

NET_SETUP = {"batch": 512, "pool": "max", "seeds": [0, 1, 2, 3, 4]}
NET_QUICK = {"batch": 256, "seeds": [0, 1, 2]}


def _skew_claims(setup: dict) -> list[Claim]:
    claims = []
    claims.append(
        Claim(
            "skew-stem",
            "the stem's output (before any pool: a conv with random-sign filters) has no sign of its own: "
            "its skewness is positive for some seeds' inits and negative for others",
            True,
            0,
            "a direction at each seed (the seeds' values in the note)",
            kind="equal",
            depends=("pool",),
            source="ours",
            ref="a contrast of ours: the lecture speaks of the stream after the pools; a random-sign filter "
            "flips the skew of the digits' strokes",
        )
    )
    for stage in STAGES[1:]:
        claims.append(
            Claim(
                f"skew-{stage}",
                f"the stream after {stage} is right-skewed: the smallest skewness over the seeds > 0",
                0.0,
                0.0,
                "the sign at every seed (the least of the seeds is measured); per-seed values in the note",
                kind="min",
                depends=("pool",),
                source="lecture",
                ref="lecture, the real stream: 'right-skewed', after each pool and block",
            )
        )
    return claims


@experiment(
    "stream-skew",
    title="the real stream is right-skewed: skewness per stage of Tuesday's CNN on MNIST",
    order=6.5,
    setup=NET_SETUP,
    quick=NET_QUICK,
    claims=_skew_claims,
)
def stream_skew(ctx: Context) -> None:
    images, _ = mnist_batch(ctx["batch"])
    skews: dict[str, list[float]] = {s: [] for s in STAGES}
    for seed in ctx["seeds"]:
        torch.manual_seed(seed)
        model = ResidualCNN(pool=ctx["pool"]).eval()
        h = images
        with torch.no_grad():
            for name in STAGES:
                h = getattr(model, name)(h)
                skews[name].append(skewness(h))
    stem = skews["stem"]
    ctx.check("skew-stem", min(stem) < 0 < max(stem), theory=True,
              note="seeds: " + ", ".join(f"{v:.2f}" for v in stem))
    for stage in STAGES[1:]:
        ctx.check(f"skew-{stage}", min(skews[stage]), theory=0.0,
                  note="seeds: " + ", ".join(f"{v:.2f}" for v in skews[stage]))


# ----------------------------------------------------------------------------- 7.5 head-chain

HEAD_IDEAL = 10 / 32 / 49**2 * 0.5 / 2.68  # 24.3e-6
IDEAL_VAR = 2.68  # the rules' ideal σ² after block 3 (network-forward's ideal-block3)


def _head_claims(setup: dict) -> list[Claim]:
    s, b = len(setup["seeds"]), setup["batch"]
    fc_sd = math.sqrt(2 / 320 + 2 / (10 * b))  # realized E[w²] of 320 weights; the batch's g²
    relu_se = 0.5 / math.sqrt(b * 32) / math.sqrt(s)  # ≥ one independent value per (image, channel)
    group = 4 * 49  # values per GroupNorm group (8 groups of 4 channels, 7 × 7)
    ref = "lecture, the head backward, its ideal chain: '×10/32 → .31, ÷49², ×½, ÷2.68'"
    dep = ("pool",)
    return [
        Claim(
            "fc",
            "through Linear(32, 10): ×10/32 = 0.31",
            0.31,
            0.005 + 3 * 0.3125 * fc_sd / math.sqrt(s),
            f"printed digits (±0.005), plus 3 s.e. over {s} inits (per init 0.3125·√(2/320 + 2/(10·{b})))",
            depends=dep,
            source="lecture",
            ref=ref,
        ),
        Claim(
            "avg",
            "through the mean over 49 positions: ÷49² = 1/2401",
            1 / 2401,
            1e-5,
            "exact: each position gets g/49 (float32 rounding)",
            kind="rel",
            depends=dep,
            source="arithmetic",
            ref=ref + " (exact by the mean's definition: any correct average pool meets it)",
        ),
        Claim(
            "relu",
            "through the ReLU on the ideal stream: ×½",
            0.5,
            3 * relu_se,
            f"3 s.e. of a share over ≥ {b}·32 independent values per init and {s} inits",
            depends=dep,
            source="lecture",
            ref=ref,
        ),
        Claim(
            "norm",
            "through GroupNorm on the ideal stream N(0, 2.68): ÷2.68 (the divisor E[g²] out / E[g²] in)",
            IDEAL_VAR,
            0.005 / IDEAL_VAR + 2 / group,
            f"printed digits, plus 2/{group}: a group's {group} values estimate its σ² (GroupNorm's divisor "
            "and its projection are finite-sample)",
            kind="rel",
            depends=dep,
            source="lecture",
            ref=ref,
        ),
        Claim(
            "chain",
            "E[g²] at the head's input / at the logits on the ideal stream = 0.31/2401 · ½ / 2.68 = 24.3e-6",
            24.3e-6,
            0.05 / 24.3 + 3 * fc_sd / math.sqrt(s) + 2 / group,
            "printed digits, plus 3 s.e. of the fc factor over the inits, plus the norm's 2/196",
            kind="rel",
            depends=dep,
            source="lecture",
            ref=ref + " = 24.3e-6",
        ),
        Claim(
            "bump",
            "forward on real digits, the head's GroupNorm → ReLU → mean over the 49 positions narrows the "
            "stream to a tight bump: each channel's variance falls by at least the ÷49 of a mean of 49 "
            "independent positions (variance after the ReLU over images and positions / of the pooled "
            "feature over images, mean over channels and seeds)",
            49.0,
            0.0,
            "a direction, the bar ours for the lecture's words: at least the narrowing of a mean of 49 "
            "independent values (positions that move together narrow less; a max instead of the mean "
            "narrows about 2×)",
            kind="min",
            depends=dep,
            source="lecture",
            ref="lecture, the head forward: its GroupNorm and average pool narrow the stream to a tight bump",
        ),
        Claim(
            "relu-digits",
            "on real digits (block 3's output on MNIST) the ReLU passes less than ½: the stream is "
            "right-skewed, so after GroupNorm fewer than half its values are positive",
            0.5,
            0.0,
            "a direction: below the ideal ½",
            kind="max",
            depends=dep,
            source="ours",
            ref="the lecture's ideal chain assumes a symmetric stream; stream-skew measures the "
                "real one's skew",
        ),
        Claim(
            "norm-digits",
            "on real digits GroupNorm divides by more than the ideal 2.68 (block 3's real σ² is larger)",
            IDEAL_VAR,
            0.0,
            "a direction: above the ideal 2.68",
            kind="min",
            depends=dep,
            source="ours",
            ref="the lecture's measured σ² after block 3 is 4.41, not the ideal 2.68 (network-forward)",
        ),
        Claim(
            "chain-digits",
            "on real digits, E[g²] at block 3's output / at the logits: the lecture's measured 13.3e-6",
            13.3e-6,
            0.4,
            "mean over seeds; one init's E[g²] differs from the next by up to ±40% (as network-backward's "
            "g2-block3)",
            kind="rel",
            quick_tolerance=0.5,
            depends=dep,
            source="ours",
            ref="the lecture's measured 13.3e-6 at block 3 (held as the lecture's claim in "
                "network-backward's "
            "g2-block3); here through the head alone, a consistency check of ours",
        ),
    ]


@experiment(
    "head-chain",
    title="the head's backward: ×10/32, ÷49², ×½, ÷2.68, each factor measured",
    order=7.5,
    setup=NET_SETUP,
    quick=NET_QUICK,
    claims=_head_claims,
)
def head_chain(ctx: Context) -> None:
    images, _ = mnist_batch(ctx["batch"])
    ideal, real = [], []
    for seed in ctx["seeds"]:
        torch.manual_seed(seed)
        model = ResidualCNN(pool=ctx["pool"])
        gen = torch.Generator().manual_seed(10_000 + seed)
        stream = IDEAL_VAR**0.5 * torch.randn(ctx["batch"], model.head.fc.in_features, 7, 7, generator=gen)
        ideal.append(head_factors(model, images, seed, stream=stream))
        real.append(head_factors(model, images, seed))

    def mean(rows: list, key: str) -> float:
        return statistics.fmean(r[key] for r in rows)

    def seeds(rows: list, key: str, fmt: str = ".3f") -> str:
        return "seeds: " + ", ".join(format(r[key], fmt) for r in rows)

    ctx.check("fc", mean(ideal, "fc"), theory=10 / 32, note=seeds(ideal, "fc"))
    ctx.check("avg", mean(ideal, "avg"), theory=1 / 2401, note=seeds(ideal, "avg", ".4e"))
    ctx.check("relu", mean(ideal, "relu"), theory=0.5, note=seeds(ideal, "relu"))
    ctx.check("norm", mean(ideal, "norm"), theory=IDEAL_VAR,
              note=f"{seeds(ideal, 'norm')}; the stream's σ² {mean(ideal, 'var'):.3f}; divisor/σ² = "
              f"{mean(ideal, 'norm') / IDEAL_VAR:.2f}: GroupNorm's backward also removes the "
              f"group mean of the "
              "incoming gradient, and the average pool hands all 49 positions of a channel the same g/49, so "
              "more is removed than the ÷σ² of the lecture's chain counts")
    ctx.check("chain", mean(ideal, "chain"), theory=HEAD_IDEAL,
              note=f"{seeds(ideal, 'chain', '.3g')}; end to end (= the product of the four measured factors)")
    ctx.check("bump", mean(real, "narrowing"), theory=None,
              note=f"{seeds(real, 'narrowing', '.1f')}; on the ideal stream N(0, 2.68) "
              f"{mean(ideal, 'narrowing'):.1f} (GroupNorm's per-image normalization narrows more than ÷49)")
    ctx.check(
        "relu-digits",
        mean(real, "relu"),
        theory=0.5,
        note=f"{seeds(real, 'relu')}; share of positive ReLU inputs {mean(real, 'positive'):.3f}: the "
        "right-skewed stream, normalized to mean 0, has fewer than half of its values above 0",
    )
    ctx.check(
        "norm-digits",
        mean(real, "norm"),
        theory=None,
        note=f"{seeds(real, 'norm')}; the measured σ² of block 3's output (pooled) is "
             f"{mean(real, 'var'):.2f} "
        f"({seeds(real, 'var', '.2f')}), divisor/σ² = {mean(real, 'norm') / mean(real, 'var'):.2f}: "
        "GroupNorm divides by about the real σ² of its input, not the rules' ideal 2.68",
    )
    ctx.check("chain-digits", mean(real, "chain"), theory=None,
              note=f"{seeds(real, 'chain', '.3g')}; the ideal chain's 24.3e-6 assumes σ² = 2.68 "
                   f"and a symmetric "
              "stream")
