"""Experiment 3.5 ``weight-uses``: a conv weight multiplies one input at every output position of every image.

B · H · W products: on the lecture's 512 digits, block 1 at 14 × 14: 512 · 14 · 14 = 100,352, and
blocks 2–3 at 7 × 7: 512 · 7 · 7 = 25,088. Counted by autograd: with an all-ones input and a ones
upstream gradient, ∂L/∂w_tap = Σ over outputs of the input it meets = the number of real (non-padding)
inputs it multiplies. The centre tap never meets padding ('same' padding, stride 1): its count is every
output position; a corner tap meets padding on one row and column.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.models import ResidualCNN
from gatepool.utils.checks import check_int


def weight_uses(batch: int, size: int, kernel: int = 3, channels: int = 2) -> torch.Tensor:
    """(C_out, C_in, k, k): how many real inputs each weight of a 'same'-padded stride-1 conv multiplies.

    Autograd of ``conv(ones)`` with a ones upstream gradient: ∂L/∂w = Σ_outputs x = a count.
    """
    conv = nn.Conv2d(channels, channels, kernel, padding=kernel // 2, bias=False)
    x = torch.ones(batch, channels, size, size)  # (B, C, H, W)
    y = conv(x)
    (grad,) = torch.autograd.grad(y, conv.weight, grad_outputs=torch.ones_like(y))
    return grad


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
                source="arithmetic",
                ref=f"lecture, weight gradient: {LECTURE_USES.get(size, '?'):,} products per weight "
                f"= 512·{size}·{size} (its 512 digits; batch · size² by construction, checked against "
                "autograd's ∂L/∂w, which any correct conv backward meets)",
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
