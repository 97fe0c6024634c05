"""Experiment 17.5 ``batchnorm``: BatchNorm's running statistics, and folding BatchNorm into the conv.

    running ← (1 − m) · running + m · batch statistic, m = 0.1 (variance: unbiased):
    an exponential average, not the cumulative mean of the batches seen.
    eval BN after a conv: y = γ (W∗x + b − μ)/√(σ² + ε) + β
                            = (s W)∗x + (s (b − μ) + β),  s = γ/√(σ² + ε) per output channel.

    train BN: y = γ (x − μ)/√(σ² + ε) + β, γ and β learnable per channel (biased σ² of the batch).

Exact identities are checked against float32 rounding.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn as nn

from gatepool.lab.claims import Claim, Context, experiment


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


def affine_error(bn: nn.BatchNorm2d, gen: torch.Generator) -> float:
    """Training-mode ``bn`` on a fresh batch against γ·(x − μ)/√(σ² + ε) + β by hand (float64, biased σ²):
    the largest |difference| over the largest |output|. ``bn``'s running statistics and mode are kept."""
    x = 3 * torch.randn(16, bn.num_features, 5, 5, generator=gen) + 1  # (B, C, H, W)
    state, mode = {k: v.clone() for k, v in bn.state_dict().items()}, bn.training
    with torch.no_grad():
        out = bn.train()(x).double()
    bn.load_state_dict(state)
    bn.train(mode)
    xd = x.double()
    mu, var = xd.mean(dim=(0, 2, 3), keepdim=True), xd.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    gamma, beta = bn.weight.double().view(1, -1, 1, 1), bn.bias.double().view(1, -1, 1, 1)
    ref = gamma * (xd - mu) / torch.sqrt(var + bn.eps) + beta
    return ((out - ref).abs().max() / ref.abs().max()).item()


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
            "affine",
            "in training mode y = γ·(x − μ)/√(σ² + ε) + β per channel, γ and β the module's (C,) parameters "
            "(largest |difference| / largest |output|, γ and β away from their defaults)",
            0.0,
            1e-5,
            "float32 rounding (rtol 1e-5, as gatepool.analysis.symmetry.default_tolerance)",
            kind="max",
            source="arithmetic",
            ref="flashcards, BatchNorm: 'followed by a learnable affine rescaling y = γ x' + β (with γ, β ∈ "
            "R^d)' (torch's BatchNorm2d against that definition, computed by hand in float64: any correct "
            "BatchNorm meets it)",
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
    ctx.check("affine", affine_error(bn, torch.Generator().manual_seed(ctx["seed"] + 2)), theory=0.0)
