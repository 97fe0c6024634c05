"""Experiment 18: the flashcards, each a measured check with its own verdict.

1. ``Var(q·k) = d`` for independent unit-variance entries (a sum of d unit-variance products).
2. A transformer encoder without positions is permutation-equivariant, ``f(π X) = π f(X)``; adding a
   learned positional encoding breaks it (checked with ``gatepool.analysis.symmetry``).
3. A causal mask keeps output i independent of tokens after i: perturb tokens i+1.. and outputs ≤ i
   do not move (without the mask they do).
4. Cross-attention: each query reads the context alone (its output moves when the context changes, and
   not when the other queries do) and ignores the context's order (keys and values are permuted
   together, and a gated average does not care about order).
5. LayerNorm normalizes each sample by itself; BatchNorm in training mode normalizes by the batch's
   statistics (a sample's output depends on the rest of the batch), in eval mode by its running ones.
6. The four norms average over: BatchNorm (N, H, W), LayerNorm (C, H, W), InstanceNorm (H, W),
   GroupNorm (channels of a group, H, W):  ``y = (x − mean) / √(var + ε)``, biased variance, ε = 1e-5.
   Computed by hand in float64 and compared with torch's modules.
7. Residual connections keep the gradient at the input of a deep stack (32 blocks, and the flashcards'
   L ≫ 100: ResNet-152's 152 blocks, in float64) at initialization:
   ``∂(x + f(x))/∂x = I + ∂f/∂x``, so an identity path survives any depth, while the plain stack multiplies
   32 Jacobians. Measured for three block kinds, all with their default initialization: a Linear–ReLU–Linear
   MLP (no norm), the pre-norm transformer block (``gatepool.layers.blocks.EncoderBlock``, skips removed: the
   same weights run as ``mlp(norm2(attn(norm1(x))))``) with a GELU MLP and with the SwiGLU MLP of the block
   the lecture previews, and Tuesday's pre-activation conv block
   (GroupNorm inside). Neither document gives a size: our bar is log10(‖∇x‖ residual / ‖∇x‖ plain) ≥ 2.
   A norm inside every block rescales the plain stack's signal at each norm, so there the contrast can
   shrink or even reverse (the plain stack's gradient explodes); the verdicts say which, per kind.

Equalities are checked as the largest difference relative to the output's largest magnitude, against
float32 rounding (rtol 1e-5, as ``gatepool.analysis.symmetry.default_tolerance``); the contrasts ("breaks",
"depends") must exceed 100× that rounding tolerance, a bar of ours (the flashcards give no number).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch
import torch.nn as nn

from gatepool.analysis.symmetry import PermuteTokens, equivariance_error, invariance_error
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common import relative_error
from gatepool.lab.common.flashcard_checks import FAR, FAR_WHY, ROUNDING, RTOL
from gatepool.layers.attention import MultiHeadAttention
from gatepool.layers.blocks import Encoder, EncoderBlock
from gatepool.layers.positional import LearnedPositionalEmbedding1d
from gatepool.models.residual_cnn import PreActBlock
from gatepool.utils.checks import check_int
from gatepool.utils.threads import num_threads

FAR_REF = ("the flashcards say it 'breaks' / 'depends' / 'moves' without a number: 100× the float32 rounding "
           "tolerance (1e-3 relative) is our bar")
NORMS = ("batch", "layer", "instance", "group")
BLOCKS = ("mlp", "transformer", "swiglu", "preact")


def _claims(setup: dict) -> list[Claim]:
    d, n = setup["d"], setup["samples"]
    var_tol = 4 * math.sqrt((2 + 6 / d) / n)
    claims = [
        Claim("var-qk", f"Var(q·k) = d for unit-variance entries (d = {d}, {n:,} samples)", float(d),
              round(var_tol, 4), "4 standard errors of a sample variance: Var(s²)/d² = (2 + 6/d)/n for "
              "q·k a sum of d products of normals (E[(q·k)⁴] = 3d² + 6d)", kind="rel",
            source="arithmetic",
            ref="flashcards: Var(q·k) = d for unit-variance entries (torch's randn alone, no code of ours: "
            "an identity of the normal distribution, sampled)",
        ),
        Claim("encoder-equivariant", "an encoder without positions is permutation-equivariant: "
              "max|f(πX) − πf(X)| / max|f(X)|", 0.0, RTOL, ROUNDING, kind="max",
            source="arithmetic",
            ref="flashcards: an encoder without positions is permutation-equivariant (the library's encoder, "
            "any weights: exact by construction up to rounding, a definition checked; "
            "positions-break-equivariance is the contrast that could fail)",
        ),
        Claim("positions-break-equivariance", "a learned positional encoding (its init, N(0, 0.02²)) breaks "
              "it: max|f(πX) − πf(X)| / max|f(X)|", FAR, 0.0, FAR_WHY, kind="min",
            source="ours",
            ref=FAR_REF,
        ),
        Claim("causal-future-independent", "causal mask: outputs ≤ i do not move when tokens > i change "
              "(largest relative change over every i, fast and plain paths)", 0.0, RTOL, ROUNDING,
              kind="max",
            source="arithmetic",
            ref="flashcards: a causal mask keeps output i blind to the tokens after i (the library's mask, "
            "any weights: exact by construction up to rounding, a definition checked)",
        ),
        Claim("unmasked-sees-future", "without the mask they do (smallest relative change over i)", FAR, 0.0,
              FAR_WHY, kind="min",
            source="ours",
            ref=FAR_REF,
        ),
        Claim("cross-attention-query-local", "cross-attention: a query's output does not move when the other "
              f"queries change ({setup['tokens']} queries, {setup['context_tokens']} context tokens; largest "
              "relative change)", 0.0, RTOL, ROUNDING, kind="max",
            source="ours",
            ref="what cross-attention is: each query's output is that query's read of the context",
        ),
        Claim("cross-attention-follows-context", "and every query's output moves when the context changes "
              "(smallest relative change over the queries)", FAR, 0.0, FAR_WHY, kind="min",
            source="ours",
            ref=FAR_REF,
        ),
        Claim("cross-attention-context-order", "cross-attention ignores the context's order: "
              "max|f(X, πC) − f(X, C)| / max|f|", 0.0, RTOL, ROUNDING, kind="max",
            source="arithmetic",
            ref="flashcards: cross-attention ignores the order of the context (any weights: exact by "
            "construction up to rounding, a definition checked)",
        ),
        Claim("layernorm-batch-independent", "LayerNorm: a sample's output does not depend on the rest "
              "of the batch", 0.0, RTOL, ROUNDING, kind="max",
            source="arithmetic",
            ref="flashcards: LayerNorm normalizes each sample by itself (torch's LayerNorm by definition)",
        ),
        Claim("batchnorm-train-batch-dependent", "BatchNorm in training mode: it does", FAR, 0.0, FAR_WHY,
              kind="min",
            source="ours",
            ref=FAR_REF,
        ),
        Claim("batchnorm-eval-batch-independent", "BatchNorm in eval mode (running statistics): it does not",
              0.0, RTOL, ROUNDING, kind="max",
            source="arithmetic",
            ref="flashcards: BatchNorm in eval mode uses its running statistics (torch's BatchNorm by "
            "definition)",
        ),
    ]
    axes = {"batch": "N, H, W", "layer": "C, H, W", "instance": "H, W", "group": "group, H, W"}
    claims += [Claim(f"norm-axes-{k}", f"{k} norm = (x − mean) / √(var + ε) over ({axes[k]}), "
                     "by hand vs torch", 0.0, RTOL, ROUNDING + "; the hand computation is float64",
                     kind="max",
        source="arithmetic",
        ref="flashcards: the axes each norm averages over (torch's norms against their definition: any "
        "correct norm meets it; norm-axes-distinct is the check that could fail)",
    ) for k in NORMS]
    claims.append(Claim("norm-axes-distinct", "no other flashcard axis set reproduces a norm (smallest "
                        "relative difference off the diagonal)", FAR, 0.0, FAR_WHY, kind="min",
        source="ours",
        ref=FAR_REF,
    ))
    claims += [Claim(f"residual-gradient-{b}", f"{b} blocks: without skips the input gradient of "
                     f"{setup['residual_depth']} blocks vanishes: log10(‖∇x‖ with skips / ‖∇x‖ without) ≥ 2 "
                     f"at init (median of {setup['residual_seeds']} seeds); a negative value means the plain "
                     "stack's gradient explodes instead",
                     2.0, 0.0, "a bar of ours: two orders of magnitude", kind="min",
        source="ours",
        ref="the flashcards say residual connections keep the gradient of a deep stack; neither they nor the "
        "lecture give a size, so the bar (two orders of magnitude, in the direction of vanishing) is ours; "
        "a stack whose plain gradient explodes is off, and the note says so",
    )
               for b in setup["residual_blocks"]]
    claims += [Claim(f"residual-deep-{b}", f"{b} blocks, at the flashcards' depth L ≫ 100 "
                     f"({setup['residual_deep']} blocks): with skips the gradient still reaches the "
                     f"input: log10(‖∇x‖ / ‖∂L/∂y‖) ≥ −2 at init (median of {setup['residual_seeds']} seeds; "
                     "float64)",
                     -2.0, 0.0, "a bar of ours: the input gradient within two orders of magnitude of the "
                     "output's, as the residual-gradient claims' two orders", kind="min",
        source="ours",
        ref="flashcards, residual connections: 'gradients still flow back through the identity skip. This is "
        "what lets very deep stacks (e.g. ResNet-152, modern transformers with L ≫ 100) be trained'; the "
        "depth is ResNet-152's, the bar ours (neither document gives a size)",
    ) for b in setup["residual_blocks"]]
    return claims


def var_qk(d: int, n: int, gen: torch.Generator) -> float:
    q = torch.randn(n, d, generator=gen, dtype=torch.float64)  # (n, d)
    k = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return (q * k).sum(-1).var().item()


def _encoder(ctx: Context):
    return Encoder(ctx["dim"], ctx["depth"], ctx["heads"], mlp="gelu").eval()


def permutation_checks(ctx: Context, x: torch.Tensor) -> tuple[float, float]:
    """(relative equivariance error without positions, with a learned positional encoding)."""
    enc = _encoder(ctx)
    pos = LearnedPositionalEmbedding1d(x.shape[1], x.shape[2])
    perm = PermuteTokens(dim=1, seed=ctx["seed"] + 1)
    with torch.no_grad():
        scale_plain, scale_pos = enc(x).abs().max().item(), enc(pos(x)).abs().max().item()
    plain = equivariance_error(enc, x, perm) / scale_plain
    with_pos = equivariance_error(lambda z: enc(pos(z)), x, perm) / scale_pos
    return plain, with_pos


@torch.no_grad()
def causal_checks(ctx: Context, x: torch.Tensor, gen: torch.Generator) -> tuple[float, float]:
    """(largest relative change of outputs ≤ i with the mask, smallest without), over i = 0..T−2.

    Variant i of x has its tokens after i redrawn; all T − 1 variants run as one batch.
    """
    enc = _encoder(ctx)
    b, t, d = x.shape
    variants = x.repeat(t - 1, 1, 1, 1)  # (T−1, B, T, D)
    for i in range(t - 1):
        variants[i, :, i + 1 :] += torch.randn(b, t - i - 1, d, generator=gen)  # change the future only
    paths = {
        "fast": lambda z, causal: enc(z, is_causal=causal),
        "plain": lambda z, causal: enc(z, is_causal=causal, return_weights=True)[0],
    }
    masked, unmasked = 0.0, math.inf
    for f in paths.values():
        for causal in (True, False):
            y = f(x, causal)  # (B, T, D)
            moved = f(variants.reshape(-1, t, d), causal).reshape(t - 1, b, t, d)
            changes = [relative_error(moved[i, :, : i + 1], y[:, : i + 1]) for i in range(t - 1)]
            if causal:
                masked = max(masked, *changes)
            else:
                unmasked = min(unmasked, *changes)
    return masked, unmasked


def cross_attention_checks(ctx: Context, x: torch.Tensor, gen: torch.Generator) -> tuple[float, float, float]:
    """Cross-attention of ``x`` (B, N, D) over a context (B, M, Dc): (largest relative change of query i's
    output when the other queries are redrawn, smallest relative change of a query's output when the
    context is redrawn, relative change when the context is permuted)."""
    ctx_dim = ctx["dim"] // 2 + 4  # a context of another width and length
    attn = MultiHeadAttention(ctx["dim"], ctx["heads"], context_dim=ctx_dim).eval()
    context = torch.randn(x.shape[0], ctx["context_tokens"], ctx_dim, generator=gen)  # (B, M, Dc)
    n = x.shape[1]
    with torch.no_grad():
        out = attn(x, context=context)  # (B, N, D)
        if out.shape != x.shape:
            raise AssertionError(f"cross-attention gave {tuple(out.shape)} for queries {tuple(x.shape)}")
        others = torch.randn(n, *x.shape, generator=gen)  # (N, B, N, D): variant i redraws all but query i
        idx = torch.arange(n)
        others[idx, :, idx] = x.transpose(0, 1)  # query i kept in variant i
        moved = attn(others.reshape(-1, n, x.shape[2]), context=context.repeat(n, 1, 1)).reshape(
            n, *out.shape
        )
        local = max(relative_error(moved[i, :, i], out[:, i]) for i in range(n))
        new_context = attn(x, context=torch.randn(context.shape, generator=gen))  # (B, N, D)
        follows = min(relative_error(new_context[:, i], out[:, i]) for i in range(n))
    err = invariance_error(lambda c: attn(x, context=c), context, PermuteTokens(dim=1, seed=ctx["seed"] + 2))
    return local, follows, err / out.abs().max().item()


@torch.no_grad()
def batch_dependence(gen: torch.Generator) -> dict[str, float]:
    """Sample 0's output in two batches that differ in every other sample (and alone, for LayerNorm)."""
    c, h, w = 6, 5, 5
    x = torch.randn(8, c, h, w, generator=gen) * 2 + 1  # (N, C, H, W)
    other = torch.cat([x[:1], torch.randn(7, c, h, w, generator=gen) * 3 - 1])  # same sample 0, new rest
    ln = nn.LayerNorm([c, h, w])
    bn = nn.BatchNorm2d(c, momentum=None)  # momentum None: running stats = the average over batches seen
    ln_out = ln(x)[:1]
    ln_err = max(relative_error(ln(other)[:1], ln_out), relative_error(ln(x[:1]), ln_out))
    bn.train()
    bn_train = relative_error(bn(other)[:1], bn(x)[:1])
    for _ in range(3):  # give the running statistics values that are not the initial 0 and 1
        bn(torch.randn(16, c, h, w, generator=gen) * 2 + 1)
    bn.eval()
    bn_eval_out = bn(x)[:1]
    bn_eval = max(relative_error(bn(other)[:1], bn_eval_out), relative_error(bn(x[:1]), bn_eval_out))
    return {"layer": ln_err, "batch-train": bn_train, "batch-eval": bn_eval}


def normalize_over(x: torch.Tensor, kind: str, groups: int, eps: float = 1e-5) -> torch.Tensor:
    """(x − mean) / √(var + ε) over the flashcard's axes for ``kind``, by hand, in float64."""
    n, c, h, w = x.shape
    x = x.double()
    if kind == "group":
        g = x.reshape(n, groups, c // groups, h, w)
        mean = g.mean(dim=(2, 3, 4), keepdim=True)
        var = ((g - mean) ** 2).mean(dim=(2, 3, 4), keepdim=True)
        return ((g - mean) / torch.sqrt(var + eps)).reshape(n, c, h, w)
    dims = {"batch": (0, 2, 3), "layer": (1, 2, 3), "instance": (2, 3)}[kind]
    mean = x.mean(dim=dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)  # biased, as the norms use
    return (x - mean) / torch.sqrt(var + eps)


@torch.no_grad()
def norm_axes(gen: torch.Generator, groups: int = 3) -> dict[str, dict[str, float]]:
    """Relative difference between each torch norm (rows) and each hand computation (columns)."""
    n, c, h, w = 8, 6, 5, 5
    # per-sample scales, per-channel offsets and scales: every axis set gives different statistics
    scale_c, shift_c = torch.linspace(0.5, 3, c).view(1, c, 1, 1), torch.linspace(-2, 2, c).view(1, c, 1, 1)
    scale_n = torch.linspace(0.5, 2, n).view(n, 1, 1, 1)
    x = (torch.randn(n, c, h, w, generator=gen) * scale_c + shift_c) * scale_n  # (N, C, H, W)
    modules = {
        "batch": nn.BatchNorm2d(c, affine=False).train(),  # training mode: the batch's statistics
        "layer": nn.LayerNorm([c, h, w], elementwise_affine=False),
        "instance": nn.InstanceNorm2d(c),
        "group": nn.GroupNorm(groups, c, affine=False),
    }
    outs = {k: m(x) for k, m in modules.items()}
    return {k: {j: relative_error(outs[k], normalize_over(x, j, groups)) for j in NORMS} for k in NORMS}


def _stack(kind: str, depth: int, seed: int, dtype: torch.dtype = torch.float32
           ) -> tuple[Callable, Callable, torch.Tensor]:  # fmt: skip
    """(with skips, without skips, an input) for ``depth`` blocks of ``kind`` at their default init, in
    ``dtype`` (float64 keeps a deep plain stack's vanishing gradient from underflowing)."""
    torch.manual_seed(seed)
    if kind == "mlp":
        blocks = [nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)) for _ in range(depth)]
        x = torch.randn(16, 64)  # (B, D)
        branch = lambda b, z: b(z)  # noqa: E731
    elif kind in ("transformer", "swiglu"):  # swiglu: the block the lecture previews (pre-norm, SwiGLU MLP)
        blocks = [
            EncoderBlock(32, 4, mlp="gelu" if kind == "transformer" else "swiglu") for _ in range(depth)
        ]
        x = torch.randn(4, 16, 32)  # (B, T, D)

        def branch(b, z):  # the block's two sublayers, skips removed
            return b.mlp(b.norm2(b.attn(b.norm1(z))))
    elif kind == "preact":
        blocks = [PreActBlock(8, groups=4) for _ in range(depth)]
        x = torch.randn(4, 8, 8, 8)  # (B, C, H, W)

        def branch(b, z):
            return b.conv2(b.relu2(b.gn2(b.conv1(b.relu1(b.gn1(z))))))
    else:
        raise ValueError(f"--set residual_blocks: each must be one of {BLOCKS}, got {kind!r}")
    blocks = [blk.to(dtype) for blk in blocks]
    x = x.to(dtype)

    def residual(z):
        for b in blocks:
            z = z + branch(b, z)
        return z

    def plain(z):
        for b in blocks:
            z = branch(b, z)
        return z

    return residual, plain, x


def input_gradient_norm(fn: Callable, x: torch.Tensor, seed: int, relative: bool = False) -> float:
    """‖∂L/∂x‖ for L = Σ g ⊙ f(x), g a fixed unit-variance cotangent (``relative``: over ‖g‖ = ‖∂L/∂y‖)."""
    x = x.clone().requires_grad_(True)
    y = fn(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    (grad,) = torch.autograd.grad((y * g).sum(), x)
    return grad.norm().item() / (g.norm().item() if relative else 1.0)


@experiment("flashcards", title="the flashcards, each measured", order=18,
            setup={"d": 64, "samples": 200_000, "tokens": 16, "context_tokens": 10, "dim": 32, "depth": 2,
                   "heads": 4, "residual_blocks": list(BLOCKS), "residual_depth": 32, "residual_deep": 152,
                   "residual_seeds": 5, "seed": 0, "threads": 1},
            quick={"samples": 20_000, "residual_seeds": 3}, claims=_claims)
def flashcards(ctx: Context) -> None:
    for key in ("d", "samples", "tokens", "context_tokens", "dim", "depth", "heads", "residual_depth",
                "residual_deep", "residual_seeds"):
        check_int(ctx[key], f"--set {key}", 2 if key in ("samples", "tokens", "context_tokens") else 1)
    if ctx["dim"] % ctx["heads"]:
        raise ValueError(f"--set dim/heads: dim={ctx['dim']} must be divisible by heads={ctx['heads']}")
    for kind in ctx["residual_blocks"]:
        if kind not in BLOCKS:
            raise ValueError(f"--set residual_blocks: each must be one of {BLOCKS}, got {kind!r}")
    check_int(ctx["threads"], "--set threads")
    with num_threads(ctx["threads"]):
        _flashcards(ctx)


def _flashcards(ctx: Context) -> None:
    torch.manual_seed(ctx["seed"])  # the modules' init
    gen = torch.Generator().manual_seed(ctx["seed"])

    var = var_qk(ctx["d"], ctx["samples"], gen)
    ctx.check("var-qk", var, theory=float(ctx["d"]), note=f"Var/d = {var / ctx['d']:.4f}")

    x = torch.randn(4, ctx["tokens"], ctx["dim"], generator=gen)  # (B, T, D)
    plain, with_pos = permutation_checks(ctx, x)
    ctx.check("encoder-equivariant", plain, theory=0.0)
    ctx.check("positions-break-equivariance", with_pos, theory=FAR,
              note=f"{with_pos / max(plain, 1e-12):.2g}× the error without positions")

    masked, unmasked = causal_checks(ctx, x, gen)
    ctx.check("causal-future-independent", masked, theory=0.0)
    ctx.check("unmasked-sees-future", unmasked, theory=FAR)

    local, follows, order_err = cross_attention_checks(ctx, x, gen)
    ctx.check("cross-attention-query-local", local, theory=0.0)
    ctx.check("cross-attention-follows-context", follows, theory=FAR)
    ctx.check("cross-attention-context-order", order_err, theory=0.0)

    dep = batch_dependence(gen)
    ctx.check("layernorm-batch-independent", dep["layer"], theory=0.0)
    ctx.check("batchnorm-train-batch-dependent", dep["batch-train"], theory=FAR)
    ctx.check("batchnorm-eval-batch-independent", dep["batch-eval"], theory=0.0)

    table = norm_axes(gen)
    for k in NORMS:
        ctx.check(f"norm-axes-{k}", table[k][k], theory=0.0)
    off = min(table[k][j] for k in NORMS for j in NORMS if j != k)
    ctx.check("norm-axes-distinct", off, theory=FAR)
    ctx.data["norm_axes"] = table
    ctx.note("norm vs hand axes (relative max difference; rows torch, columns by hand): "
             + "; ".join(f"{k}: " + ", ".join(f"{table[k][j]:.1e}" for j in NORMS) for k in NORMS))

    grads = {}
    for kind in ctx["residual_blocks"]:
        rows = []
        for s in range(ctx["residual_seeds"]):
            residual, plain_fn, xin = _stack(kind, ctx["residual_depth"], ctx["seed"] + s)
            g_res = input_gradient_norm(residual, xin, s)
            g_plain = input_gradient_norm(plain_fn, xin, s)
            rows.append({"seed": ctx["seed"] + s, "with_skips": g_res, "without": g_plain,
                         "log10_ratio": math.log10(g_res / g_plain) if g_plain > 0 else math.inf})
        grads[kind] = rows
        logs = [r["log10_ratio"] for r in rows]
        med = statistics.median(logs)
        ctx.check(f"residual-gradient-{kind}", med if math.isfinite(med) else None, theory=2.0,
                  note=("the plain stack's gradient underflowed to 0; " if math.isinf(med) else "")
                  + ("without skips the gradient grows instead (it explodes, it does not vanish); "
                     if med < 0 else "")
                  + f"log10 ratio per seed {', '.join(f'{v:.2f}' for v in logs)}; ‖∇x‖ with skips "
                       f"{statistics.median(r['with_skips'] for r in rows):.3g}, without "
                       f"{statistics.median(r['without'] for r in rows):.3g} (medians)")
    ctx.data["residual_gradients"] = grads

    deep = {}
    for kind in ctx["residual_blocks"]:
        rows = []
        for s in range(ctx["residual_seeds"]):
            residual, plain_fn, xin = _stack(kind, ctx["residual_deep"], ctx["seed"] + s, torch.float64)
            rows.append({"seed": ctx["seed"] + s,
                         "with_skips": math.log10(input_gradient_norm(residual, xin, s, relative=True)),
                         "without": math.log10(max(input_gradient_norm(plain_fn, xin, s, relative=True),
                                                   1e-300))})
        deep[kind] = rows
        ctx.check(f"residual-deep-{kind}", statistics.median(r["with_skips"] for r in rows), theory=-2.0,
                  note="log10(‖∇x‖/‖∂L/∂y‖) per seed with skips "
                  + ", ".join(f"{r['with_skips']:.2f}" for r in rows) + "; without skips "
                  + ", ".join(f"{r['without']:.1f}" for r in rows))
    ctx.data["residual_deep"] = deep
