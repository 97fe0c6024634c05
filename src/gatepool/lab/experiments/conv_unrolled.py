"""Experiment 2.5: the conv as a matrix, forward and backward, and its tied weights.

    2-D        y[i, j] = Σ_{a,b} W[a, b] · x[i + a − 1, j + b − 1]: nine products, summed
    1-D        y = W x,  W[i, i + k − p] = w_k   (n = 8, fan-in 3, padding p = 1)
               W is 8×8, banded (three diagonals) and tied (each diagonal holds one weight):
               8 + 7 + 7 = 22 non-zeros, 64 − 22 = 42 zeros
    backward   ∂L/∂x = Wᵀ g = conv1d(g, flip(w), padding 1)   (a conv with the flipped filter)
    tied       ∂L/∂w_k = Σ_{i} g_i · x_{i + k − p}: the sum of the untied gradients ∂L/∂W on
               diagonal k; with padding 1 the corner taps meet a real input at 7 of the 8 outputs,
               the middle tap at all 8 (7/8/7)
    1×1 conv   the block's MLP (Linear over the channels, at each position) = Conv2d with 1×1 kernels
               holding the same weights

The matrix is built here from the taps (``unrolled_matrix``) and compared with ``torch.nn.functional``'s
conv1d/conv2d and with autograd; equalities are checked against float32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common import relative_error
from gatepool.layers.blocks import MLP
from gatepool.utils.checks import check_int

# The lecture's filter, (−1, 0, 1) in each row (a vertical-edge detector); its input rows are not quoted in
# any of our references, so the window is ours: products −1, 0, 2, 0, 0, 1, 0, 0, 1 (the window's right
# column minus its left), summing to 3 as the lecture's example does.
WINDOW = [[1.0, 0.0, 2.0], [0.0, 1.0, 1.0], [0.0, 2.0, 1.0]]
FILTER = [[-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0]]
FLOAT32 = "float32 rounding (sums of ≤ 3 products of O(1) values; 1e-6 relative)"

# ----------------------------------------------------------------------------- helpers (tested directly)


def unrolled_matrix(w: torch.Tensor, n: int, padding: int = 1) -> torch.Tensor:
    """(n_out, n): the 1-D conv with taps ``w`` (k,) and zero padding as a banded, tied matrix.

    Differentiable in ``w``: W = Σ_k w_k · E_k, E_k the 0/1 matrix of diagonal k − padding.
    """
    k = w.shape[0]
    n_out = n + 2 * padding - k + 1
    shifts = torch.zeros(k, n_out, n, dtype=w.dtype)
    for tap in range(k):
        for i in range(n_out):
            j = i + tap - padding
            if 0 <= j < n:
                shifts[tap, i, j] = 1.0
    return (w.view(k, 1, 1) * shifts).sum(0)


def tied_gradient(grad_w_matrix: torch.Tensor, k: int, padding: int = 1) -> torch.Tensor:
    """(k,): a tied weight's gradient = the sum of the untied gradients over its diagonal."""
    return torch.stack([torch.diagonal(grad_w_matrix, offset=tap - padding).sum() for tap in range(k)])


def tap_uses(n: int, k: int = 3, padding: int = 1) -> list[int]:
    """How many real inputs each tap multiplies: autograd of conv1d(ones) with a ones upstream gradient."""
    w = torch.zeros(1, 1, k, requires_grad=True)
    y = F.conv1d(torch.ones(1, 1, n), w, padding=padding)
    (g,) = torch.autograd.grad(y, w, grad_outputs=torch.ones_like(y))
    return [int(v) for v in g.reshape(-1).round().tolist()]


def nine_products(window: torch.Tensor, filt: torch.Tensor) -> torch.Tensor:
    """(3, 3): the products W[a, b] · x[a, b] of one output position (cross-correlation, as torch)."""
    return window * filt


def mlp_as_conv(mlp: MLP) -> nn.Sequential:
    """The same MLP as 1×1 convolutions over a (B, C, H, W) map (GELU kind)."""
    if mlp.kind != "gelu":
        raise ValueError("mlp_as_conv: only the GELU MLP")
    convs = []
    for fc in (mlp.fc1, mlp.fc2):
        conv = nn.Conv2d(fc.in_features, fc.out_features, 1)
        with torch.no_grad():
            conv.weight.copy_(fc.weight[:, :, None, None])
            conv.bias.copy_(fc.bias)
        convs.append(conv)
    return nn.Sequential(convs[0], nn.GELU(), convs[1])


# ----------------------------------------------------------------------------- 2.5 conv-unrolled

SETUP = {"length": 8, "kernel": 3, "padding": 1, "channels": 32, "seed": 0}


def _claims(setup: dict) -> list[Claim]:
    n, k, p = setup["length"], setup["kernel"], setup["padding"]
    lecture_setup = (n, k, p) == (8, 3, 1)
    return [
        Claim(
            "nine-products",
            "a 3×3 window times a 3×3 filter: conv2d's output is the sum of the nine products, 3",
            3.0,
            1e-6,
            FLOAT32,
            source="arithmetic",
            ref="the lecture's example: its filter (−1, 0, 1) per row, a window of ours (the lecture's input "
            f"rows are not quoted in our references): {WINDOW}; conv2d = the sum of the products is the "
            "conv's definition",
        ),
        Claim(
            "nine-products-map",
            "on a random 10×10 image, conv2d at every position = the sum of its nine "
            "products (largest relative |difference|)",
            0.0,
            1e-6,
            FLOAT32,
            kind="max",
            source="identity",
            ref="the conv's definition, for any image and filter; the bar is float32 rounding",
        ),
        Claim(
            "matrix-forward",
            "W @ x = F.conv1d(x, w, padding=1) (largest relative |difference|)",
            0.0,
            1e-6,
            FLOAT32,
            kind="max",
            source="identity",
            ref="an identity (the lecture: 'the conv is a banded, tied matrix'); the bar is float32 rounding",
        ),
        Claim(
            "matrix-backward",
            "autograd's ∂L/∂x = Wᵀ g (largest relative |difference|)",
            0.0,
            1e-6,
            FLOAT32,
            kind="max",
            source="identity",
            ref="an identity for any filter and gradient; the bar is float32 rounding",
        ),
        Claim(
            "flipped-filter",
            "Wᵀ g = conv1d(g, flip(w), padding=1): the backward is the conv with the flipped filter",
            0.0,
            1e-6,
            FLOAT32,
            kind="max",
            source="identity",
            ref="an identity (the lecture: 'the backward is the flipped filter'); bar: float32 rounding",
        ),
        Claim(
            "tied",
            "W is banded and tied: every entry is 0 or the tap of its diagonal",
            True,
            0,
            "exact",
            kind="equal",
            source="arithmetic",
            ref="the construction's property, checked entry by entry",
        ),
        Claim(
            "zeros",
            "zeros in the 8×8 W (fan-in 3)",
            50 if lecture_setup else None,
            0,
            "a count",
            kind="equal",
            depends=("length", "kernel", "padding"),
            source="arithmetic",
            ref="lecture, the conv as a matrix: 'W has 50 zeros' (issue #14): a count fixed by the band's "
            "construction, so the lecture's arithmetic, held to the count",
        ),
        Claim(
            "zeros-band",
            "an n×n band of width 3 has n² − (3n − 2) zeros: 64 − 22 = 42",
            (n + 2 * p - k + 1) * n - (k * n - 2) if (k, p) == (3, 1) else None,
            0,
            "a count",
            kind="equal",
            depends=("kernel", "padding"),
            source="arithmetic",
            ref="counting the band: n on the diagonal, n − 1 on each side",
        ),
        Claim(
            "tap-uses",
            "uses per tap with 8 outputs and padding 1 (real inputs met): corner 7, middle 8",
            [7, 8, 7] if lecture_setup else None,
            0,
            "a count",
            kind="equal",
            depends=("length", "kernel", "padding"),
            source="arithmetic",
            ref="counted from the band (a corner tap meets the pad once); issue #14 quotes 7/8/7",
        ),
        Claim(
            "tied-gradient",
            "∂L/∂w_k (autograd of conv1d) = Σ over its uses of the untied ∂L/∂W "
            "(largest relative |difference|)",
            0.0,
            1e-6,
            FLOAT32,
            kind="max",
            source="identity",
            ref="the chain rule for a shared weight, an identity; the bar is float32 rounding",
        ),
        Claim(
            "mlp-1x1",
            "the block's MLP (Linear over channels) = the same weights as 1×1 Conv2d "
            "(largest relative |difference|)",
            0.0,
            1e-6,
            FLOAT32,
            kind="max",
            source="identity",
            ref="an identity (the lecture: 'the block's MLP is a 1×1 conv'); the bar is float32 rounding",
        ),
    ]


@experiment(
    "conv-unrolled",
    title="the conv as a banded, tied matrix: forward W x, backward Wᵀ g = the flipped filter",
    order=2.5,
    setup=SETUP,
    claims=_claims,
)
def conv_unrolled(ctx: Context) -> None:
    n, k, p = ctx["length"], ctx["kernel"], ctx["padding"]
    check_int(n, "--set length")
    check_int(k, "--set kernel")
    check_int(p, "--set padding", 0)
    if n + 2 * p < k:
        raise ValueError(f"--set length={n} kernel={k} padding={p}: no output")
    gen = torch.Generator().manual_seed(ctx["seed"])

    window, filt = torch.tensor(WINDOW), torch.tensor(FILTER)
    image = torch.zeros(1, 1, 5, 5)
    image[0, 0, 1:4, 1:4] = window
    out = F.conv2d(image, filt.view(1, 1, 3, 3))  # (1, 1, 3, 3): the centre position sees the window
    prods = nine_products(window, filt)
    ctx.check(
        "nine-products",
        out[0, 0, 1, 1].item(),
        theory=prods.sum().item(),
        note=f"products {prods.reshape(-1).tolist()}, sum {prods.sum().item():g}",
    )
    img = torch.randn(1, 1, 10, 10, generator=gen)
    filt2 = torch.randn(3, 3, generator=gen)
    ref = F.conv2d(img, filt2.view(1, 1, 3, 3))[0, 0]  # (8, 8)
    by_hand = torch.stack(
        [
            torch.stack([nine_products(img[0, 0, i : i + 3, j : j + 3], filt2).sum() for j in range(8)])
            for i in range(8)
        ]
    )
    ctx.check("nine-products-map", relative_error(by_hand, ref), theory=0.0)

    w = torch.randn(k, generator=gen, requires_grad=True)
    x = torch.randn(n, generator=gen, requires_grad=True)
    W = unrolled_matrix(w, n, p)  # (n_out, n)
    W.retain_grad()
    y = W @ x
    y_ref = F.conv1d(x.view(1, 1, n), w.view(1, 1, k), padding=p).reshape(-1)
    ctx.check("matrix-forward", relative_error(y, y_ref), theory=0.0)
    g = torch.randn(y.shape, generator=gen)
    gx_auto, gw_auto = torch.autograd.grad(y_ref, (x, w), grad_outputs=g)
    gx_mat = W.detach().T @ g
    ctx.check("matrix-backward", relative_error(gx_mat, gx_auto), theory=0.0)
    if y.shape[0] == n:  # the flipped-filter conv with the same padding gives back length n
        flipped = F.conv1d(g.view(1, 1, -1), w.detach().flip(0).view(1, 1, k), padding=k - 1 - p).reshape(-1)
        ctx.check("flipped-filter", relative_error(flipped, gx_mat), theory=0.0)
    Wd = W.detach()
    tied = all(
        Wd[i, j].item() == (w[j - i + p].item() if 0 <= j - i + p < k else 0.0)
        for i in range(Wd.shape[0])
        for j in range(n)
    )
    ctx.check("tied", tied, theory=True)
    zeros = int((Wd == 0).sum())
    band = Wd.shape[0] * n - (k * n - 2) if (k, p) == (3, 1) else None
    ctx.check(
        "zeros",
        zeros,
        theory=band,
        note=f"measured {zeros} zeros in the {Wd.shape[0]}×{n} W: an 8×8 band of width 3 has 64 − 22 = 42; "
        "the lecture's 50 does not fit a fan-in-3 band of this size",
    )
    ctx.check("zeros-band", zeros, theory=band)
    uses = tap_uses(n, k, p)
    ctx.check("tap-uses", uses, theory=uses if (k, p) != (3, 1) else [n - 1, n, n - 1])
    y.backward(g)  # untied gradients ∂L/∂W on every entry, and autograd's own ∂L/∂w
    ctx.check(
        "tied-gradient",
        relative_error(tied_gradient(W.grad, k, p), gw_auto),
        theory=0.0,
        note=f"∂L/∂w = {[round(v, 4) for v in gw_auto.tolist()]}",
    )

    torch.manual_seed(ctx["seed"])
    c = ctx["channels"]
    mlp = MLP(c).eval()
    fmap = torch.randn(2, c, 7, 7, generator=gen)  # (B, C, H, W)
    with torch.no_grad():
        tokens = mlp(fmap.flatten(2).transpose(1, 2))  # (B, HW, C): the Linear over channels
        as_map = tokens.transpose(1, 2).reshape(fmap.shape)
        conv_out = mlp_as_conv(mlp)(fmap)
    ctx.check("mlp-1x1", relative_error(conv_out, as_map), theory=0.0)
