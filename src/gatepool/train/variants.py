"""Training the three transformer variants beyond the first three: dual encoder, UNet, Flamingo.

One function per model, each a plain loop of fresh random batches (AdamW, linear warm-up then cosine
decay, gradient norm clipped at 1), seeded, on one thread count:

    dual_encoder           MNIST train digits (normalized) with a caption each, a random template
                           per draw ("seven", "a 7", "the digit seven", ...); the contrastive loss
    cross_attention_unet   MNIST train digits at 16×16 in [−1, 1] with a caption each; DDPM's
                           ε-prediction loss, the caption dropped to the empty one with p = 0.1 (for
                           classifier-free guidance)
    flamingo               (1) the text LM alone on captions of 1..3 random digits, ``lm_steps`` steps;
                           (2) the LM frozen, the canvas encoder and the gated cross-attention layers on
                           strips of the same digits (MNIST train images) with their captions, ``steps`` steps

``train_variant(config, out)`` runs the one ``config["model"]`` names; with ``out`` the run folder gets
``model.safetensors`` and ``results.json`` (the config, the loss curve, seconds, the weights' SHA-256),
and a folder that already holds a finished run is loaded instead of trained again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.train.schedule import get_lr
from gatepool.utils.io import atomic_write_bytes, atomic_write_json, read_json
from gatepool.utils.threads import num_threads

__all__ = ["MODELS", "VARIANT_METRICS", "caption_batch", "default_config", "describe_data",
           "evaluate_variant", "judge_inputs", "lm_batch", "train_variant", "unet_images"]

MODELS = ("dual_encoder", "cross_attention_unet", "flamingo")

_DEFAULTS: dict[str, dict[str, Any]] = {
    "dual_encoder": dict(model_kwargs={"loss": "clip"}, steps=1200, batch_size=128, lr=2e-3,
                         weight_decay=0.05),
    "cross_attention_unet": dict(model_kwargs=dict(channels=[16, 32], num_heads=2), steps=2000, batch_size=64,
                                 lr=2e-3, weight_decay=0.0, p_uncond=0.1, image_size=16),
    "flamingo": dict(model_kwargs=dict(dim=48), steps=1500, batch_size=64, lr=5e-3, weight_decay=0.0,
                     lm_steps=600, lm_lr=3e-3, slots=3),
}  # fmt: skip


def default_config(model: str, **changes: Any) -> dict[str, Any]:
    """The training config of ``model`` (one of :data:`MODELS`) with ``changes``; every config has model,
    model_kwargs, steps, batch_size, lr, weight_decay, warmup (share of the steps), seed, threads."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    config = {"model": model, **_DEFAULTS[model], "warmup": 0.05, "seed": 0, "threads": 1}
    unknown = set(changes) - set(config)
    if unknown:
        raise ValueError(f"{model}: unknown config keys {sorted(unknown)}; it has {sorted(config)}")
    return {**config, **changes}


def caption_batch(labels: torch.Tensor, tokenizer: Any, generator: torch.Generator) -> torch.Tensor:
    """One caption per label, each in a template drawn at random: (B,) → (B, T) ids."""
    from gatepool.models.digit_text import TEMPLATES, caption

    which = torch.randint(0, len(TEMPLATES), (labels.shape[0],), generator=generator).tolist()
    return tokenizer.encode([caption(int(d), TEMPLATES[k]) for d, k in zip(labels.tolist(), which)])


def lm_batch(n: int, slots: int, tokenizer: Any, generator: torch.Generator) -> torch.Tensor:
    """Captions of 1..slots uniformly random digits ("three one four"), text alone: (n, T) ids."""
    from gatepool.models.digit_text import sequence_caption

    counts = torch.randint(1, slots + 1, (n,), generator=generator).tolist()
    digits = torch.randint(0, 10, (n, slots), generator=generator).tolist()
    return tokenizer.encode([sequence_caption(d[:c]) for d, c in zip(digits, counts)])


def unet_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """Digits (N, 28, 28) uint8 → (N, 1, size, size) in [−1, 1] (antialiased bilinear resize)."""
    x = images.unsqueeze(1).float() / 255.0
    if size != x.shape[-1]:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.clamp(0, 1) * 2 - 1


def _fit(params: list[nn.Parameter], loss_fn: Callable[[int], torch.Tensor], steps: int, lr: float,
         weight_decay: float, warmup: float, progress: bool, label: str
         ) -> list[dict[str, float]]:  # fmt: skip
    """AdamW over ``params`` for ``steps`` steps of ``loss_fn(step)``; the curve every ~1/20 of the steps."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    history, every, running, t0 = [], max(1, steps // 20), 0.0, time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = get_lr(step, steps, lr=lr, schedule="cosine", warmup=warmup)
        loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        running += loss.item()
        if (step + 1) % every == 0 or step + 1 == steps:
            n = (step % every) + 1
            history.append({"step": step + 1, "loss": running / n, "seconds": time.perf_counter() - t0})
            running = 0.0
            if progress:
                print(f"  {label} step {step + 1}/{steps}: loss {history[-1]['loss']:.4f} "
                      f"({history[-1]['seconds']:.0f} s)", flush=True)  # fmt: skip
    return history


def _train_dual_encoder(config: dict[str, Any], progress: bool) -> tuple[nn.Module, list]:
    from gatepool.data import load_dataset
    from gatepool.models import create_model
    from gatepool.models.digit_text import DigitTokenizer

    model = create_model("dual_encoder", **config["model_kwargs"]).train()
    ds = load_dataset("mnist", "train")
    x, y = ds.normalized(), ds.labels
    tok, g = DigitTokenizer(model.max_len), torch.Generator().manual_seed(config["seed"] + 1)

    def loss(step: int) -> torch.Tensor:
        i = torch.randint(0, len(y), (config["batch_size"],), generator=g)
        return model.loss(x[i], caption_batch(y[i], tok, g))

    return model, _fit(list(model.parameters()), loss, config["steps"], config["lr"], config["weight_decay"],
                       config["warmup"], progress, "dual_encoder")  # fmt: skip


def _train_unet(config: dict[str, Any], progress: bool) -> tuple[nn.Module, list]:
    from gatepool.data import load_dataset
    from gatepool.models import create_model
    from gatepool.models.diffusion import DDPMSchedule
    from gatepool.models.digit_text import DigitTokenizer

    model = create_model("cross_attention_unet", image_size=config["image_size"], **config["model_kwargs"])
    model.train()
    ds = load_dataset("mnist", "train")
    x, y = unet_images(ds.images, config["image_size"]), ds.labels
    tok, g = DigitTokenizer(model.text.max_len), torch.Generator().manual_seed(config["seed"] + 1)
    schedule, null = DDPMSchedule(), tok.encode("")[0]

    def loss(step: int) -> torch.Tensor:
        i = torch.randint(0, len(y), (config["batch_size"],), generator=g)
        return schedule.loss(model, x[i], caption_batch(y[i], tok, g), null, config["p_uncond"], g)

    return model, _fit(list(model.parameters()), loss, config["steps"], config["lr"], config["weight_decay"],
                       config["warmup"], progress, "unet")  # fmt: skip


def _train_flamingo(config: dict[str, Any], progress: bool) -> tuple[nn.Module, list]:
    from gatepool.data import load_dataset
    from gatepool.models import create_model
    from gatepool.models.digit_strip import DIGIT, make_strips
    from gatepool.models.digit_text import DigitTokenizer, sequence_caption
    from gatepool.models.flamingo import caption_loss

    slots = config["slots"]
    model = create_model("flamingo", canvas_size=(DIGIT, DIGIT * slots), **config["model_kwargs"]).train()
    tok, g = DigitTokenizer(model.max_len), torch.Generator().manual_seed(config["seed"] + 1)

    def lm_loss(step: int) -> torch.Tensor:  # stage 1: the text alone
        ids = lm_batch(config["batch_size"], slots, tok, g)
        return caption_loss(model.lm(ids), ids)

    history = _fit(list(model.lm.parameters()), lm_loss, config["lm_steps"], config["lm_lr"], 0.0,
                   config["warmup"], progress, "flamingo (text LM)")  # fmt: skip
    for h in history:
        h["stage"] = "lm"
    model.freeze_lm()
    ds = load_dataset("mnist", "train")

    def xattn_loss(step: int) -> torch.Tensor:  # stage 2: canvases, the LM frozen
        canvas, digits = make_strips(ds.images, ds.labels, config["batch_size"], slots, g)
        ids = tok.encode([sequence_caption(d) for d in digits])
        return caption_loss(model(ids, canvas), ids)

    new = [p for p in model.parameters() if p.requires_grad]
    history += [{**h, "stage": "xattn"} for h in _fit(new, xattn_loss, config["steps"], config["lr"],
                config["weight_decay"], config["warmup"], progress, "flamingo (gated x-attn)")]  # fmt: skip
    return model, history


_TRAINERS = {"dual_encoder": _train_dual_encoder, "cross_attention_unet": _train_unet,
             "flamingo": _train_flamingo}  # fmt: skip


def model_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """The constructor kwargs a config's model is built with (what a card records)."""
    kw = dict(config["model_kwargs"])
    if config["model"] == "cross_attention_unet":
        kw["image_size"] = config["image_size"]
    if config["model"] == "flamingo":
        kw["canvas_size"] = [28, 28 * config["slots"]]
    return kw


def train_variant(config: dict[str, Any], out: str | Path | None = None, *, progress: bool = False
                  ) -> tuple[nn.Module, dict[str, Any]]:  # fmt: skip
    """Train ``config["model"]`` (a :func:`default_config`), or load the finished run in ``out``.

    Returns the model (eval mode) and its record: config, model_kwargs, parameters, history, seconds,
    threads, torch, weights_sha256.
    """
    from safetensors.torch import load, save

    from gatepool.models import create_model

    config = default_config(config["model"], **{k: v for k, v in config.items() if k != "model"})
    folder = Path(out) if out is not None else None
    if folder is not None and all((folder / f).is_file() for f in ("results.json", "model.safetensors")):
        record = read_json(folder / "results.json")
        data = (folder / "model.safetensors").read_bytes()
        same = record.get("config") == config
        if same and hashlib.sha256(data).hexdigest() == record.get("weights_sha256"):
            model = create_model(config["model"], **model_kwargs(config))
            model.load_state_dict(load(data))
            return model.eval(), record
    with num_threads(config["threads"]):
        torch.manual_seed(config["seed"])
        t0 = time.perf_counter()
        model, history = _TRAINERS[config["model"]](config, progress)
        seconds = time.perf_counter() - t0
    model.eval()
    data = save({k: v.contiguous() for k, v in model.state_dict().items()})
    record = {"config": config, "model": config["model"], "model_kwargs": model_kwargs(config),
              "parameters": sum(p.numel() for p in model.parameters()), "history": history,
              "seconds": seconds, "threads": config["threads"], "torch": torch.__version__,
              "weights_sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / "model.safetensors", data)
        atomic_write_json(folder / "results.json", record)
    return model, record


# what a shipped variant's card reports, and on how many items
VARIANT_METRICS = {
    "dual_encoder": ("zero-shot accuracy on the MNIST test digits, prompts 'the digit …'", 10000),
    "cross_attention_unet": ("share of DDIM samples (25 steps, guidance 2, prompt i mod 10, noise seeded) "
                             "the shipped residual_cnn-max-s0 reads as the prompt's digit", 1000),
    "flamingo": ("exact-match greedy captions of strips of 1-3 MNIST test digits (seeded)", 1000),
}  # fmt: skip


def describe_data(model: str) -> str:
    """The training data of a variant, in words (a card's ``data``)."""
    return {"dual_encoder": "mnist train digits + template captions",
            "cross_attention_unet": "mnist train digits at 16x16 + template captions",
            "flamingo": "digit-word captions (text alone), then strips of mnist train digits",
            }[model]  # fmt: skip


def judge_inputs(samples: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """UNet samples (B, 1, s, s) in [−1, 1] → the lecture CNN's input: 28×28, normalized as MNIST."""
    z = F.interpolate((samples.clamp(-1, 1) + 1) / 2, size=(28, 28), mode="bilinear", align_corners=False)
    return (z - mean) / std


@torch.no_grad()
def evaluate_variant(model: nn.Module, name: str, n: int, seed: int = 0) -> float:
    """The card metric of :data:`VARIANT_METRICS` for a trained variant, on the first ``n`` items."""
    from gatepool.data import load_dataset
    from gatepool.models.digit_text import PROMPTS, DigitTokenizer

    model.eval()
    test = load_dataset("mnist", "test")
    if name == "dual_encoder":
        pred, _ = model.zero_shot(test.normalized()[:n])
        return (pred == test.labels[:n]).float().mean().item()
    if name == "cross_attention_unet":
        from gatepool.models import create_model
        from gatepool.models.diffusion import DDPMSchedule

        judge = create_model("residual_cnn", pretrained="residual_cnn-max-s0").eval()
        tok = DigitTokenizer(model.text.max_len)
        digits = torch.arange(n) % 10
        noise = torch.randn((n, 1, model.image_size, model.image_size),
                            generator=torch.Generator().manual_seed(5000 + seed))  # fmt: skip
        x = DDPMSchedule().ddim_sample(model, tok.encode(list(PROMPTS))[digits], tok.encode("")[0], steps=25,
                                       guidance=2.0, noise=noise)  # fmt: skip
        return (judge(judge_inputs(x, test.mean, test.std)).argmax(1) == digits).float().mean().item()
    if name == "flamingo":
        from gatepool.models.digit_strip import make_strips

        tok = DigitTokenizer(model.max_len)
        canvas, digits = make_strips(test.images, test.labels, n, model.canvas_size[1] // 28,
                                     torch.Generator().manual_seed(5000 + seed))  # fmt: skip
        got = [tok.digits(o) for o in model.generate(canvas)]
        return sum(a == b for a, b in zip(got, digits)) / n
    raise ValueError(f"name must be one of {MODELS}, got {name!r}")
