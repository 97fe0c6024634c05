"""Training the three transformer variants beyond the first three: dual encoder, UNet, Flamingo.

Each is a :func:`gatepool.train.train` run (AdamW, linear warm-up then cosine decay, gradient norm clipped
at 1, seeded, on one thread count) with hooks: ``batches`` draws fresh random batches from the epoch's
generator, ``loss_fn`` is the model's own loss (no classes: ``train_acc`` is None), and there is no
per-epoch evaluation:

    dual_encoder           MNIST train digits (normalized) with a caption each, a random template
                           per draw ("seven", "a 7", "the digit seven", ...); the contrastive loss
    cross_attention_unet   MNIST train digits at 16×16 in [−1, 1] with a caption each; DDPM's
                           ε-prediction loss, the caption dropped to the empty one with p = 0.1 (for
                           classifier-free guidance; t, ε and the drops from the global RNG, which the
                           trainer reseeds every epoch)
    flamingo               two runs: (1) the text LM alone on captions of 1..3 random digits, ``lm_steps``
                           steps; (2) the LM frozen, the canvas encoder and the gated cross-attention
                           layers on strips of the same digits (MNIST train images) with their captions,
                           ``steps`` steps, starting from run 1's model

An epoch is the largest divisor of the steps that is at most :data:`EPOCH_STEPS` (100 steps, some 10-30 s
on one thread), so a run killed and restarted loses at most one epoch. ``train_variant(config, out)``
runs the one ``config["model"]`` names; with ``out`` the trainer's runs go to ``out/train`` (Flamingo:
``out/lm`` and ``out/xattn``: checkpoints, resumed after a kill) and the run folder gets
``model.safetensors`` and ``results.json`` (the config, the loss curve, seconds, the weights' SHA-256);
a folder that already holds a finished run is loaded instead of trained again.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.train.config import TrainConfig
from gatepool.train.loop import train
from gatepool.utils.io import atomic_write_bytes, atomic_write_json, read_json

__all__ = ["EPOCH_STEPS", "MODELS", "VARIANT_METRICS", "caption_batch", "default_config", "describe_data",
           "epoch_length", "evaluate_variant", "judge_inputs", "lm_batch", "train_config", "train_variant",
           "unet_images"]

MODELS = ("dual_encoder", "cross_attention_unet", "flamingo")
EPOCH_STEPS = 100  # the most steps an epoch (a checkpoint) takes

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


def epoch_length(steps: int) -> int:
    """Steps per epoch for a run of ``steps``: the largest divisor of ``steps`` that is ≤ EPOCH_STEPS."""
    return max(d for d in range(1, min(steps, EPOCH_STEPS) + 1) if steps % d == 0)


def train_config(config: dict[str, Any], stage: str | None = None) -> TrainConfig:
    """The :class:`TrainConfig` of a variant config's training (Flamingo: of its ``stage`` "lm" or
    "xattn")."""
    steps, lr, wd = config["steps"], config["lr"], config["weight_decay"]
    if stage == "lm":
        steps, lr, wd = config["lm_steps"], config["lm_lr"], 0.0
    per_epoch = epoch_length(steps)
    return TrainConfig(model=config["model"], model_kwargs=model_kwargs(config),
                       data=describe_data(config["model"]), epochs=steps // per_epoch,
                       steps_per_epoch=per_epoch, batch_size=config["batch_size"],
                       optimizer="adamw", lr=lr, weight_decay=wd, grad_clip=1.0, schedule="cosine",
                       warmup=config["warmup"], seed=config["seed"], threads=config["threads"],
                       channels_last=False, device="cpu")  # fmt: skip


def _caption_batches(x: torch.Tensor, labels: torch.Tensor, tokenizer: Any, cfg: TrainConfig,
                     g: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """An epoch of random digits x[i] (B, ...) with a caption each (B, T)."""
    for _ in range(cfg.steps_per_epoch):
        i = torch.randint(0, len(labels), (cfg.batch_size,), generator=g)
        yield x[i], caption_batch(labels[i], tokenizer, g)


def _lm_batches(slots: int, tokenizer: Any, cfg: TrainConfig, g: torch.Generator) -> Iterator:
    """An epoch of digit-word captions alone (B, T), as both input and target."""
    for _ in range(cfg.steps_per_epoch):
        ids = lm_batch(cfg.batch_size, slots, tokenizer, g)
        yield ids, ids


def _strip_batches(images: torch.Tensor, labels: torch.Tensor, slots: int, tokenizer: Any, cfg: TrainConfig,
                   g: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """An epoch of strips (B, 1, 28, 28·slots) of 1..slots digits and their captions (B, T)."""
    from gatepool.models.digit_strip import make_strips
    from gatepool.models.digit_text import sequence_caption

    for _ in range(cfg.steps_per_epoch):
        canvas, digits = make_strips(images, labels, cfg.batch_size, slots, g)
        yield canvas, tokenizer.encode([sequence_caption(d) for d in digits])


def _contrastive_loss(model: nn.Module, images: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, None]:
    return model.loss(images, ids), None


def _denoising_loss(schedule: Any, null: torch.Tensor, p_uncond: float, model: nn.Module, x0: torch.Tensor,
                    ids: torch.Tensor) -> tuple[torch.Tensor, None]:  # fmt: skip
    return schedule.loss(model, x0, ids, null, p_uncond), None  # t, ε, drops: the global RNG


def _lm_loss(model: nn.Module, ids: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, None]:
    from gatepool.models.flamingo import caption_loss

    return caption_loss(model.lm(ids), target), None


def _caption_loss(model: nn.Module, canvas: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, None]:
    from gatepool.models.flamingo import caption_loss

    return caption_loss(model(ids, canvas), ids), None


def _no_eval(model: nn.Module) -> dict[str, Any]:
    return {}


def _run(cfg: TrainConfig, model: nn.Module, folder: Path | None, name: str, progress: bool,
         batches: Callable, loss_fn: Callable) -> tuple[nn.Module, dict[str, Any]]:  # fmt: skip
    """One :func:`train` run of ``model`` in ``folder / name`` (None: no files)."""
    out = None if folder is None else folder / name
    result = train(cfg, out=out, progress=progress, verbose=progress, model=model, batches=batches,
                   loss_fn=loss_fn, eval_fn=_no_eval)  # fmt: skip
    return result.model, result.record


def _new_model(config: dict[str, Any]) -> nn.Module:
    from gatepool.models import create_model

    torch.manual_seed(config["seed"])
    return create_model(config["model"], **model_kwargs(config))


def _train_dual_encoder(config: dict[str, Any], folder: Path | None, progress: bool
                        ) -> tuple[nn.Module, list]:  # fmt: skip
    from gatepool.data import load_dataset
    from gatepool.models.digit_text import DigitTokenizer

    model, cfg = _new_model(config), train_config(config)
    ds = load_dataset("mnist", "train")
    tok = DigitTokenizer(model.max_len)
    batches = functools.partial(_caption_batches, ds.normalized(), ds.labels, tok, cfg)
    model, record = _run(cfg, model, folder, "train", progress, batches, _contrastive_loss)
    return model, [record]


def _train_unet(config: dict[str, Any], folder: Path | None, progress: bool) -> tuple[nn.Module, list]:
    from gatepool.data import load_dataset
    from gatepool.models.diffusion import DDPMSchedule
    from gatepool.models.digit_text import DigitTokenizer

    model, cfg = _new_model(config), train_config(config)
    ds = load_dataset("mnist", "train")
    tok = DigitTokenizer(model.text.max_len)
    x = unet_images(ds.images, config["image_size"])  # (N, 1, s, s) in [−1, 1]
    batches = functools.partial(_caption_batches, x, ds.labels, tok, cfg)
    loss = functools.partial(_denoising_loss, DDPMSchedule(), tok.encode("")[0], config["p_uncond"])
    model, record = _run(cfg, model, folder, "train", progress, batches, loss)
    return model, [record]


def _train_flamingo(config: dict[str, Any], folder: Path | None, progress: bool) -> tuple[nn.Module, list]:
    from gatepool.data import load_dataset
    from gatepool.models.digit_text import DigitTokenizer

    slots, model = config["slots"], _new_model(config)
    tok = DigitTokenizer(model.max_len)
    cfg = train_config(config, "lm")  # stage 1: the text alone (only the LM gets gradients)
    model, lm = _run(cfg, model, folder, "lm", progress, functools.partial(_lm_batches, slots, tok, cfg),
                     _lm_loss)  # fmt: skip
    model.freeze_lm()  # stage 2: canvases, the LM frozen
    ds = load_dataset("mnist", "train")
    cfg = train_config(config, "xattn")
    batches = functools.partial(_strip_batches, ds.images, ds.labels, slots, tok, cfg)
    model, xattn = _run(cfg, model, folder, "xattn", progress, batches, _caption_loss)
    return model, [lm, xattn]


_TRAINERS = {"dual_encoder": _train_dual_encoder, "cross_attention_unet": _train_unet,
             "flamingo": _train_flamingo}  # fmt: skip


def _history(records: list[dict[str, Any]], stages: tuple[str, ...] | None) -> list[dict[str, Any]]:
    """The loss curve of the trainer's records: per epoch its last step, mean loss, lr and the seconds
    since its run began (Flamingo: and the stage)."""
    rows = []
    for k, record in enumerate(records):
        per_epoch, seconds = record["config"]["steps_per_epoch"], 0.0
        for row in record["history"]:
            seconds += row["seconds"]
            rows.append({"step": row["epoch"] * per_epoch, "loss": row["train_loss"], "lr": row["lr"],
                         "seconds": seconds, **({"stage": stages[k]} if stages else {})})  # fmt: skip
    return rows


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
    records: list[dict[str, Any]]
    model, records = _TRAINERS[config["model"]](config, folder, progress)
    model.eval()
    data = save({k: v.contiguous() for k, v in model.state_dict().items()})
    stages = ("lm", "xattn") if config["model"] == "flamingo" else None
    record = {"config": config, "model": config["model"], "model_kwargs": model_kwargs(config),
              "parameters": sum(p.numel() for p in model.parameters()), "history": _history(records, stages),
              "seconds": sum(r["seconds"] for r in records), "threads": config["threads"],
              "torch": torch.__version__, "weights_sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
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
