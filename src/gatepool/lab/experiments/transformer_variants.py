"""transformer-variants: the flashcards' six ways to put a transformer together, each built, scored, checked.

One row per variant of the card: its input, architecture and output as the card puts them, the task
score measured here, and the structural property that sets it apart, measured on the model itself:

    encoder-only     ViT (``vit_mnist``, shipped)         digit accuracy; the blocks are permutation-
                                                          equivariant and the CLS readout invariant to
                                                          the order of the patch tokens
    encoder-decoder  ``seq_encoder_decoder``, reversing   greedy token accuracy (trained here, seq-demo's
                     8 digits                             setup); decoder output i ignores targets > i
    decoder-only     ``seq_decoder``, reversing (shipped) greedy token accuracy; output i ignores tokens > i
    dual-encoder     ``dual_encoder`` (CLIP)              zero-shot accuracy from the ten prompts, recall@1
                                                          image→text and text→image; separate towers:
                                                          image i moves row i of the similarity matrix only,
                                                          caption j column j only
    UNet + x-attn    ``cross_attention_unet`` (SD)        share of DDIM samples (guided) the shipped lecture
                                                          CNN reads as the digit asked for; with the context
                                                          swapped for another digit's, the share that follows
                                                          the new prompt; with the cross-attention outputs
                                                          zeroed, ε̂ is the same for any caption
    LM + x-attn      ``flamingo``                         exact-match captions of digit strips, and the text
                                                          LM's perplexity beside the floor of its text;
                                                          at init the model is the LM, bit for bit

Every bar is ours (the card gives no numbers): scores are held to five times chance or more, exact
properties to float32 rounding (or to exact equality, where the property is an identity of the code
path). The full profile trains the three new models (``gatepool.train.variants``) and the
encoder-decoder; the quick profile judges the shipped weights of the three (``gatepool pretrained``,
the full profile's trainings) on smaller test sets and trains the encoder-decoder on seq-demo's quick
schedule. ``--set`` on a training setting trains that model in either profile.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common import relative_error
from gatepool.utils.plotting import pyplot
from gatepool.utils.threads import num_threads

SETUP = {
    "seed": 0, "threads": 1,
    "clip_steps": 1200, "clip_batch": 128, "clip_loss": "clip",
    "unet_steps": 2000, "unet_batch": 64, "ddim_steps": 25, "guidance": 2.0, "samples_per_prompt": 10,
    "lm_steps": 600, "flamingo_steps": 1500, "flamingo_batch": 64,
    "encdec_steps": 2000, "test_size": 2000, "galleries": 100, "captions_test": 500,
}  # fmt: skip
QUICK = {"test_size": 1000, "galleries": 50, "captions_test": 300, "samples_per_prompt": 5,
         "encdec_steps": 400}

# the training settings of each new model: changing one trains that model instead of loading its weights
TRAINING = {
    "dual_encoder": ("seed", "clip_steps", "clip_batch", "clip_loss"),
    "cross_attention_unet": ("seed", "unet_steps", "unet_batch"),
    "flamingo": ("seed", "lm_steps", "flamingo_steps", "flamingo_batch"),
}
SHIPPED = {"dual_encoder": "dual_encoder-s0", "cross_attention_unet": "cross_attention_unet-s0",
           "flamingo": "flamingo-s0"}  # fmt: skip
RTOL = 1e-5
ROUNDING = "float32 rounding: rtol 1e-5 of the output's largest magnitude (as symmetry.default_tolerance)"
CHANCE_WHY = "five times the chance level of ten classes (10%): 'well above chance', a bar of ours"
OURS = "the card names the variant and its setup, without a number: "
IDENTITY = " (an identity for any weights, trained or not: no correct implementation fails it)"

VARIANTS = [  # (id, representative, input, architecture, output): the card's words, shortened
    ("encoder-only", "ViT, BERT, DINO", "image patches / tokens",
     "L blocks of unmasked self-attention; CLS token for classification", "class logits"),
    ("encoder-decoder", "T5, original Transformer, DETR", "source tokens; target tokens so far",
     "encoder makes Z; decoder: masked self-attention, cross-attention with Z, FFN", "next-token logits"),
    ("decoder-only", "GPT, Llama", "tokens so far",
     "one stack of masked self-attention + FFN; next-token head", "next-token logits"),
    ("dual-encoder", "CLIP, SigLIP", "an image and a text",
     "two separate encoders, each pooled into one embedding; similarity ⟨e_I, e_T⟩, contrastive loss",
     "two normalized embeddings"),
    ("unet-cross-attention", "Stable Diffusion UNet", "noisy image z_t, text embedding Z",
     "a UNet with cross-attention layers between convolutions", "predicted noise ε̂"),
    ("lm-cross-attention", "Flamingo", "interleaved text and image features",
     "a decoder-only LM with cross-attention layers inserted between its blocks", "next-token logits"),
]  # fmt: skip


def caption_perplexity_floor(slots: int) -> float:
    """The perplexity of the best possible LM of the captions: 1..slots uniform random digits, each
    caption ``w_1 … w_n EOS`` (n uniform); exp(H / E[tokens]) with H the captions' entropy in nats."""
    entropy = math.log(slots) + (slots + 1) / 2 * math.log(10)  # the length, then the digits
    return math.exp(entropy / ((slots + 1) / 2 + 1))  # E[tokens] = E[n] + 1 (EOS)


def _claims(setup: dict[str, Any]) -> list[Claim]:
    train = lambda name: TRAINING[name]  # noqa: E731
    floor = caption_perplexity_floor(3)
    return [
        Claim("encoder-only-accuracy", "encoder-only: the ViT's test accuracy (shipped vit_mnist, "
              f"{setup['test_size']} test digits)", 0.95, 0.0, "95% is far above chance and short of the "
              "CNN's 99%: a bar of ours", kind="min", depends=("test_size",), source="ours",
              ref=OURS + "an encoder that classifies digits well"),
        Claim("encoder-only-equivariant", "encoder-only: permuting the patch tokens permutes the "
              "encoder's outputs and leaves the CLS token's unchanged: max|f(πX) − πf(X)| / max|f(X)|",
              0.0, RTOL, ROUNDING, kind="max", source="identity",
              ref=OURS + "unmasked self-attention is permutation-equivariant; the CLS readout reads a set"
              + IDENTITY),
        Claim("encoder-decoder-accuracy", "encoder-decoder: greedy token accuracy reversing 8 digits "
              "(seq-demo's task, trained here)", 0.99, 0.0, "seq-demo's bar; quick: its widened tolerance",
              kind="min", quick_tolerance=0.014, depends=("encdec_steps", "seed"), source="ours",
              ref="seq-demo's bar for 'learns it' (99%)"),
        Claim("encoder-decoder-causal", "encoder-decoder: changing target token j leaves the decoder's "
              "outputs before j unchanged: max|Δ| / max|out|", 0.0, RTOL, ROUNDING, kind="max",
              source="identity", ref=OURS + "masked self-attention in the decoder" + IDENTITY),
        Claim("decoder-only-accuracy", "decoder-only: greedy token accuracy reversing 8 digits (shipped "
              "seq_decoder)", 0.99, 0.0, "seq-demo's bar", kind="min", source="ours",
              ref="seq-demo's bar for 'learns it' (99%)"),
        Claim("decoder-only-causal", "decoder-only: changing token j leaves the outputs before j "
              "unchanged: max|Δ| / max|out|", 0.0, RTOL, ROUNDING, kind="max", source="identity",
              ref=OURS + "one stack of masked self-attention" + IDENTITY),
        Claim("dual-zero-shot", "dual encoder: zero-shot accuracy from the ten prompts "
              f"({setup['test_size']} test digits)", 0.5, 0.0, CHANCE_WHY, kind="min",
              depends=(*train("dual_encoder"), "test_size"),
              source="ours", ref=OURS + "zero-shot classification from prompts"),
        Claim("dual-recall-i2t", "dual encoder: recall@1 image → text (galleries of ten pairs, one per "
              "digit, random caption templates)", 0.5, 0.0, CHANCE_WHY, kind="min",
              depends=train("dual_encoder"), source="ours", ref=OURS + "retrieval in both directions"),
        Claim("dual-recall-t2i", "dual encoder: recall@1 text → image (the same galleries)", 0.5, 0.0,
              CHANCE_WHY, kind="min", depends=train("dual_encoder"), source="ours",
              ref=OURS + "retrieval in both directions"),
        Claim("dual-separate-towers", "dual encoder: changing image i moves only row i of the similarity "
              "matrix, changing caption j only column j (largest change elsewhere)", 0.0, 0.0,
              "exact: the towers share no computation", kind="max", source="identity",
              ref=OURS + "two separate encoders" + IDENTITY),
        Claim("unet-follows-prompt", "UNet: share of the generated digits (DDIM, guidance w) the shipped "
              "lecture CNN reads as the prompt's digit", 0.5, 0.0, CHANCE_WHY, kind="min",
              depends=(*train("cross_attention_unet"), "ddim_steps", "guidance"), source="ours",
              ref=OURS + "a text-conditioned denoiser makes what the text asks for"),
        Claim("unet-follows-swapped-context", "UNet: prompts' context swapped for the next digit's (same "
              "noise): share of the samples read as the new digit", 0.5, 0.0, CHANCE_WHY, kind="min",
              depends=(*train("cross_attention_unet"), "ddim_steps", "guidance"), source="ours",
              ref=OURS + "the condition is Z, read through cross-attention"),
        Claim("unet-cross-attention-only", "UNet: with every cross-attention output zeroed, ε̂ for two "
              "different captions (largest difference)", 0.0, 0.0, "exact: the caption has no other path",
              kind="max", source="identity",
              ref=OURS + "the text enters through the cross-attention layers" + IDENTITY),
        Claim("flamingo-exact-match", f"Flamingo: exact-match captions of {setup['captions_test']} strips "
              "of 1-3 test digits, left to right", 0.5, 0.0, "chance is below 1% (10 to 1,000 captions per "
              "length); 50% is a bar of ours", kind="min",
              depends=(*train("flamingo"), "captions_test"), source="ours",
              ref=OURS + "an LM that reads images through cross-attention writes what it sees"),
        Claim("flamingo-equals-lm-at-init", "Flamingo at initialisation (gates 0) vs the text LM: largest "
              "difference of the logits", 0.0, 0.0, "exact: tanh(0) = 0 adds zeros", kind="max",
              source="identity", ref=OURS + "gated cross-attention, tanh gates initialised at 0" + IDENTITY),
        Claim("lm-perplexity", "the text LM's perplexity on held-out captions, beside the floor of their "
              f"distribution ({floor:.3f})", round(floor, 4), 0.05, "within 5% of the best possible LM: "
              "a bar of ours", kind="rel", depends=train("flamingo"), source="ours",
              ref="the LM is pretrained on text alone; its perplexity cannot go below the text's entropy"),
    ]  # fmt: skip


def variant_config(setup: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``gatepool.train.variants`` config of model ``name`` for a setup."""
    from gatepool.train.variants import default_config

    common = dict(seed=setup["seed"], threads=setup["threads"])
    if name == "dual_encoder":
        return default_config(name, steps=setup["clip_steps"], batch_size=setup["clip_batch"],
                              model_kwargs={"loss": setup["clip_loss"]}, **common)  # fmt: skip
    if name == "cross_attention_unet":
        return default_config(name, steps=setup["unet_steps"], batch_size=setup["unet_batch"], **common)
    return default_config(name, steps=setup["flamingo_steps"], lm_steps=setup["lm_steps"],
                          batch_size=setup["flamingo_batch"], **common)  # fmt: skip


def _model(ctx: Context, name: str) -> tuple[torch.nn.Module, str | None]:
    """The model ``name``: the shipped weights (quick, its training settings unchanged), else trained in
    ``<out>/<name>`` (resumed when finished there). Returns (model, shipped name or None)."""
    from gatepool.train.variants import train_variant

    if ctx.quick and ctx.is_lecture(*TRAINING[name]):
        return ctx.shipped(name, SHIPPED[name]), SHIPPED[name]
    model, record = train_variant(variant_config(ctx.setup, name), ctx.out / name, progress=ctx.progress)
    ctx.note(f"{name}: trained {record['parameters']:,} weights for {record['seconds']:.0f} s")
    ctx.data.setdefault("train_seconds", {})[name] = record["seconds"]
    return model, None


@experiment("transformer-variants", title="the flashcards' six transformer variants: built, scored, checked",
            order=21, setup=SETUP, quick=QUICK, claims=_claims)
def transformer_variants(ctx: Context) -> None:
    from gatepool.data import load_dataset

    with num_threads(ctx["threads"]):
        test = load_dataset("mnist", "test")
        rows = {}
        rows["encoder-only"] = _encoder_only(ctx, test)
        rows["encoder-decoder"], rows["decoder-only"] = _sequence_models(ctx)
        rows["dual-encoder"] = _dual_encoder(ctx, test)
        rows["unet-cross-attention"] = _unet(ctx, test)
        rows["lm-cross-attention"] = _flamingo(ctx, test)
    table = []
    for vid, rep, inp, arch, out in VARIANTS:
        score, structure = rows[vid]
        table.append({"variant": vid, "representative": rep, "input": inp, "architecture": arch,
                      "output": out, "score": score, "structure": structure})  # fmt: skip
        ctx.note(f"{vid} ({rep}): input {inp}; {arch}; output {out}. Score: {score}. Structure: {structure}")
    ctx.data["rows"] = table


def _encoder_only(ctx: Context, test: Any) -> tuple[str, str]:
    from gatepool.train import evaluate

    vit = ctx.shipped("vit_mnist", "vit_mnist-n60000-s0")
    n = ctx["test_size"]
    x = test.normalized()[:n]
    acc = evaluate(vit, x, test.labels[:n])["acc"]
    ctx.check("encoder-only-accuracy", acc, shipped_model="vit_mnist-n60000-s0")
    with torch.no_grad():
        t = vit.embed(x[:8])  # (8, 1 + N, D), positions added: the blocks see a set of tokens
        perm = torch.randperm(t.shape[1] - 1, generator=torch.Generator().manual_seed(ctx["seed"])) + 1
        idx = torch.cat([torch.zeros(1, dtype=torch.long), perm])
        out, out_p = vit.encoder(t), vit.encoder(t[:, idx])
    err = relative_error(out_p, out[:, idx])
    cls = relative_error(out_p[:, 0], out[:, 0])
    ctx.check("encoder-only-equivariant", err, note=f"CLS token alone: {cls:.1e}",
              shipped_model="vit_mnist-n60000-s0")  # fmt: skip
    return f"test accuracy {acc:.4f} ({n} digits)", f"permutation-equivariant to {err:.1e}"


def _causal_error(logits_fn: Any, ids: torch.Tensor, j: int) -> tuple[float, float]:
    """(largest relative change before position j, after it) when token j changes."""
    changed = ids.clone()
    changed[:, j] = (changed[:, j] + 1) % 10
    with torch.no_grad():
        a, b = logits_fn(ids), logits_fn(changed)
    return relative_error(b[:, :j], a[:, :j]), relative_error(b[:, j:], a[:, j:])


def _sequence_models(ctx: Context) -> tuple[tuple[str, str], tuple[str, str]]:
    from gatepool.lab.common import seq_task
    from gatepool.models.seq import SEP, EncoderDecoder, make_task_batch
    from gatepool.train.seq import greedy_accuracy, train_seq_demo

    s = {**seq_task.SETUP, **(seq_task.QUICK if ctx.quick else {})}
    r = train_seq_demo(arch="encoder-decoder", task=s["task"], seed=ctx["seed"], length=s["length"],
                       steps=ctx["encdec_steps"], batch_size=s["batch_size"], lr=s["lr"],
                       warmup=min(s["warmup"], ctx["encdec_steps"] // 2),
                       eval_every=s["eval_every"], eval_size=s["eval_size"], target_acc=s["target_acc"],
                       dim=s["dim"], depth=s["depth"], num_heads=s["heads"], threads=ctx["threads"],
                       progress=False, out=ctx.out / "encoder-decoder")  # fmt: skip
    ctx.check("encoder-decoder-accuracy", r["final_token_acc"],
              note=f"{r['steps_run']} steps, {r['time_s']:.0f} s, {r['params']:,} weights")
    x, y = make_task_batch("reverse", 16, 8, torch.Generator().manual_seed(ctx["seed"]))
    torch.manual_seed(ctx["seed"])
    encdec = EncoderDecoder(max_len=17, dim=s["dim"], depth=s["depth"], num_heads=s["heads"]).eval()
    tgt = torch.cat([torch.full_like(y[:, :1], SEP), y[:, :-1]], dim=1)
    before, after = _causal_error(lambda t: encdec(x, t), tgt, 4)
    ctx.check("encoder-decoder-causal", before, note=f"outputs from j on move by {after:.2e} (random "
              "weights: the mask is in the architecture)")  # fmt: skip
    enc = (f"greedy token accuracy {r['final_token_acc']:.4f}", f"outputs before j move by {before:.1e} "
           "when target j changes")  # fmt: skip

    lm = ctx.shipped("seq_decoder", "seq_decoder-reverse-s0")
    card = lm.pretrained_card  # its held-out set: train_seq_demo's, drawn with seed 10000 + seed
    held_x, held_y = make_task_batch(s["task"], card["test_size"], s["length"],
                                     torch.Generator().manual_seed(10_000 + card["seed"]))  # fmt: skip
    acc = greedy_accuracy(lm, held_x, held_y)["test_acc"]
    ctx.check("decoder-only-accuracy", acc, shipped_model="seq_decoder-reverse-s0")
    seq = torch.cat([x, torch.full_like(x[:, :1], SEP), y[:, :-1]], dim=1)
    before, after = _causal_error(lm, seq, 10)
    ctx.check("decoder-only-causal", before, note=f"outputs from j on move by {after:.2e}",
              shipped_model="seq_decoder-reverse-s0")
    return enc, (f"greedy token accuracy {acc:.4f}", f"outputs before j move by {before:.1e}")


def _dual_encoder(ctx: Context, test: Any) -> tuple[str, str]:
    from gatepool.models.digit_text import TEMPLATES, DigitTokenizer, caption

    model, shipped = _model(ctx, "dual_encoder")
    n, g = ctx["test_size"], torch.Generator().manual_seed(1000 + ctx["seed"])
    x, y = test.normalized(), test.labels
    with torch.no_grad():
        pred, sim = model.zero_shot(x[:n])
    acc = (pred == y[:n]).float().mean().item()
    ctx.check("dual-zero-shot", acc, shipped_model=shipped)
    confusion = torch.zeros(10, 10)
    confusion.index_put_((y[:n], pred), torch.ones(n), accumulate=True)
    mean_sim = torch.stack([sim[y[:n] == d].mean(0) for d in range(10)])  # (10 digits, 10 prompts)

    tok, hits_i, hits_t = DigitTokenizer(model.max_len), 0, 0
    by_digit = [torch.nonzero(y == d).flatten() for d in range(10)]
    with torch.no_grad():
        for _ in range(ctx["galleries"]):
            picks = torch.stack([ix[torch.randint(0, len(ix), (1,), generator=g)] for ix in by_digit])[:, 0]
            which = torch.randint(0, len(TEMPLATES), (10,), generator=g).tolist()
            ids = tok.encode([caption(d, TEMPLATES[k]) for d, k in enumerate(which)])
            s = model.encode_image(x[picks]) @ model.encode_text(ids).T  # (10, 10): pair i on the diagonal
            hits_i += (s.argmax(1) == torch.arange(10)).sum().item()
            hits_t += (s.argmax(0) == torch.arange(10)).sum().item()
        gallery = s
        r_i, r_t = hits_i / (10 * ctx["galleries"]), hits_t / (10 * ctx["galleries"])
        ctx.check("dual-recall-i2t", r_i, shipped_model=shipped)
        ctx.check("dual-recall-t2i", r_t, shipped_model=shipped)
        images, z = x[picks], model(x[picks], ids)
        other = images.clone()
        other[3] = x[by_digit[5][0]]
        moved = model(other, ids) - z
        ids2 = ids.clone()
        ids2[6] = tok.encode(caption(2))[0]
        moved2 = model(images, ids2) - z
    outside = max(torch.cat([moved[:3], moved[4:]]).abs().max().item(),
                  torch.cat([moved2[:, :6], moved2[:, 7:]], 1).abs().max().item())  # fmt: skip
    ctx.check("dual-separate-towers", outside, shipped_model=shipped,
              note=f"row 3 moved by up to {moved[3].abs().max():.3f}, column 6 by "
                   f"{moved2[:, 6].abs().max():.3f}")  # fmt: skip
    ctx.data["dual_encoder"] = {"zero_shot": acc, "recall_i2t": r_i, "recall_t2i": r_t,
                                "confusion": confusion.tolist()}  # fmt: skip
    _dual_figure(ctx, confusion, mean_sim, gallery)
    return (f"zero-shot {acc:.4f}, recall@1 image→text {r_i:.3f}, text→image {r_t:.3f}",
            f"off-row / off-column changes {outside:.1e}")  # fmt: skip


def _unet(ctx: Context, test: Any) -> tuple[str, str]:
    from gatepool.models.diffusion import DDPMSchedule
    from gatepool.models.digit_text import PROMPTS, DigitTokenizer
    from gatepool.train.variants import judge_inputs, unet_images

    model, shipped = _model(ctx, "cross_attention_unet")
    judge = ctx.shipped("residual_cnn", "residual_cnn-max-s0")
    k, schedule = ctx["samples_per_prompt"], DDPMSchedule()
    tok = DigitTokenizer(model.text.max_len)
    null = tok.encode("")[0]
    digits = torch.arange(10).repeat_interleave(k)  # (10k,)
    ids = tok.encode(list(PROMPTS))[digits]
    noise = torch.randn((10 * k, 1, model.image_size, model.image_size),
                        generator=torch.Generator().manual_seed(2000 + ctx["seed"]))  # fmt: skip
    kw = dict(steps=ctx["ddim_steps"], guidance=ctx["guidance"], noise=noise)
    with torch.no_grad():
        samples = schedule.ddim_sample(model, ids, null, **kw)
        read = judge(judge_inputs(samples, test.mean, test.std)).argmax(1)
        swapped = (digits + 1) % 10  # the same noise, the next digit's caption as the context
        samples2 = schedule.ddim_sample(model, tok.encode(list(PROMPTS))[swapped], null, **kw)
        read2 = judge(judge_inputs(samples2, test.mean, test.std)).argmax(1)
        real = unet_images(test.images[:1000], model.image_size)
        real_read = judge(judge_inputs(real, test.mean, test.std)).argmax(1)
        ceiling = (real_read == test.labels[:1000]).float().mean().item()
    share = (read == digits).float().mean().item()
    share2 = (read2 == swapped).float().mean().item()
    per = [(read[digits == d] == d).float().mean().item() for d in range(10)]
    ctx.check("unet-follows-prompt", share, shipped_model=shipped,
              note="per prompt: " + ", ".join(f"{d}: {p:.0%}" for d, p in enumerate(per))
              + f"; the judge reads {ceiling:.1%} of real test digits at {model.image_size} pixels a side")
    ctx.check("unet-follows-swapped-context", share2, shipped_model=shipped,
              note=f"{(read2 == digits).float().mean():.0%} still read as the original prompt")

    blind = copy.deepcopy(model)
    for attn in blind.cross_attentions():
        torch.nn.init.zeros_(attn.to_out.weight)
        torch.nn.init.zeros_(attn.to_out.bias)
    x, t = noise[:10], torch.full((10,), 500)
    with torch.no_grad():
        a, b = tok.encode(list(PROMPTS)), tok.encode(list(PROMPTS))[(torch.arange(10) + 3) % 10]
        diff = (blind(x, t, a) - blind(x, t, b)).abs().max().item()
        live = (model(x, t, a) - model(x, t, b)).abs().max().item()
    ctx.check("unet-cross-attention-only", diff, shipped_model=shipped,
              note=f"with the cross-attention in place the two captions' ε̂ differ by up to {live:.3f}")
    ctx.data["unet"] = {"share": share, "per_prompt": per, "swapped_share": share2, "judge_ceiling": ceiling}
    _unet_figure(ctx, samples, read, k)
    return (f"{share:.0%} of the samples read as the prompt ({share2:.0%} follow a swapped context)",
            f"cross-attention zeroed: ε̂ differs by {diff:.1e} between captions")  # fmt: skip


def _flamingo(ctx: Context, test: Any) -> tuple[str, str]:
    from gatepool.models import create_model
    from gatepool.models.digit_strip import make_strips
    from gatepool.models.digit_text import DigitTokenizer, sequence_caption
    from gatepool.models.flamingo import caption_loss
    from gatepool.train.variants import lm_batch

    model, shipped = _model(ctx, "flamingo")
    slots = model.canvas_size[1] // 28
    tok, g = DigitTokenizer(model.max_len), torch.Generator().manual_seed(3000 + ctx["seed"])
    canvas, digits = make_strips(test.images, test.labels, ctx["captions_test"], slots, g)
    with torch.no_grad():
        out = model.generate(canvas)
        got = [tok.digits(o) for o in out]
        exact = sum(a == b for a, b in zip(got, digits)) / len(digits)
        text = lm_batch(2000, slots, tok, g)
        ppl = math.exp(caption_loss(model.lm(text), text).item())
        ids = tok.encode([sequence_caption(d) for d in digits])
        ppl_img = math.exp(caption_loss(model(ids, canvas), ids).item())
        fresh = create_model("flamingo", canvas_size=list(model.canvas_size), max_len=model.max_len,
                             dim=model.lm.embed.embedding_dim, depth=len(model.lm.blocks.blocks)).eval()
        fresh.lm.load_state_dict(model.lm.state_dict())
        init_diff = (fresh(ids[:64], canvas[:64]) - model.lm(ids[:64])).abs().max().item()
    gates = [(math.tanh(b.attn_gate.item()), math.tanh(b.ff_gate.item())) for b in model.xattn]
    ctx.check("flamingo-exact-match", exact, shipped_model=shipped)
    ctx.check("flamingo-equals-lm-at-init", init_diff, shipped_model=shipped,
              note="trained gates tanh(α) (attention, MLP) per layer: "
                   + "; ".join(f"{a:.3f}, {f:.3f}" for a, f in gates))  # fmt: skip
    floor = caption_perplexity_floor(slots)
    ctx.check("lm-perplexity", ppl, theory=floor, shipped_model=shipped,
              note=f"floor {floor:.3f}; Flamingo on the strips' captions, seeing the strips: {ppl_img:.3f}")
    ctx.data["flamingo"] = {"exact": exact, "lm_perplexity": ppl, "perplexity_with_images": ppl_img,
                            "floor": floor, "gates": gates}  # fmt: skip
    _flamingo_figure(ctx, canvas[:8], [tok.decode(o) for o in out[:8]], digits[:8])
    return (f"exact match {exact:.0%}; text LM perplexity {ppl:.3f} (floor {floor:.3f}), with the image "
            f"{ppl_img:.3f}", f"at init max|Flamingo − LM| = {init_diff:.1e}")  # fmt: skip


def _dual_figure(ctx: Context, confusion: torch.Tensor, mean_sim: torch.Tensor, gallery: torch.Tensor
                 ) -> None:  # fmt: skip
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), layout="constrained")
    for ax, m, title, xl in ((axes[0], confusion, "zero-shot confusion (count)", "predicted prompt"),
                             (axes[1], mean_sim, "mean cosine similarity", "prompt 'the digit …'"),
                             (axes[2], gallery, "a gallery: image i vs caption j", "caption j")):  # fmt: skip
        im = ax.imshow(m.numpy(), cmap="viridis")
        ax.set(title=title, xlabel=xl, ylabel="true digit" if ax is not axes[2] else "image i",
               xticks=range(10), yticks=range(10))  # fmt: skip
        fig.colorbar(im, ax=ax, shrink=0.8)
    ctx.figure(fig, "dual-encoder.png")


def _unet_figure(ctx: Context, samples: torch.Tensor, read: torch.Tensor, k: int) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(10, k, figsize=(0.9 * k, 9.5), squeeze=False)
    for i, ax in enumerate(axes.flat):
        d = i // k
        ax.imshow(samples[i, 0].numpy(), cmap="gray", vmin=-1, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(str(int(read[i])), fontsize=7, color="green" if int(read[i]) == d else "red")
        if i % k == 0:
            ax.set_ylabel(f"'{d}'", fontsize=8)
    fig.suptitle("UNet samples per prompt (rows: 'the digit …'; titles: what the lecture CNN reads)",
                 fontsize=8)  # fmt: skip
    ctx.figure(fig, "unet-samples.png")


def _flamingo_figure(ctx: Context, canvas: torch.Tensor, captions: list[str], digits: list[list[int]]
                     ) -> None:  # fmt: skip
    from gatepool.models.digit_text import sequence_caption

    plt = pyplot()
    fig, axes = plt.subplots(4, 2, figsize=(8, 5), squeeze=False, layout="constrained")
    for ax, c, text, d in zip(axes.flat, canvas, captions, digits):
        ax.imshow(c[0].numpy(), cmap="gray")
        ax.set_xticks([])
        ax.set_yticks([])
        ok = text == sequence_caption(d)
        ax.set_title(f"“{text}”" + ("" if ok else f" (true: {sequence_caption(d)})"), fontsize=8,
                     color="green" if ok else "red")  # fmt: skip
    fig.suptitle("Flamingo: strips and their generated captions", fontsize=9)
    ctx.figure(fig, "flamingo-captions.png")
