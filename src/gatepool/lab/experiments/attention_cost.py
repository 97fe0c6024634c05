"""Experiment 17: what attention costs. One gate per (query, key) pair per head per layer:

    gates = t²,        bytes = t² · bytes_per_value

12×12 tokens (144) → 2.1·10⁴ gates; 24×24 (576) → 3.3·10⁵; a 224×224 image cut into 16×16 patches
(196 tokens) → 3.8·10⁴; every pixel of it (50,176 tokens) → 2.5·10⁹, about 10 GB at 4 bytes.
Patches cut that by (224²/196)² = 16⁴ = 65,536.

The counts come from ``gatepool.analysis.attention_maps.attention_cost``; for token counts up to
``materialize_max`` they are confirmed by materialising the gate: random queries and keys of that size
go through our ``scaled_dot_product_attention(..., return_weights=True)``, and the weights it returns are
counted (``numel`` and ``numel · element_size`` bytes). Larger gates are arithmetic only (50,176² float32
values would need 10 GB). ``--set tokens=...`` takes other counts (theory: t²).
"""

from __future__ import annotations

import math

import torch

from gatepool.analysis.attention_maps import attention_cost, plot_attention_cost
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.layers.attention import scaled_dot_product_attention

LECTURE_GATES = {144: 2.1e4, 576: 3.3e5, 196: 3.8e4, 50176: 2.5e9}
TWO_DIGITS = "the lecture prints two significant digits: ± half a unit in the second one"


def _half_unit(value: float) -> float:
    """Half a unit in the second significant digit of ``value`` (2.1e4 → 500)."""
    return 0.5 * 10 ** (math.floor(math.log10(value)) - 1)


def _label(t: int, image: int, patch: int) -> str:
    if t == image * image:
        return f"{image}×{image} pixels"
    if patch > 0 and image % patch == 0 and t == (image // patch) ** 2:
        return f"{image}² in {patch}×{patch} patches"
    r = math.isqrt(t)
    return f"{r}×{r} tokens" if r * r == t else f"{t} tokens"


def _claims(setup: dict) -> list[Claim]:
    image, patch, bpv = setup["image"], setup["patch"], setup["bytes_per_value"]
    claims = [
        Claim(f"gates-{t}", f"gates per head per layer for {t} tokens ({_label(t, image, patch)}) = t²",
              LECTURE_GATES.get(t), _half_unit(LECTURE_GATES[t]) if t in LECTURE_GATES else 0.0,
              TWO_DIGITS if t in LECTURE_GATES else "exact: off the lecture's counts the theory is t²")
        for t in setup["tokens"]
    ]
    claims += [
        Claim(f"weights-bytes-{t}", f"the materialised gate of {t} tokens (float32) holds t²·4 bytes",
              None, 0, "exact: a count of stored values", kind="equal")
        for t in setup["tokens"] if t <= setup["materialize_max"]
    ]
    claims += [
        Claim(f"bytes-{image * image}", f"every pixel of {image}×{image} as a token: bytes of one gate "
              f"matrix at {bpv} bytes per value", 1e10, 0.5e9,
              "the lecture says 'about 10 GB': to the GB, ±0.5 GB",
              depends=("image", "bytes_per_value")),
        Claim("patch-saving", f"{patch}×{patch} patches cut the gates of a {image}×{image} image by "
              "(pixels per patch)²", 65000, 1000,
              "the lecture says 'about 65,000', i.e. to the thousand (16⁴ = 65,536)",
              depends=("image", "patch")),
    ]
    return claims


def materialized_gate(tokens: int, *, dim: int = 16, seed: int = 0) -> torch.Tensor:
    """The (1, 1, t, t) float32 gate that our attention materialises for t random queries and keys."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, tokens, dim, generator=gen) for _ in range(3))  # (B, H, T, d)
    _, weights = scaled_dot_product_attention(q, k, v, return_weights=True)  # (1, 1, T, T)
    return weights


@experiment("attention-cost", order=17,
            title="attention holds t² gates per head per layer; patches make images affordable",
            setup={"tokens": [144, 576, 196, 50176], "image": 224, "patch": 16, "bytes_per_value": 4,
                   "materialize_max": 1024},
            claims=_claims)
def attention_cost_experiment(ctx: Context) -> None:
    image, patch, bpv = ctx["image"], ctx["patch"], ctx["bytes_per_value"]
    if not ctx["tokens"] or min(ctx["tokens"]) < 1:
        raise ValueError(f"--set tokens: need one or more positive token counts, got {ctx['tokens']}")
    if image < 1 or patch < 1 or image % patch:
        raise ValueError(f"--set image/patch: the patch must tile the image, got {image=}, {patch=}")
    if bpv < 1:
        raise ValueError(f"--set bytes_per_value: must be ≥ 1, got {bpv}")
    if ctx["materialize_max"] > 8192:
        raise ValueError(f"--set materialize_max: at most 8192 (a 256 MB gate), got {ctx['materialize_max']}")

    rows = []
    for t in ctx["tokens"]:
        arithmetic = attention_cost(t, bytes_per_value=bpv)["gates"]
        if t <= ctx["materialize_max"]:
            w = materialized_gate(t)
            rowsum_err = (w.sum(-1) - 1).abs().max().item()
            measured, how = w.numel(), f"materialised ({tuple(w.shape)}, rows sum to 1 ± {rowsum_err:.1g})"
            ctx.check(f"weights-bytes-{t}", w.numel() * w.element_size(), theory=t * t * 4,
                      note=f"{w.dtype}, {w.element_size()} bytes per value")
            if measured != arithmetic:
                how += f"; attention_cost says {arithmetic}"
        else:
            measured, how = arithmetic, "arithmetic (attention_cost)"
        ctx.check(f"gates-{t}", measured, theory=t * t, note=how)
        rows.append({"tokens": t, "label": _label(t, image, patch), "gates": measured,
                     "source": how.split()[0]})

    pixels, patches = image * image, (image // patch) ** 2
    big = attention_cost(pixels, bytes_per_value=bpv)
    ctx.check(f"bytes-{pixels}", big["bytes"], theory=pixels**2 * bpv,
              note=f"{big['gates']:.3g} gates × {bpv} bytes = {big['bytes'] / 1e9:.3g} GB")
    saving = big["gates"] / attention_cost(patches)["gates"]
    ctx.check("patch-saving", saving, theory=patch**4, note=f"({pixels:,} / {patches:,})² = {saving:,.0f}")
    ctx.data["rows"] = rows

    path = ctx.out / "attention-cost.png"
    plot_attention_cost([(r["label"], r["tokens"]) for r in rows], path, bytes_per_value=bpv)
    ctx.figures.append(str(path))
    for r in rows:
        ctx.note(f"{r['label']}: {r['tokens']:,} tokens → {r['gates']:.3g} gates per head per layer "
                 f"({r['source']})")
