"""Experiments 1–3: the variance of the signal through block 1's boxed step, forward and backward.

    p̂ = ReLU(GroupNorm(x)),  ŷ = conv3×3(p̂),  C_in = C_out = 32,  σ_W² = 2/288,  14×14 maps

    forward   E[x̂²] = 1,  E[p̂²] = ½ (mean 1/√(2π) = 0.40, Var ½ − 1/(2π) = 0.34),
              σ²(ŷ) = fan_in · σ_W² · E[p̂²] = 288 · (2/288) · ½ = 1        (away from the border)
    border    an output that sees N of the k² taps gets N/k² of it: corner 4/9, edge 6/9
    backward  E[(∂L/∂p̂)²] = fan_out · σ_W² · E[g²] = 2,  then through the ReLU: ½ · 2 = 1

The lecture's numbers are for x ~ N(0, 1) (the rules' assumption); ``--set input=mnist`` feeds block 1's
real input (the stem and first pool of Tuesday's CNN on MNIST digits) and compares with the same rules.
The step is the library's own (``PreActBlock``'s gn1 → relu1 → conv1, seeded, its He init), so the
claims measure the library's block, not a conv built here. Measurements come from
``gatepool.analysis.probe.measure``; the ideal beside them from
``gatepool.analysis.probe.theory``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import measure, padding_variance_map, relu_moments
from gatepool.data import mnist_batch
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.models import ResidualCNN
from gatepool.models.residual_cnn import PreActBlock
from gatepool.utils.checks import check_int
from gatepool.utils.plotting import pyplot

SETUP = {"batch": 512, "channels": 32, "kernel": 3, "size": 14, "groups": 8, "input": "gaussian", "seed": 0}
QUICK = {"batch": 128}
STEP = ("channels", "kernel", "groups", "input")  # what the lecture's values assume (not batch or seed)
FORWARD_REF = "lecture, block 1's boxed step forward: 288 · (2/288) · ½ = 1 (measured there 0.97)"
PADDING_REF = "lecture, the padding map of the same step: corner 0.44, edge 0.66, middle ≈ 1"
BACKWARD_REF = "lecture, the same step backward: 2.01 after the conv, 1.01 after the ReLU"
SEED_SPREAD = (
    "one init of 32 filters: the realized σ_W² moves σ² by up to ±6% between seeds (0.94–1.03 over seeds 0–3)"
)


def boxed_step(ctx: Context, fresh: bool = False) -> tuple[nn.Sequential, torch.Tensor]:
    """(GroupNorm → ReLU → conv, its input x): the first step of the library's block
    (``PreActBlock``'s gn1, relu1, conv1, with the block's own He init), as the lecture boxes it in block 1.

    ``fresh``: the same step with an input it has not seen (another Gaussian draw, or test digits).
    """
    c, k = ctx["channels"], ctx["kernel"]
    if check_int(k, "--set kernel") % 2 == 0:
        raise ValueError(f"--set kernel={k}: must be odd (padding k//2 keeps the map size)")
    if check_int(c, "--set channels") % ctx["groups"]:
        raise ValueError(f"--set channels={c}: must be a positive multiple of groups={ctx['groups']}")
    torch.manual_seed(ctx["seed"])
    block = PreActBlock(c, groups=ctx["groups"], kernel_size=k)  # the library's block, its He init
    step = nn.Sequential(OrderedDict(gn=block.gn1, relu=block.relu1, conv=block.conv1))
    if ctx["input"] == "gaussian":
        gen = torch.Generator().manual_seed(ctx["seed"] + 1) if fresh else None
        x = torch.randn(ctx["batch"], c, ctx["size"], ctx["size"], generator=gen)  # (B, C, H, W)
    elif ctx["input"] == "mnist":
        model = ResidualCNN(width=c, groups=ctx["groups"])
        digits = mnist_batch(ctx["batch"], "test" if fresh else "train")[0]
        with torch.no_grad():
            x = model.pool1(model.stem(digits))  # (B, C, 14, 14): block 1's input
    else:
        raise ValueError(f"--set input={ctx['input']!r}: choose 'gaussian' or 'mnist'")
    return step, x


class BorderRescale(nn.Module):
    """Scale a ``k × k`` conv's output (padding ``p``) by (k²/N)^½, N = the taps that land on the input.

    ``N`` per position is the conv of an all-ones input with an all-ones filter; a corner of a 3 × 3 conv
    sees N = 4 of 9 taps, so its output is scaled by 1.5 and its variance by 9/4.
    """

    def __init__(self, kernel: int, padding: int):
        super().__init__()
        self.kernel, self.padding = kernel, padding

    def forward(self, y: torch.Tensor) -> torch.Tensor:  # (B, C, H, W)
        ones = y.new_ones((1, 1, *y.shape[-2:]))
        taps = F.conv2d(ones, y.new_ones((1, 1, self.kernel, self.kernel)), padding=self.padding)  # (1,1,H,W)
        return y * (self.kernel**2 / taps).sqrt()


def interior(ctx: Context) -> torch.Tensor:
    """(H, W) bool: positions whose filter sees no padding."""
    k = ctx["kernel"]
    return padding_variance_map(ctx["size"], ctx["size"], k, k // 2) == 1


def ideal_conv_var(step: nn.Sequential, relu_e2: float) -> float:
    """fan_in · E[w²] · E[p̂²] with this conv's realized weights."""
    w = step.conv.weight
    return w[0].numel() * w.pow(2).mean().item() * relu_e2


# ----------------------------------------------------------------------------- 1. conv-forward

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
            depends=STEP, source="lecture", ref=FORWARD_REF,
        ),
        Claim(
            "relu-mean",
            "after ReLU the mean is 1/√(2π) = 0.40",
            0.40,
            0.01,
            "the lecture prints two decimals",
            quick_tolerance=0.02,
            depends=STEP, source="lecture", ref=FORWARD_REF,
        ),
        Claim(
            "relu-variance",
            "after ReLU the variance is ½ − 1/(2π) = 0.34",
            0.34,
            0.01,
            "the lecture prints two decimals",
            quick_tolerance=0.02,
            depends=STEP, source="lecture", ref=FORWARD_REF,
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
    mid = conv.maps["var"][interior(ctx)].mean().item()
    ctx.check(
        "conv-variance",
        mid,
        theory=ideal_conv_var(step, relu.e2),
        note=f"over the whole map (border included) σ² = {conv.forward.var:.3f}; ideal with this init "
        f"{ideal_conv_var(step, relu.e2):.3f}",
    )


# ----------------------------------------------------------------------------- 2. padding-map


@experiment(
    "padding-map",
    title="zero padding: a corner output sees 4 of 9 taps, an edge 6",
    order=2,
    setup=SETUP,
    quick=QUICK,
    claims=[
        Claim(
            "middle",
            "σ²(ŷ) in the middle of the map",
            1.00,
            0.06,
            SEED_SPREAD,
            depends=STEP, source="lecture", ref=PADDING_REF,
        ),
        Claim(
            "edge",
            "σ²(ŷ) on an edge: 6/9 ≈ 0.67 (lecture measured 0.66)",
            0.67,
            0.05,
            SEED_SPREAD + "; fewer positions average",
            depends=STEP, source="lecture", ref=PADDING_REF,
        ),
        Claim(
            "corner",
            "σ²(ŷ) at a corner: 4/9 ≈ 0.44 (lecture measured 0.44)",
            0.44,
            0.05,
            SEED_SPREAD + "; 4 positions",
            quick_tolerance=0.08,
            depends=STEP, source="lecture", ref=PADDING_REF,
        ),
        Claim(
            "corrected-corner",
            "a conv whose outputs are scaled by (k²/N)^½ (×1.5 at a corner): "
            "corner/middle = 1 on a new batch",
            1.0,
            0.12,
            "ratio of two noisy means (the corner's 4 positions: ±6% seed spread on each, doubled)",
            depends=STEP,
            source="ours",
            ref="the lecture says the border's N/k² is corrected by rescaling; the bar 1 is what the "
            "rescaling is for",
        ),
        Claim(
            "corrected-edge",
            "the same rescaled conv: edge/middle = 1 on a new batch",
            1.0,
            0.08,
            "ratio of two noisy means (±6% seed spread on the middle, less on the 48 edge positions)",
            depends=STEP,
            source="ours",
            ref="as corrected-corner",
        ),
    ],
)
def padding_map(ctx: Context) -> None:
    step, x = boxed_step(ctx)
    rep = measure(step, x, backward=None, maps=True)
    measured = rep["conv"].maps["var"]  # (H, W): variance over batch and channels
    k, size = ctx["kernel"], ctx["size"]
    share = padding_variance_map(size, size, k, k // 2).float()  # (H, W): N / k²
    ideal_mid = ideal_conv_var(step, rep["relu"].forward.e2)
    inner = share == 1
    corner = torch.zeros_like(inner)
    corner[[0, 0, -1, -1], [0, -1, 0, -1]] = True
    edge = ~inner & ~corner
    mid_v = measured[inner].mean().item()
    ctx.check("middle", mid_v, theory=ideal_mid)
    ctx.check("edge", measured[edge].mean().item(), theory=ideal_mid * share[edge].mean().item())
    ctx.check("corner", measured[corner].mean().item(), theory=ideal_mid * share[corner].mean().item())
    # The correction as a layer: the conv's outputs scaled by (k²/N)^½, measured on a batch it has not seen
    corrected_step = nn.Sequential(
        OrderedDict([*step.named_children(), ("rescale", BorderRescale(k, k // 2))])
    )
    fresh = boxed_step(ctx, fresh=True)[1]
    corrected = measure(corrected_step, fresh, backward=None, maps=True)["rescale"].maps["var"]
    ctx.check(
        "corrected-corner", corrected[corner].mean().item() / corrected[inner].mean().item(), theory=1.0
    )
    ctx.check("corrected-edge", corrected[edge].mean().item() / corrected[inner].mean().item(), theory=1.0)
    ctx.data["map"] = measured

    fig, axes = pyplot().subplots(1, 3, figsize=(12, 3.8))
    for ax, (title, img) in zip(
        axes,
        [
            ("measured σ²(ŷ)", measured),
            ("theory: σ² · N/k²", ideal_mid * share),
            ("corrected: × k²/N", corrected),
        ],
    ):
        im = ax.imshow(img.numpy(), vmin=0, vmax=max(1.2, float(corrected.max())), cmap="viridis")
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
        for i, j in [(0, 0), (0, size // 2), (size // 2, size // 2)]:
            ax.text(j, i, f"{img[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.suptitle(f"{k}×{k} conv, padding {k // 2}, {size}×{size} map, {ctx['input']} input")
    ctx.figure(fig, "padding-map.png")


# ----------------------------------------------------------------------------- 3. conv-backward


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
