"""Experiments 1.5, 1.6, 3.5 and 17.5: the rules behind the init, the weight's uses and BatchNorm.

    He init       W ~ N(0, 2/fan_in),  fan_in = C_in · k² = 32 · 9 = 288:  E[w²] = 2/288 = 0.00694
                  (torch's default Conv2d init, kaiming_uniform(a=√5), gives 1/(3 · fan_in) = 0.00116)
    C_in ≠ C_out  p = ReLU(x), x ~ N(0, 1), y = conv3×3(p), upstream g ~ N(0, 1) at y:
                  forward   E[y²]          = C_in · k² · σ_W² · ½
                  backward  E[(∂L/∂x)²]    = C_out · k² · σ_W² · ½      (½: the ReLU passes half)
                  fan_in  mode σ_W² = 2/(C_in k²):  forward 1,  backward C_out/C_in
                  fan_out mode σ_W² = 2/(C_out k²): forward C_in/C_out,  backward 1
    uses          a conv weight multiplies one input at every output position of every image:
                  B · H · W products; on the lecture's 512 digits, block 1 at 14 × 14: 512 · 14 · 14 =
                  100,352, and blocks 2–3 at 7 × 7: 512 · 7 · 7 = 25,088.
                  Counted by autograd: with an all-ones input and a ones upstream gradient,
                  ∂L/∂w_tap = Σ over outputs of the input it meets = the number of real (non-padding)
                  inputs it multiplies. The centre tap never meets padding ('same' padding, stride 1):
                  its count is every output position; a corner tap meets padding on one row and column.
    BatchNorm     running ← (1 − m) · running + m · batch statistic, m = 0.1 (variance: unbiased),
                  an exponential average, not the cumulative mean of the batches seen.
    folding       eval BN after a conv: y = γ (W∗x + b − μ)/√(σ² + ε) + β
                  = (s W)∗x + (s (b − μ) + β),  s = γ/√(σ² + ε) per output channel.

Sampled quantities carry a tolerance of 3 standard errors (stated per claim); exact identities are
checked against float32 rounding.
"""

from __future__ import annotations

import math
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.models import ResidualCNN
from gatepool.utils.checks import check_int

# ----------------------------------------------------------------------------- helpers (tested directly)


def weight_uses(batch: int, size: int, kernel: int = 3, channels: int = 2) -> torch.Tensor:
    """(C_out, C_in, k, k): how many real inputs each weight of a 'same'-padded stride-1 conv multiplies.

    Autograd of ``conv(ones)`` with a ones upstream gradient: ∂L/∂w = Σ_outputs x = a count.
    """
    conv = nn.Conv2d(channels, channels, kernel, padding=kernel // 2, bias=False)
    x = torch.ones(batch, channels, size, size)  # (B, C, H, W)
    y = conv(x)
    (grad,) = torch.autograd.grad(y, conv.weight, grad_outputs=torch.ones_like(y))
    return grad


def ema(values: list[float], momentum: float, start: float) -> float:
    """The exponential average ``r ← (1 − m) r + m v`` over ``values``, in float64."""
    r = float(start)
    for v in values:
        r = (1.0 - momentum) * r + momentum * float(v)
    return r


def feed_batchnorm(
    means: list[float], channels: int, batch: int, size: int, seed: int
) -> tuple[nn.BatchNorm2d, list[torch.Tensor]]:
    """A fresh ``nn.BatchNorm2d`` (momentum 0.1) fed batches whose per-channel means are exactly ``means``.

    Returns the module and each batch's unbiased per-channel variance (what torch's running_var averages).
    """
    gen = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(channels).train()
    variances = []
    for mu in means:
        z = torch.randn(batch, channels, size, size, generator=gen, dtype=torch.float64)
        z = z - z.mean(dim=(0, 2, 3), keepdim=True)  # exact zero mean per channel
        x = (z + mu).float()  # (B, C, H, W), batch mean = mu up to float32 rounding
        variances.append(x.double().var(dim=(0, 2, 3), unbiased=True))
        with torch.no_grad():
            bn(x)
    return bn, variances


def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """The conv that equals ``bn(conv(x))`` in eval mode: W ← s·W, b ← s·(b − μ) + β, s = γ/√(var + ε)."""
    folded = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        bias=True,
    )
    with torch.no_grad():
        s = bn.weight / torch.sqrt(bn.running_var + bn.eps)  # (C_out,)
        bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
        folded.weight.copy_(conv.weight * s.view(-1, 1, 1, 1))
        folded.bias.copy_(s * (bias - bn.running_mean) + bn.bias)
    return folded


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


# ----------------------------------------------------------------------------- 1.5 he-init

HE_SETUP = {"channels": 32, "kernel": 3, "seed": 0}


def _he_claims(setup: dict) -> list[Claim]:
    n = setup["channels"] ** 2 * setup["kernel"] ** 2  # 9,216 weights
    fan_in = setup["channels"] * setup["kernel"] ** 2
    se_normal = (2 / fan_in) * math.sqrt(2 / n)  # Var(w²) = 2σ⁴ for w ~ N(0, σ²)
    se_uniform = (1 / (3 * fan_in)) * math.sqrt(4 / 5 * 9 / 4 - 1) / math.sqrt(n)  # w ~ U(−b, b)
    why = f"3 s.e. of the mean of {n} squared weights: s.e. = σ²·√(2/{n}) = {se_normal:.2g}"
    return [
        Claim(
            "he-torch",
            "E[w²] of torch's kaiming_normal_ (fan_in, relu) on a Conv2d(32, 32, 3) = 2/288 = 0.0070",
            0.0070,
            3 * se_normal + 0.00005,
            why + ", plus half a unit of the printed 0.0070",
            depends=("channels", "kernel"),
            source="arithmetic",
            ref="lecture, He init: 'E[w²] = 2/288 = 0.0070' (torch's own kaiming_normal_: its definition, "
            "sampled; he-block is the library's init)",
        ),
        Claim(
            "he-block",
            "E[w²] of the library's block conv (ResidualCNN block1.conv1) = 2/288 = 0.0070",
            0.0070,
            3 * se_normal + 0.00005,
            why + ", plus half a unit of the printed 0.0070",
            depends=("channels", "kernel"),
            source="lecture",
            ref="lecture, He init: 'E[w²] = 2/288 = 0.0070'",
        ),
        Claim(
            "he-exact",
            "E[w²] of kaiming_normal_ against the unrounded 2/288 = 0.006944",
            2 / 288,
            3 * se_normal,
            why,
            depends=("channels", "kernel"),
            source="ours",
            ref="2/288 unrounded: the lecture's 0.0070 is 0.00694 rounded up (four decimals give 0.0069)",
        ),
        Claim(
            "torch-default",
            "torch's default Conv2d init (kaiming_uniform, a = √5) is not He: E[w²] = 1/(3·288) = 0.00116",
            1 / (3 * 288),
            3 * se_uniform,
            f"3 s.e. of the mean of {n} squared U(−b, b) weights: s.e. = (b²/3)·√(4/5·9/4 − 1)/√{n} "
            f"= {se_uniform:.2g}",
            depends=("channels", "kernel"),
            source="ours",
            ref="torch's documented default bound b = 1/√fan_in, E[w²] = b²/3: a contrast, not the lecture's",
        ),
    ]


@experiment(
    "he-init",
    title="He init: E[w²] = 2/288 on a real Conv2d(32, 32, 3)",
    order=1.5,
    setup=HE_SETUP,
    claims=_he_claims,
)
def he_init(ctx: Context) -> None:
    c, k = ctx["channels"], ctx["kernel"]
    fan_in = c * k * k
    torch.manual_seed(ctx["seed"])
    conv = nn.Conv2d(c, c, k, padding=k // 2, bias=False)
    default_e2 = conv.weight.detach().pow(2).mean().item()  # torch's default init, before He
    nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="relu")
    e2 = conv.weight.detach().pow(2).mean().item()
    ctx.check(
        "he-torch",
        e2,
        theory=2 / fan_in,
        note=f"2/{fan_in} = {2 / fan_in:.6f} prints as {2 / fan_in:.4f} at four decimals; "
        "the lecture's 0.0070 is inside the sampling bar either way",
    )
    ctx.check("he-exact", e2, theory=2 / fan_in)
    torch.manual_seed(ctx["seed"])
    if c % 8 == 0 and k == 3:
        block = ResidualCNN(width=c).block1.conv1.weight.detach()
        ctx.check("he-block", block.pow(2).mean().item(), theory=2 / fan_in)
    ctx.check("torch-default", default_e2, theory=1 / (3 * fan_in))
    ctx.note(
        f"{c * c * k * k} weights: He E[w²] = {e2:.6f} (2/{fan_in} = {2 / fan_in:.6f}); "
        f"torch's default {default_e2:.6f}"
    )


# ----------------------------------------------------------------------------- 1.6 he-fan-mode

FAN_SETUP = {"c_in": 16, "c_out": 64, "batch": 64, "size": 16, "seeds": [0, 1, 2, 3, 4, 5, 6, 7]}
FAN_QUICK = {"batch": 16, "seeds": [0, 1, 2, 3]}
# One init's E[y²] moves with the realized weights: E[y²] = fan_in·σ_W²·(E[p²] + μ²·(χ̄² − 1)) with
# μ = E[p] = 1/√(2π) and χ̄² the mean over C_out channels of (Σw)²/Σw², a χ²₁ of s.d. √2: per init the
# relative s.d. is 2·μ²·√2/√C_out = 5.6% at C_out = 64 (fan_out mode: the same, times C_in/C_out on the
# value); the backward sees only Σw² (zero-mean g): relative s.d. √(2/n_weights) = 1.5%.


TORCH_INIT = (" (torch's own kaiming_normal_ and Conv2d on random draws, no code of ours: the rule's "
              "expectation sampled, as he-torch; he-block holds the library's init to the lecture)")


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
            source="ours",
            ref=f"C_out/C_in for our {setup['c_in']}→{setup['c_out']} conv (the lecture gives the rule only)",
        ),
        Claim(
            "fan-out-forward",
            f"fan_out mode scales the forward by C_in/C_out = {1 / ratio:g}",
            1 / ratio,
            tol_f,
            why_f,
            kind="rel",
            depends=dep,
            source="ours",
            ref=f"C_in/C_out for our {setup['c_in']}→{setup['c_out']} conv (the lecture gives the rule only)",
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


# ----------------------------------------------------------------------------- 3.5 weight-uses

USES_SETUP = {"batch": 512, "sizes": [14, 7], "kernel": 3, "seed": 0}
LECTURE_USES = {14: 100_352, 7: 25_088}  # on the lecture's 512 digits: 512·14·14 and 512·7·7
USES_CONV = {14: "block1.conv1", 7: "block2.conv1"}  # Tuesday's CNN's block convs at 14 × 14 and at 7 × 7


def backward_products(batch: int, seed: int = 0) -> dict[int, dict[str, float]]:
    """Per map size (14: block 1's first conv, 7: block 2's first conv), from one real backward pass of
    Tuesday's CNN (cross-entropy summed over the first ``batch`` MNIST digits): the number of products
    ``g · x`` that make the centre tap's ∂L/∂w of filter 0, channel 0, and how far their sum is from
    autograd's (relative). The products are read off the conv's real input (``F.unfold``, the padding
    included) and the real gradient at its output: ∂L/∂w = Σ over images and positions of g · x.
    """
    from gatepool.data import mnist_batch

    torch.manual_seed(seed)
    model = ResidualCNN()
    convs = {size: model.get_submodule(name) for size, name in USES_CONV.items()}
    seen: dict[int, dict[str, torch.Tensor]] = {size: {} for size in convs}
    hooks = []

    def keep(size: int, inputs: tuple, out: torch.Tensor) -> None:
        seen[size]["x"] = inputs[0].detach()
        out.register_hook(lambda g: seen[size].update(g=g.detach()))  # ∂L/∂(conv output)

    for size, conv in convs.items():
        hooks.append(conv.register_forward_hook(lambda m, a, out, s=size: keep(s, a, out)))
    x, y = mnist_batch(batch)
    try:
        F.cross_entropy(model(x), y, reduction="sum").backward()
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for size, conv in convs.items():
        k, pad = conv.kernel_size[0], conv.padding[0]
        cols = F.unfold(seen[size]["x"], k, padding=pad)  # (B, C_in·k², L)
        centre = (k // 2) * k + k // 2  # channel 0's centre tap
        g = seen[size]["g"][:, 0].reshape(batch, -1)  # (B, L): filter 0's output gradient
        products = (g.double() * cols[:, centre].double()).reshape(-1)  # one product per image and position
        auto = conv.weight.grad[0, 0, k // 2, k // 2].double()
        error = ((products.sum() - auto).abs() / auto.abs()).item()
        out[size] = {"products": products.numel(), "error": error, "map": seen[size]["x"].shape[-1]}
    return out


def _uses_claims(setup: dict) -> list[Claim]:
    claims = []
    for size in setup["sizes"]:
        claims.append(
            Claim(
                f"uses-{size}",
                f"one conv weight of Tuesday's CNN at {size} × {size} "
                f"({USES_CONV.get(size, '?')}) is used at "
                f"every output position of every image: its gradient in a real backward pass on "
                f"{setup['batch']} digits is a sum of {setup['batch']}·{size}² products",
                LECTURE_USES.get(size) if setup["batch"] == 512 else None,
                0,
                "a count; the sum of that many products must give autograd's ∂L/∂w (relative 1e-5), or the "
                "count is not the one the backward sums",
                kind="equal",
                depends=("batch", "sizes"),
                source="lecture",
                ref=f"lecture, weight gradient: {LECTURE_USES.get(size, '?'):,} products per weight "
                f"= 512·{size}·{size} (its 512 digits)",
            )
        )
        claims.append(
            Claim(
                f"corner-real-{size}",
                f"a corner tap meets a real input at {setup['batch']}·{size - 1}·{size - 1} positions only "
                "(the rest of its products are with padding zeros)",
                setup["batch"] * (size - 1) ** 2 if setup["kernel"] == 3 else None,
                0,
                "a count",
                kind="equal",
                depends=("kernel",),
                source="arithmetic",
                ref="'same' padding 1: a corner tap falls on the pad along one row and one column (counted "
                "by autograd of conv(ones): fixed by construction)",
            )
        )
    claims.append(
        Claim(
            "same-for-all",
            "every (C_out, C_in) pair's centre tap has the same count (min = max over the weight tensor)",
            True,
            0,
            "a count",
            kind="equal",
            source="arithmetic",
            ref="the weight is shared: its count does not depend on which filter or channel it sits in "
            "(fixed by construction)",
        )
    )
    return claims


@experiment(
    "weight-uses",
    title="one conv weight, 100,352 products: 512 images · 14 · 14 positions",
    order=3.5,
    setup=USES_SETUP,
    claims=_uses_claims,
)
def weight_uses_experiment(ctx: Context) -> None:
    k = ctx["kernel"]
    if check_int(k, "--set kernel") % 2 == 0:
        raise ValueError(f"--set kernel={k}: must be odd")
    unknown = sorted(set(ctx["sizes"]) - set(USES_CONV))
    if unknown:
        raise ValueError(f"--set sizes: Tuesday's CNN has convs at {sorted(USES_CONV)} only, got {unknown}")
    real = backward_products(check_int(ctx["batch"], "--set batch"), ctx["seed"])
    same = True
    for size in ctx["sizes"]:
        row = real[size]
        matches = row["error"] <= 1e-5
        ctx.check(f"uses-{size}", row["products"] if matches else -1, theory=ctx["batch"] * size * size,
                  note=f"{USES_CONV[size]}: {row['products']:,} products g·x over {ctx['batch']} digits × "
                  f"{row['map']}² positions; their sum vs autograd's ∂L/∂w: relative {row['error']:.1e}"
                  + ("" if matches else " (no match: -1 recorded)"))
        counts = weight_uses(ctx["batch"], size, k)  # (C, C, k, k)
        centre = counts[:, :, k // 2, k // 2]
        same = same and bool(centre.min() == centre.max())
        ctx.check(
            f"corner-real-{size}", int(counts[0, 0, 0, 0].round()), theory=ctx["batch"] * (size - k // 2) ** 2
        )
        ctx.note(f"{size}×{size}: uses per tap (real inputs) {counts[0, 0].int().tolist()}")
    ctx.check("same-for-all", same, theory=True)


# ----------------------------------------------------------------------------- 17.5 batchnorm

BN_SETUP = {"channels": 8, "batch": 32, "size": 6, "means": [float(t) for t in range(1, 11)], "seed": 0}
FLOAT32 = "float32 rounding of values up to ~10 over 10 updates (≈ 1e-6), with a margin"


def _bn_claims(setup: dict) -> list[Claim]:
    return [
        Claim(
            "momentum",
            "one update moves running_mean by m = 0.1 of the way to the batch mean",
            0.1,
            1e-6,
            "float32 rounding of a single update",
            source="arithmetic",
            ref="torch's default BatchNorm momentum: neither the lecture nor the flashcards give 0.1 (the "
            "lecture says the running statistics are an exponential average; ema-mean checks that)",
        ),
        Claim(
            "ema-mean",
            "running_mean = the exponential average (m = 0.1) of the batch means "
            "(largest |difference| over channels)",
            0.0,
            1e-5,
            FLOAT32,
            kind="max",
            source="ours",
            ref="the lecture's EMA computed in float64; the bar is float32 rounding",
        ),
        Claim(
            "ema-var",
            "running_var = the exponential average of the unbiased batch variances "
            "(largest relative |difference|)",
            0.0,
            1e-5,
            FLOAT32,
            kind="max",
            source="ours",
            ref="torch's documented update with the unbiased variance; the bar is float32 rounding",
        ),
        Claim(
            "not-cumulative",
            "running_mean is not the cumulative mean of the batches "
            "(smallest |running − cumulative| over channels, must exceed 1e-3)",
            1e-3,
            0.0,
            "100× the float32 bar of ema-mean",
            kind="min",
            source="ours",
            ref="the contrast with an average over all batches (torch's momentum=None)",
        ),
        Claim(
            "fold",
            "BN folded into the previous conv gives the same eval outputs "
            "(largest |difference| / largest |output|)",
            0.0,
            1e-5,
            "float32 rounding (rtol 1e-5, as gatepool.analysis.symmetry.default_tolerance)",
            kind="max",
            source="ours",
            ref="the fold is an identity; the bar is float32 rounding",
        ),
    ]


@experiment(
    "batchnorm",
    title="BatchNorm's running statistics: an exponential average (m = 0.1); folding it into the conv",
    order=17.5,
    setup=BN_SETUP,
    claims=_bn_claims,
)
def batchnorm(ctx: Context) -> None:
    means, c = ctx["means"], ctx["channels"]
    if not means:
        raise ValueError("--set means: give at least one mean")
    bn1, _ = feed_batchnorm(means[:1], c, ctx["batch"], ctx["size"], ctx["seed"])
    m_hat = (bn1.running_mean.double() / means[0]).mean().item() if means[0] else None
    ctx.check("momentum", m_hat, theory=0.1)
    bn, variances = feed_batchnorm(means, c, ctx["batch"], ctx["size"], ctx["seed"])
    running = bn.running_mean.double()
    expected_mean = ema(means, 0.1, 0.0)
    ctx.check("ema-mean", (running - expected_mean).abs().max().item(), theory=0.0)
    var_ema = torch.ones(c, dtype=torch.float64)
    for v in variances:
        var_ema = 0.9 * var_ema + 0.1 * v
    ctx.check("ema-var", ((bn.running_var.double() - var_ema).abs() / var_ema).max().item(), theory=0.0)
    cumulative = statistics.fmean(means)
    ctx.check(
        "not-cumulative",
        (running - cumulative).abs().min().item(),
        theory=1e-3,
        note=f"running_mean {running.mean().item():.5f}, EMA formula {expected_mean:.5f}, "
        f"cumulative mean {cumulative:.5f}",
    )

    gen = torch.Generator().manual_seed(ctx["seed"] + 1)
    torch.manual_seed(ctx["seed"])
    conv = nn.Conv2d(3, c, 3, padding=1, bias=True)
    with torch.no_grad():  # γ, β away from their defaults so the fold has something to fold
        bn.weight.copy_(torch.rand(c, generator=gen) + 0.5)
        bn.bias.copy_(torch.randn(c, generator=gen))
    bn.eval()
    x = torch.randn(4, 3, 10, 10, generator=gen)
    with torch.no_grad():
        ref = bn(conv(x))
        err = (fold_batchnorm(conv, bn)(x) - ref).abs().max().item() / ref.abs().max().item()
    ctx.check("fold", err, theory=0.0)
