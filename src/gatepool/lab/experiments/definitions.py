"""Experiment 18.1 ``definitions``: the lecture's definitions, each checked on the library's code.

A definition holds for any correct implementation: each claim runs the library's own layer or model and
checks the identity against float32 rounding (the tolerances: :mod:`gatepool.lab.common.flashcard_checks`).

The flashcards define the encoder and decoder blocks post-norm (attention, add + LayerNorm, MLP, add +
LayerNorm). Our blocks are pre-norm by default and post-norm with ``prenorm=False``; the post-norm ones are
traced with torch.fx down to those sub-operations (attention, MLP and LayerNorm kept whole) and the traced
program, each step with the steps it reads, is compared with the flashcards' step by step.
"""

from __future__ import annotations

import inspect
import math
import operator

import torch
import torch.fx as fx
import torch.nn as nn

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common import relative_error
from gatepool.lab.common.flashcard_checks import FAR, FAR_WHY, ROUNDING, RTOL
from gatepool.layers.attention import MultiHeadAttention
from gatepool.layers.blocks import MLP, DecoderBlock, EncoderBlock
from gatepool.models.residual_cnn import PreActBlock
from gatepool.utils.checks import check_int
from gatepool.utils.threads import num_threads

DEFINITION = "a definition, checked on the library's code: any correct implementation meets it"


def _definition_claims(setup: dict) -> list[Claim]:
    def exact(cid: str, statement: str, where: str, source: str = "arithmetic") -> Claim:
        return Claim(cid, statement, 0.0, RTOL, ROUNDING, kind="max", source=source,
                     ref=f"lecture, {where} ({DEFINITION})")

    def far(cid: str, statement: str, why: str) -> Claim:
        return Claim(cid, statement, FAR, 0.0, FAR_WHY, kind="min", source="ours", ref=why)

    def order(cid: str, statement: str, where: str) -> Claim:
        return Claim(cid, statement, 0, 0, "a count of steps: exact", kind="equal", source="arithmetic",
                     ref=f"flashcards, {where} (a structural fact of the library's block, checked in the "
                     "flashcards' order)")

    return [
        exact("sdpa-formula", "scaled_dot_product_attention(q, k, v) = softmax(q kᵀ/√d) v, by "
                              "hand in float64 "
              "(largest relative |difference|)", "the attention formula"),
        exact("sdpa-rows-sum-1", "every row of the gate softmax(q kᵀ/√d) sums to 1 (largest |Σ_j G_ij − 1|)",
              "the attention formula: each query's gates are a softmax, so they sum to 1"),
        exact("one-gate-all-channels", "one gate per (query, key) pair scales every channel of v alike: "
              "scaling channel c of v by 2 moves only channel c of the output, by 2 (largest relative "
              "|difference|)", "attention: one gate per pair, shared by all channels"),
        exact("multihead-concat", "MultiHeadAttention = concat(head_1 .. head_H) W_O with head_h = "
              "softmax(Q_h K_hᵀ/√d_h) V_h, by hand (largest relative |difference|)",
              "multi-head attention: the heads concatenated, then the output projection"),
        order("encoder-order", "a post-norm encoder block (prenorm=False), traced op by op with torch.fx, "
              "runs the flashcards' program: self-attention, add + LayerNorm, MLP, add + LayerNorm, each add "
              "taking the sub-operation's input and output (steps that differ)",
              "'Define a transformer encoder block, listing its four sub-operations'"),
        order("decoder-order", "a post-norm decoder block (prenorm=False), traced the same way, runs the "
              "flashcards' program: masked self-attention, add + LayerNorm, cross-attention to Z, add + "
              "LayerNorm, MLP, add + LayerNorm (steps that differ)",
              "'Define a transformer decoder block, listing its six sub-operations'"),
        exact("residual-identity", "a residual block whose branch is f ≡ 0 (its last conv zeroed) is the "
              "identity: max|block(x) − x| / max|x|", "a residual block is x + f(x): the identity at f ≡ 0"),
        exact("patchify-conv", f"patchify = a stride-{setup['patch']} conv: ViT's patch embedding of a "
              f"{setup['image']}×{setup['image']} image equals each {setup['patch']}×{setup['patch']} patch "
              "flattened times one shared matrix (largest relative |difference|)",
              "the ViT: patchify is a conv with kernel = stride = the patch"),
        Claim("vit-2d-positions", "a ViT with 2-D positions (pos='learned-2d') adds to the patch token at "
              "(row r, col c) the code P(r, c) = row_r + col_c, then prepends the CLS token without one: "
              "embed(x) against patchify(x) + P by hand (largest relative |difference|)", 0.0, RTOL, ROUNDING,
              kind="max", source="arithmetic",
              ref="flashcards, the ViT pipeline: 'Add a 2D positional encoding to each token', then "
              f"'Prepend a CLS token'; x_i' = x_i + P(i) ({DEFINITION})"),
        exact("attention-pool-formula", "the attention gate pool: out = Σ_j softmax(s/τ)_j · V "
                                        "x_j, s_j = x_j · w, "
              "by hand over each 2×2 window (largest relative |difference|)", "the "
                  "attention-pooling formula"),
        exact("conv-linear-in-v", "the conv gate is linear in V: pool(aV + bW) = a·pool(V) + b·pool(W) "
              "(largest relative |difference|)", "'a conv is linear in V, a gate is not'"),
        far("gate-not-linear", "the soft gate is not: pool(aV + bW) ≠ a·pool(V) + b·pool(W) "
                               "(largest relative "
            "|difference|, at least 1e-3)", "the lecture's 'a gate is not [linear in V]': the "
                                            "bar 100× float32 "
            "rounding is ours"),
        Claim("shift-equivariant", "Tuesday's CNN (stem, pool 1, block 1) is shift-equivariant: a digit on a "
              "56×56 canvas shifted by 2 pixels (pool 1's stride) gives the feature map shifted by 1 cell "
              "(largest relative |difference| away from the border)", 0.0, RTOL, ROUNDING, kind="max",
              source="arithmetic", ref="lecture, the CNN's shift equivariance (MNIST digits through the "
              "library's CNN with He init; exact by construction for any weights, up to rounding: convs and "
              "a stride-2 pool commute with a shift by 2, so a definition checked; shift-by-1-breaks is the "
              "contrast that could fail)"),
        far("shift-by-1-breaks", "shifted by 1 pixel (not a multiple of the pool's stride) it is not: the "
            "same difference for the best 1-cell match is at least 1e-3", "a contrast of ours: the pool's "
            "stride 2 makes the net equivariant to shifts by 2 only; the bar 100× float32 rounding is ours"),
    ]


# The flashcards' blocks, post-norm, as programs: each step an operation and the steps (1-based) or
# inputs (X the tokens, Z the encoder output) it reads.
FLASHCARD_ENCODER = (("self-attention", ("X",)), ("add", ("X", 1)), ("LayerNorm", (2,)), ("MLP", (3,)),
                     ("add", (3, 4)), ("LayerNorm", (5,)))  # fmt: skip
FLASHCARD_DECODER = (("masked self-attention", ("X",)), ("add", ("X", 1)), ("LayerNorm", (2,)),
                     ("cross-attention", (3, "Z")), ("add", (3, 4)), ("LayerNorm", (5,)), ("MLP", (6,)),
                     ("add", (6, 7)), ("LayerNorm", (8,)))  # fmt: skip


class _SubOperations(fx.Tracer):
    """torch.fx tracer that stops at the flashcards' sub-operations: attention, MLP and the norms."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (MultiHeadAttention, MLP)) or super().is_leaf_module(m, qualname)


def block_program(block: nn.Module, inputs: tuple[str, ...] = ("x",)) -> list[tuple[str, tuple]]:
    """``block``'s forward as the flashcards write it: the operations on its tensors, in the order they
    run, each with what it reads (``"X"`` / ``"Z"`` for the inputs named ``inputs``, else the 1-based step).
    The forward's other arguments are traced at their defaults (a decoder's ``is_causal=True``)."""
    params = inspect.signature(block.forward).parameters
    if not inputs or any(name not in params for name in inputs) or len(inputs) > 2:
        raise ValueError(f"inputs must name one or two of {type(block).__name__}.forward's arguments "
                         f"{list(params)}, got {inputs}")
    graph = _SubOperations().trace(block, concrete_args={n: p.default for n, p in params.items()
                                                         if n not in inputs})  # fmt: skip
    modules = dict(block.named_modules())
    label = {name: "XZ"[i] for i, name in enumerate(inputs)}
    steps: list[tuple[str, tuple]] = []
    for node in graph.nodes:
        reads = [a for a in node.all_input_nodes if a.name in label]
        if node.op == "placeholder" or not reads:
            continue  # the inputs, and the checks fx adds on the arguments traced at their defaults
        if node.op == "output":
            break
        if node.op == "call_module":
            m = modules[node.target]
            context = node.kwargs.get("context") is not None
            name = (("cross-attention" if context else "masked self-attention" if node.kwargs.get("is_causal")
                     else "self-attention") if isinstance(m, MultiHeadAttention)
                    else "LayerNorm" if isinstance(m, nn.LayerNorm) else type(m).__name__)  # fmt: skip
        else:
            target = node.target
            name = "add" if target is operator.add else str(getattr(target, "__name__", target))
        args = tuple(label[a.name] for a in node.all_input_nodes if a.name in label)
        steps.append((name, _unordered(args) if name == "add" else args))
        label[node.name] = len(steps)
    return steps


def _unordered(args: tuple) -> tuple:
    """An add's operands in one order (the inputs X, Z first, then the steps): a + b = b + a."""
    return tuple(sorted(args, key=lambda a: (isinstance(a, int), str(a).zfill(4))))


def program_differences(steps: list[tuple[str, tuple]], want: tuple[tuple[str, tuple], ...]) -> int:
    """Steps of ``steps`` that are not the flashcards' ``want`` at the same place (adds unordered), plus
    the steps one has more than the other."""
    canon = [(op, _unordered(a) if op == "add" else a) for op, a in want]
    return sum(s != w for s, w in zip(steps, canon)) + abs(len(steps) - len(canon))


def format_program(steps: list[tuple[str, tuple]]) -> str:
    return ", ".join(f"{op}({', '.join(map(str, args))})" for op, args in steps)


def _check_program(ctx: Context, claim_id: str, block: nn.Module, default: nn.Module,
                   want: tuple[tuple[str, tuple], ...], inputs: tuple[str, ...]) -> None:  # fmt: skip
    """The post-norm ``block``'s traced program against the flashcards'; the note gives the trace and how far
    the library's default (pre-norm) block is from the flashcards' order."""
    steps = block_program(block.eval(), inputs)
    prenorm = program_differences(block_program(default.eval(), inputs), want)
    ctx.check(claim_id, program_differences(steps, want), theory=0,
              note=f"traced: {format_program(steps)}; the default pre-norm block differs in {prenorm} steps")


def _trunk(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.block1(model.pool1(model.stem(x)))


@experiment("definitions", title="the lecture's definitions, each checked on the library's code", order=18.1,
            setup={"dim": 32, "heads": 4, "tokens": 10, "image": 224, "patch": 16, "seed": 0, "threads": 1},
            claims=_definition_claims)
def definitions(ctx: Context) -> None:
    from gatepool.data import mnist_batch
    from gatepool.layers import create_pool
    from gatepool.layers.attention import scaled_dot_product_attention
    from gatepool.models import ResidualCNN
    from gatepool.models.vit import ViT

    d, h, t = ctx["dim"], ctx["heads"], ctx["tokens"]
    if d % h:
        raise ValueError(f"--set dim={d}: must be a multiple of heads={h}")
    with num_threads(ctx["threads"]):
        gen = torch.Generator().manual_seed(ctx["seed"])
        torch.manual_seed(ctx["seed"])
        q, k, v = (torch.randn(2, h, t, d // h, generator=gen) for _ in range(3))  # (B, H, T, d)
        out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
        hand = torch.softmax(q.double() @ k.double().transpose(-2, -1) / math.sqrt(d // h), -1) @ v.double()
        ctx.check("sdpa-formula", relative_error(out, hand), theory=0.0)
        ctx.check("sdpa-rows-sum-1", (w.double().sum(-1) - 1).abs().max().item(), theory=0.0)
        v2 = v.clone()
        v2[..., 0] *= 2
        out2 = scaled_dot_product_attention(q, k, v2)
        moved = max(relative_error(out2[..., 0], 2 * out[..., 0]),
                    relative_error(out2[..., 1:], out[..., 1:]))
        ctx.check("one-gate-all-channels", moved, theory=0.0)

        mha = MultiHeadAttention(d, h).eval()
        x = torch.randn(2, t, d, generator=gen)  # (B, T, D)
        with torch.no_grad():
            split = [m(x).view(2, t, h, d // h).transpose(1, 2) for m in (mha.to_q, mha.to_k, mha.to_v)]
            heads = torch.softmax(split[0] @ split[1].transpose(-2, -1) / math.sqrt(d // h), -1) @ split[2]
            by_hand = mha.to_out(heads.transpose(1, 2).reshape(2, t, d))  # concat, then W_O
            ctx.check("multihead-concat", relative_error(mha(x), by_hand), theory=0.0)
        _check_program(ctx, "encoder-order", EncoderBlock(d, h, prenorm=False), EncoderBlock(d, h),
                       FLASHCARD_ENCODER, ("x",))
        _check_program(ctx, "decoder-order", DecoderBlock(d, h, prenorm=False), DecoderBlock(d, h),
                       FLASHCARD_DECODER, ("x", "context"))

        block = PreActBlock(d, groups=8).eval()
        nn.init.zeros_(block.conv2.weight)  # the branch f ≡ 0
        fmap = torch.randn(2, d, 7, 7, generator=gen)
        with torch.no_grad():
            ctx.check("residual-identity", relative_error(block(fmap), fmap), theory=0.0)

        image, patch = ctx["image"], check_int(ctx["patch"], "--set patch")
        if check_int(image, "--set image") % patch:
            raise ValueError(f"--set image={image}: must be a multiple of patch={patch}")
        vit = ViT(image_size=image, patch_size=patch, in_channels=3, dim=d, depth=1, num_heads=h,
                  num_classes=10).eval()
        img = torch.randn(1, 3, image, image, generator=gen)
        with torch.no_grad():
            tokens = vit.patchify(img)  # (1, (image/patch)², D)
            patches = torch.nn.functional.unfold(img, patch, stride=patch).transpose(1, 2)  # (1, L, 3·p²)
            conv = vit.patchify.conv
            linear = patches @ conv.weight.reshape(d, -1).T + conv.bias  # each patch times one matrix
            ctx.check("patchify-conv", relative_error(tokens, linear), theory=0.0,
                      note=f"{tokens.shape[1]} tokens of {d} features from {patch}×{patch} patches")

        c = 4
        xs = torch.randn(2, c, 6, 6, generator=gen, dtype=torch.float64)
        pool = create_pool("attention", 2, channels=c).double().eval()
        with torch.no_grad():
            nn.init.normal_(pool.value.weight, 0.0, 0.5)  # a V other than the identity
            wins = xs.unfold(2, 2, 2).unfold(3, 2, 2).reshape(2, c, 3, 3, 4)  # (N, C, 3, 3, K)
            s = torch.einsum("ncijk,c->nijk", wins, pool.score.weight.reshape(c))  # s_j = x_j · w
            vals = torch.einsum("dc,ncijk->ndijk", pool.value.weight.reshape(c, c), wins)  # V x_j
            hand = (torch.softmax(s, -1).unsqueeze(1) * vals).sum(-1)  # Σ_j softmax(s)_j V x_j
            ctx.check("attention-pool-formula", relative_error(pool(xs), hand), theory=0.0)
            a, b = 1.7, -0.6
            ys = torch.randn(2, c, 6, 6, generator=gen, dtype=torch.float64)
            conv_pool = create_pool("conv", 2, channels=c).double()
            nn.init.normal_(conv_pool.mixing)
            mixed = conv_pool(a * xs + b * ys)
            linear = relative_error(mixed, a * conv_pool(xs) + b * conv_pool(ys))
            ctx.check("conv-linear-in-v", linear, theory=0.0)
            soft = create_pool("soft", 2)
            nonlinear = relative_error(soft(a * xs + b * ys), a * soft(xs) + b * soft(ys))
            ctx.check("gate-not-linear", nonlinear, theory=FAR)

        digits = mnist_batch(8, "test")[0]  # (8, 1, 28, 28)
        canvas = torch.nn.functional.pad(digits, (14, 14, 14, 14), value=float(digits.min()))  # background
        canvas = canvas - canvas.amin(dim=(2, 3), keepdim=True)  # background exactly 0 (stem bias 0)
        torch.manual_seed(ctx["seed"])
        cnn = ResidualCNN().eval()
        base = _trunk(cnn, canvas)  # (8, 32, 28, 28)
        inner = (slice(None), slice(None), slice(3, -3), slice(3, -3))
        by2 = _trunk(cnn, torch.roll(canvas, (2, 2), (2, 3)))  # the digit moves 2 pixels inside the zeros
        shifted = relative_error(by2[..., 1:, 1:][inner], base[..., :-1, :-1][inner])
        ctx.check("shift-equivariant", shifted, theory=0.0)
        by1 = _trunk(cnn, torch.roll(canvas, (1, 1), (2, 3)))
        best = min(relative_error(by1[..., i:, j:][inner] if i or j else by1[inner],
                        base[..., : base.shape[-2] - i, : base.shape[-1] - j][inner])
                   for i in (0, 1) for j in (0, 1))
        ctx.check("shift-by-1-breaks", best, theory=FAR)

        vit2d = ViT(image_size=image, patch_size=patch, in_channels=3, dim=d, depth=1, num_heads=h,
                    num_classes=10, pos="learned-2d").eval()
        pos = vit2d.pos_embedding
        with torch.no_grad():
            for p in (pos.rows, pos.cols, vit2d.cls_token):
                p.copy_(torch.randn(p.shape, generator=gen))  # codes as large as the tokens (init: 0.02)
            side = image // patch
            code = pos.rows[:, None, :] + pos.cols[None, :, :]  # (H, W, D): P(r, c) = row_r + col_c
            hand = torch.cat([vit2d.cls_token[0], vit2d.patchify(img)[0] + code.reshape(side * side, d)])
            ctx.check("vit-2d-positions", relative_error(vit2d.embed(img)[0], hand), theory=0.0,
                      note=f"{side}×{side} patch grid: {side} row and {side} column vectors, the CLS token "
                           "first")  # fmt: skip
        ctx.cite("ViT-H/14 pre-trained on JFT-300M reaches 88.55% ImageNet top-1 and ViT-L/16 87.76%, beside "
                 "BiT-L (ResNet152x4, same data) at 87.54%; pre-trained on ImageNet alone the "
                 "ViTs fall behind "
                 "the ResNets: a ViT needs more data to beat a CNN",
                 "Dosovitskiy et al., 'An image is worth 16x16 words', ICLR 2021, Table 2 and Fig. 3")
