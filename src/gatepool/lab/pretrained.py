"""``gatepool pretrained build``: train the lecture models with the full profile's setup, ship them.

Each shipped model is its experiment's own training, with the full profile's setup and the experiment's
own config and training task (so the weights are those a full run's training of that seed gives, up to
thread count):

    pool-comparison   residual_cnn, each of the six gates, seed 0: 60,000 digits, 6 epochs, Adam 3e-3
    attention-reach   conv_attention and conv_stem, seeds 0, 1, 2 (the full profile's seeds: the maps'
                      claims take their tolerance from the spread over seeds): 8,000 digits, 20 epochs
    vit-mnist         the ViT and the CNN at 1,000 and 60,000 digits, seed 0, for the epochs the full
                      run's wall-clock budgets gave them (``FULL_RUN_EPOCHS``: a step count, so that the
                      weights do not depend on how busy the building machine is)
    seq-demo          the decoder on reversing 8 digits, seed 0, stopped at 99 % token accuracy
    transformer-      the dual encoder, the cross-attention UNet and Flamingo, seed 0, with the full
    variants          profile's steps (``gatepool.train.variants``, one thread each)

Every training runs in ``<out>/<name>/`` (checkpoint each epoch: a killed build resumes), in ``jobs``
one-thread workers. Then each run's ``model.safetensors`` is copied to ``<dest>/<name>.safetensors``,
loaded back through the shipped-weights loader (hash verified) and evaluated on the test set; the
accuracy goes into ``<dest>/<name>.json`` (the card) with the file's SHA-256.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Any

import torch

from gatepool.utils.io import CorruptFileError, atomic_write_bytes, atomic_write_json, read_json

MAX_TOTAL_BYTES = 5 * 1024 * 1024  # the bound on everything shipped


def shipped_specs() -> list[dict[str, Any]]:
    """Every shipped model: ``name``, ``experiment``, ``kind`` ("train" | "seq"), ``config`` (the
    experiment's TrainConfig dict, or train_seq_demo's kwargs), ``test_size`` (test digits the card's
    accuracy is measured on), ``default`` (what ``pretrained=True`` picks among same-kwargs weights) and
    ``note``. Longest trainings first."""
    from gatepool.lab.claims import declared
    from gatepool.lab.common import attention_nets
    from gatepool.lab.experiments import registry as experiments
    from gatepool.lab.experiments import vit_mnist

    experiments()  # every experiment declared

    setups = {name: exp.setup for name, exp in declared().items()}  # the full profile's setups
    specs = []
    pc = setups["pool-comparison"]
    for pool in pc["pools"]:
        config = {"model": "residual_cnn", "model_kwargs": {"pool": pool}, "epochs": pc["epochs"],
                  "train_size": pc["train_size"], "test_size": pc["test_size"],
                  "batch_size": pc["batch_size"], "optimizer": pc["optimizer"], "lr": pc["lr"],
                  "schedule": pc["schedule"], "seed": 0,
                  "device": "cpu"}  # fmt: skip  (pool_comparison's config for seed 0)
        specs.append(dict(name=f"residual_cnn-{pool}-s0", experiment="pool-comparison", kind="train",
                          config=config, test_size=pc["test_size"], default=True,
                          note=f"Tuesday's CNN with both pools {pool!r}; pool-comparison's seed-0 training"))
    vm = setups["vit-mnist"]
    for n in sorted({n for _, n in vit_mnist.FULL_RUN_EPOCHS}, reverse=True):
        for who in ("vit", "cnn"):
            epochs = vit_mnist.FULL_RUN_EPOCHS[(who, n)]
            specs.append(dict(
                name=vit_mnist.SHIPPED[(who, n)], experiment="vit-mnist", kind="train",
                config=vit_mnist.train_config(vm, who, n, epochs), test_size=vm["test_size"],
                default=who == "vit" and n == max(vm["sizes"]),
                note=f"vit-mnist's {dict(vit='ViT', cnn='CNN')[who]} on {n} digits, trained for {epochs} "
                "epochs: the epochs the full run's wall-clock budget gave it on 2 quiet cores (results/full),"
                " fixed here so that a busy machine trains the same steps"))  # fmt: skip
    ar = setups["attention-reach"]
    for model in ("conv_attention", "conv_stem"):
        for seed in ar["seeds"]:
            specs.append(dict(name=attention_nets.shipped_name(model, seed), experiment="attention-reach",
                              kind="train",
                              config=attention_nets.train_config(ar, model, seed), test_size=ar["test_size"],
                              default=seed == 0,
                              note=f"attention-reach's {model}, seed {seed}, at its tuned peak lr"))
    sd = setups["seq-demo"]
    keys = ("arch", "task", "length", "steps", "batch_size", "lr", "warmup", "eval_every", "eval_size",
            "target_acc", "dim", "depth", "threads")  # fmt: skip
    kwargs = {k: sd[k] for k in keys} | {"seed": 0, "num_heads": sd["heads"], "device": "cpu"}
    specs.append(dict(name=f"seq_decoder-{sd['task']}-s0", experiment="seq-demo", kind="seq", config=kwargs,
                      test_size=sd["eval_size"], default=True,
                      note=f"seq-demo's decoder on {sd['task']} of {sd['length']} digits, stopped at the "
                      f"first evaluation with {sd['target_acc']:.0%} greedy token accuracy"))  # fmt: skip
    from gatepool.lab.experiments import transformer_variants as tv
    from gatepool.train.variants import VARIANT_METRICS

    for model, name in tv.SHIPPED.items():
        config = tv.variant_config(setups["transformer-variants"], model)
        metric, size = VARIANT_METRICS[model]
        specs.append(dict(name=name, experiment="transformer-variants", kind="variant", config=config,
                          test_size=size, default=True,
                          note=f"transformer-variants' {model}, seed {config['seed']}, {config['steps']} "
                          f"steps (the full profile's training); card metric: {metric}"))  # fmt: skip
    return specs


def train_spec(task: dict[str, Any]) -> dict[str, Any]:
    """One training (a worker's unit), as its experiment trains it; returns its record."""
    spec, out = task["spec"], task["out"]
    if spec["kind"] == "variant":
        from gatepool.train.variants import train_variant

        return train_variant(spec["config"], out)[1]
    if spec["kind"] == "seq":
        from gatepool.train.seq import train_seq_demo

        return train_seq_demo(**spec["config"], progress=False, out=out)
    from gatepool.train.task import TrainTask, train_task

    if spec["experiment"] == "pool-comparison":  # its history holds the learned τ, as the experiment's
        from gatepool.lab.common.gate_trainings import gate_task

        return train_task(gate_task(spec["config"], out))
    return train_task(TrainTask(spec["config"], str(out)))


CHECK_SIZE = 500  # the card also holds the accuracy on the first 500 of its test set: a test recomputes it


def test_accuracy(card: dict[str, Any], model: torch.nn.Module, first: int | None = None) -> float:
    """A shipped model's accuracy on the test set its card names, or on the first ``first`` items of it
    (greedy token accuracy for the sequence decoder)."""
    model.eval()
    n = card["test_size"] if first is None else first
    config = card["train_config"]
    if card.get("kind") == "variant":
        from gatepool.train.variants import evaluate_variant

        return evaluate_variant(model, card["model"], n, card["seed"])
    if card["test_metric"] == "greedy token accuracy":
        from gatepool.models.seq import make_task_batch
        from gatepool.train.seq import greedy_accuracy

        task, length = config["data"].split("-")[1:]  # "digits-<task>-<length>"
        x, y = make_task_batch(task, card["test_size"], int(length),
                               torch.Generator().manual_seed(10_000 + card["seed"]))  # train_seq_demo's set
        return greedy_accuracy(model, x[:n], y[:n])["test_acc"]
    from gatepool.train import TrainConfig, evaluate, load_data

    data = load_data(TrainConfig.from_dict({**config, "train_size": 1, "test_size": card["test_size"]}))
    return evaluate(model, data.test_x[:n], data.test_y[:n])["acc"]


def _variant_card(spec: dict[str, Any], record: dict[str, Any], data: bytes, command: str
                  ) -> dict[str, Any]:  # fmt: skip
    """The card of a transformer-variants model (``gatepool.train.variants``: steps, not epochs)."""
    from gatepool.train.variants import VARIANT_METRICS, describe_data
    from gatepool.utils.environment import machine

    config = record["config"]
    metric = VARIANT_METRICS[config["model"]][0]
    return {
        "name": spec["name"], "kind": "variant", "model": config["model"],
        "model_kwargs": record["model_kwargs"], "default": spec["default"], "experiment": spec["experiment"],
        "note": spec["note"], "data": describe_data(config["model"]), "seed": config["seed"], "epochs": 1,
        "steps": config["steps"] + config.get("lm_steps", 0), "train_size": None,
        "test_size": spec["test_size"], "test_set": metric, "test_acc": None, "check": None,
        "test_metric": metric, "parameters": record["parameters"], "train_config": config,
        "train_seconds": round(record["seconds"], 1), "train_threads": record["threads"],
        "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "dtype": "float32",
        "torch": torch.__version__, "machine": machine(), "command": command,
        "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }  # fmt: skip


def _card(spec: dict[str, Any], record: dict[str, Any], data: bytes, command: str
          ) -> dict[str, Any]:  # fmt: skip
    from gatepool.utils.environment import machine

    if spec["kind"] == "variant":
        return _variant_card(spec, record, data, command)
    config = record["config"]
    seq = spec["kind"] == "seq"
    epochs = len(record["history"])
    steps_per_epoch = (config["steps_per_epoch"] if seq
                       else -(-config["train_size"] // config["batch_size"]))  # fmt: skip
    return {
        "name": spec["name"],
        "model": config["model"],
        "model_kwargs": config["model_kwargs"],
        "default": spec["default"],
        "experiment": spec["experiment"],
        "note": spec["note"],
        "data": config["data"],
        "seed": config["seed"],
        "epochs": epochs,
        "steps": epochs * steps_per_epoch,
        "train_size": None if seq else config["train_size"],
        "test_size": spec["test_size"],
        "test_set": ("held-out sequences drawn with seed 10000 + seed (train_seq_demo's)" if seq else
                     f"the first {spec['test_size']} of randperm(10000) seeded {config['subset_seed']}"
                     if spec["test_size"] < 10000 else "all 10,000 MNIST test digits"),  # fmt: skip
        "test_acc": None,
        "check": None,  # {"first": n, "acc": the accuracy on the first n of the test set}
        "test_metric": "greedy token accuracy" if seq else "accuracy",
        "parameters": record["parameters"],
        "train_config": config,
        "train_seconds": round(record["seconds"], 1),
        "train_threads": record["threads"],
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "dtype": "float32",
        "torch": torch.__version__,
        "machine": machine(),
        "command": command,
        "built": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def build(out: str | Path, dest: str | Path | None = None, *, jobs: int = 2, only: list[str] | None = None,
          command: str = "", log=print) -> list[dict[str, Any]]:  # fmt: skip
    """Train (or resume, or load) every shipped model in ``<out>/<name>/``, then write the weights and
    cards to ``dest`` (default: the package's folder). Returns the cards written."""
    from gatepool.models.pretrained import PRETRAINED_DIR
    from gatepool.models.registry import load_pretrained
    from gatepool.train.sweep import run_tasks

    specs = shipped_specs()
    if only:
        known = [s["name"] for s in specs]
        unknown = sorted(set(only) - set(known))
        if unknown:
            raise ValueError(f"--only: unknown names {unknown}; shipped models: {', '.join(known)}")
        specs = [s for s in specs if s["name"] in only]
    out, dest = Path(out), Path(dest) if dest is not None else PRETRAINED_DIR
    dest.mkdir(parents=True, exist_ok=True)
    tasks = [{"spec": s, "out": str(out / s["name"])} for s in specs]
    pending = [t for t in tasks if not _finished(Path(t["out"]))]  # the trainer rebuilds damaged weights
    log(f"{len(tasks)} models, {len(pending)} to train in {jobs} worker(s): "
        + ", ".join(t["spec"]["name"] for t in pending))  # fmt: skip
    run_tasks(train_spec, pending, jobs)
    written = []
    for task in tasks:
        spec, folder = task["spec"], Path(task["out"])
        if not _finished(folder):
            raise CorruptFileError(f"{folder / 'model.safetensors'}: missing or not the weights its "
                                   f"results.json names (SHA-256); delete {folder} and build again")
        record = read_json(folder / "results.json")
        data = (folder / "model.safetensors").read_bytes()
        atomic_write_bytes(dest / f"{spec['name']}.safetensors", data)
        card = _card(spec, record, data, command)
        atomic_write_json(dest / f"{spec['name']}.json", card)  # the hash first: the loader checks it
        model = load_pretrained(card["model"], spec["name"], root=dest)
        card["test_acc"] = round(test_accuracy(card, model), 6)
        card["check"] = {"first": CHECK_SIZE, "acc": round(test_accuracy(card, model, CHECK_SIZE), 6)}
        atomic_write_json(dest / f"{spec['name']}.json", card)
        written.append(card)
        log(f"{spec['name']:<34} test acc {card['test_acc']:.4f} on {spec['test_size']} "
            f"({card['epochs']} epochs, {card['bytes'] / 1024:.0f} KiB)")
    total = sum(p.stat().st_size for p in dest.glob("*.safetensors"))
    log(f"shipped weights in {dest}: {total / 2**20:.2f} MiB in all (bound {MAX_TOTAL_BYTES / 2**20:.0f} "
        "MiB)")
    if total > MAX_TOTAL_BYTES:
        log("warning: over the bound")
    return written


def _finished(folder: Path) -> bool:
    """A finished training whose weights are the ones its results.json records (by SHA-256)."""
    try:
        record = read_json(folder / "results.json")
        data = (folder / "model.safetensors").read_bytes()
    except (OSError, ValueError):
        return False
    return hashlib.sha256(data).hexdigest() == record.get("weights_sha256")
