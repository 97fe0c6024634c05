"""``gatepool bench train``: our trainer's step against a pytorch/examples-style loop, and FLOP/s.

Three measurements in one process, on the same MNIST digits and the same ``ResidualCNN`` (max pools):

1. **ours**: :func:`gatepool.train.train_epoch`, the trainer's own loop (tensors in memory, a batch is
   one ``index_select``, channels_last, batch 128, Adam with the one-cycle schedule); also the same loop
   in NCHW, to show what channels_last buys, and at batch 64, the reference's batch.
2. **reference**: the loop of pytorch/examples' ``mnist/main.py``: ``DataLoader(TensorDataset(x, y),
   batch_size=64, shuffle=True)``, NCHW, Adadelta(lr=1), ``zero_grad → forward → loss → backward →
   step`` (``F.cross_entropy`` = their ``log_softmax`` + ``nll_loss``).
3. **matmul**: a large fp32 ``torch.mm`` (n = 2048), the machine's practical peak.
4. with ``compile=True`` (``gatepool bench train --compile``): **ours_compiled**, the same loop as *ours*
   through ``torch.compile(model)`` (``TrainConfig(compile=True)``); its compile is paid before the
   timing, and its share of the matmul rate has a target of its own (≥ 45%).

The two setups differ in more than the loop (batch 128 and Adam against batch 64 and Adadelta, each as
its author runs it): the record's ``setups`` says so, ``ratio`` compares them as they are, and
``ratio_equal_batch`` compares ours at batch 64 (still Adam; its step costs about Adadelta's, both a few
elementwise passes over the weights) with the reference.

Each way trains on the same number of images per repeat; repeats are interleaved (so background load
hits all ways alike) and the median images/s is reported. FLOPs are counted from the model's layers:
a conv or linear layer of M multiply-adds forward costs 2M FLOPs forward, 2M for the gradient with
respect to its weights and 2M for the gradient with respect to its input (skipped for the stem,
whose input needs none):

    FLOP/image = 2 · (3 · Σ M_layer − M_stem)           (norms, ReLUs, pools, the optimizer: not counted)

    share = images/s · FLOP/image / (matmul FLOP/s)    targets: ours/reference ≥ 4, share ≥ 40%

``device`` (auto | cpu | cuda | mps): the models and the matmul run there; ours holds the digits on
the device (moved once, as the trainer does), the reference copies each batch from its DataLoader
(``.to(device)``, as pytorch/examples does); every timing ends with a synchronization.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.lab.bench.attention import sync, time_calls

TARGET_RATIO, TARGET_SHARE, TARGET_COMPILED_SHARE = 4.0, 0.40, 0.45
SETUPS = {
    "ours": "gatepool.train.train_epoch: in-memory index_select batches, channels_last, batch 128, "
    "Adam with the one-cycle schedule (TrainConfig's defaults)",
    "reference": "pytorch/examples mnist/main.py's loop: DataLoader(TensorDataset, shuffle=True), NCHW, "
    "batch 64, Adadelta(lr=1)",
    "comparison": "ratio compares the two setups as they are (other batch size and optimizer); "
    "ratio_equal_batch compares ours at batch 64 (ours_b64, still Adam) with the reference",
}


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, int]:
    """(multiply-adds of all Conv2d and Linear layers, those of the first layer) for one input."""
    macs: list[int] = []

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if isinstance(module, nn.Conv2d):
            k = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            macs.append(output.numel() * k)
        else:
            macs.append(output.numel() * module.in_features)

    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    finally:
        for h in handles:
            h.remove()
    return sum(macs), macs[0]


def matmul_flops(n: int, repeats: int, device: torch.device | None = None) -> dict[str, float]:
    """Median FLOP/s of an (n × n) @ (n × n) fp32 matmul (on ``device``; None: the CPU)."""
    device = device or torch.device("cpu")
    a, b = torch.randn(n, n).to(device), torch.randn(n, n).to(device)
    c = torch.empty(n, n, device=device)
    times = time_calls({"mm": lambda: torch.mm(a, b, out=c)}, (), repeats, warmup=2)["mm"]  # 1 call a sample
    s = statistics.median(times)
    return {"n": n, "seconds": s, "flops": 2 * n**3 / s}


def _model(seed: int, channels_last: bool, device: torch.device | None = None) -> nn.Module:
    from gatepool.models import create_model

    torch.manual_seed(seed)
    model = create_model("residual_cnn", pool="max").to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


class Ours:
    """The trainer's loop (:func:`gatepool.train.train_epoch`), one call = one pass over ``data``."""

    def __init__(
        self,
        data,
        *,
        batch_size: int,
        channels_last: bool,
        device: torch.device | None = None,
        compile: bool = False,
    ) -> None:
        from gatepool.train import TrainConfig, data_to_device, make_optimizer

        device = device or torch.device("cpu")
        self.data, self.channels_last = data_to_device(data, device), channels_last
        self.config = TrainConfig(batch_size=batch_size, epochs=1, channels_last=channels_last,
                                  compile=compile)  # fmt: skip
        self.model = _model(0, channels_last, device)
        self.optimizer = make_optimizer(self.config, self.model)
        self.step_model = torch.compile(self.model) if compile else self.model  # as the trainer does
        if compile:
            self.run()  # the compile (and its first steps) before anything is timed

    def run(self) -> None:
        from gatepool.train import train_epoch

        train_epoch(self.step_model, self.optimizer, self.data, self.config, 1,
                    channels_last=self.channels_last)  # fmt: skip


class Reference:
    """pytorch/examples mnist/main.py's ``train()`` loop over a TensorDataset.

    The one training loop outside ``gatepool.train``, on purpose: it is the benchmark's *reference*, a
    copy of how pytorch/examples trains, against which our trainer's speed is measured. Nothing trains
    with it.
    """

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 64, device: torch.device | None = None
    ) -> None:
        from torch.utils.data import DataLoader, TensorDataset

        self.device = device or torch.device("cpu")
        self.loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
        self.model = _model(0, False, self.device)
        self.optimizer = torch.optim.Adadelta(self.model.parameters(), lr=1.0)

    def run(self) -> None:
        self.model.train()
        for data, target in self.loader:
            data, target = data.to(self.device), target.to(self.device)
            self.optimizer.zero_grad()
            output = self.model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            self.optimizer.step()


def run(quick: bool = False, device: Any = "auto", compile: bool = False) -> dict[str, Any]:
    """Run the benchmark; return the record (every number measured). ``compile``: add ours_compiled."""
    from gatepool.train import TrainConfig, TrainData, load_data
    from gatepool.utils.environment import device_info, machine, resolve_device

    device = resolve_device(device)
    images = 1024 if quick else 12800  # per repeat and way: 8 / 100 of our steps, 16 / 200 reference ones
    repeats = 2 if quick else 5
    full = load_data(TrainConfig(train_size=images, test_size=1))
    data = TrainData(full.train_x, full.train_y, full.test_x, full.test_y)
    warm = TrainData(full.train_x[:256], full.train_y[:256], full.test_x, full.test_y)

    on = {"device": device}
    ways: dict[str, Any] = {
        "ours": Ours(data, batch_size=128, channels_last=True, **on),
        "ours_nchw": Ours(data, batch_size=128, channels_last=False, **on),
        "ours_b64": Ours(data, batch_size=64, channels_last=True, **on),
        "reference": Reference(data.train_x, data.train_y, batch_size=64, **on),
    }
    if compile:
        ways["ours_compiled"] = Ours(data, batch_size=128, channels_last=True, compile=True, **on)
    Ours(warm, batch_size=128, channels_last=True, **on).run()  # first-call costs (oneDNN, cuDNN) paid here
    Ours(warm, batch_size=128, channels_last=False, **on).run()
    Ours(warm, batch_size=64, channels_last=True, **on).run()
    Reference(warm.train_x, warm.train_y, **on).run()

    mm = matmul_flops(1024 if quick else 2048, 5 if quick else 10, device)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            sync(device)
            t = time.perf_counter()
            way.run()
            sync(device)
            seconds[name].append(time.perf_counter() - t)

    total_macs, stem_macs = count_macs(_model(0, False), tuple(data.train_x.shape[1:]))
    flop_per_image = 2 * (3 * total_macs - stem_macs)
    results: dict[str, Any] = {}
    for name, way in ways.items():
        ips = images / statistics.median(seconds[name])
        results[name] = {
            "batch_size": way.config.batch_size if isinstance(way, Ours) else 64,
            "channels_last": getattr(way, "channels_last", False),
            "data": "in-memory index_select" if isinstance(way, Ours) else "DataLoader(TensorDataset)",
            "optimizer": "adam (onecycle)" if isinstance(way, Ours) else "adadelta",
            "seconds": seconds[name],
            "images_per_s": ips,
            "flops": ips * flop_per_image,
            "share_of_matmul": ips * flop_per_image / mm["flops"],
        }
    ratio = results["ours"]["images_per_s"] / results["reference"]["images_per_s"]
    ratio_equal_batch = results["ours_b64"]["images_per_s"] / results["reference"]["images_per_s"]
    share = results["ours"]["share_of_matmul"]
    compiled = results.get("ours_compiled", {}).get("share_of_matmul")
    targets = {"ratio": TARGET_RATIO, "share": TARGET_SHARE}
    meets = {"ratio": ratio >= TARGET_RATIO, "share": share >= TARGET_SHARE}
    if compiled is not None:
        targets["compiled_share"] = TARGET_COMPILED_SHARE
        meets["compiled_share"] = compiled >= TARGET_COMPILED_SHARE
    return {
        "name": "train",
        "quick": quick,
        "machine": machine(),
        **device_info(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": "residual_cnn (pool=max)",
        "setups": SETUPS,
        "images_per_repeat": images,
        "repeats": repeats,
        "macs_per_image": total_macs,
        "flop_per_image": flop_per_image,
        "flop_counting": "2*(3*MACs(conv+linear) - MACs(stem)): fwd, grad wrt weights, grad wrt inputs",
        "matmul": mm,
        "ways": results,
        "ratio": ratio,
        "ratio_equal_batch": ratio_equal_batch,
        "share": share,
        "targets": targets,
        "meets": meets,
    }


def table(record: dict[str, Any]) -> str:
    m = record["machine"]
    lines = [
        f"bench train{' (quick)' if record['quick'] else ''}: {m['processor']}, {m['cpu_count']} CPUs, "
        f"torch {record['torch']}, {record['threads']} threads, device {record.get('device', 'cpu')} "
        f"{record.get('device_name', '')}".rstrip(),
        f"ResidualCNN: {record['macs_per_image'] / 1e6:.2f} M multiply-adds/image forward, "
        f"{record['flop_per_image'] / 1e6:.1f} MFLOP/image trained",
        f"matmul {record['matmul']['n']}² fp32: {record['matmul']['flops'] / 1e9:.1f} GFLOP/s",
        "",
        *(f"{name + ':':<11} {text}" for name, text in record["setups"].items()),
        "",
        f"{'way':<13} {'batch':>5} {'optimizer':<15} {'layout':<13} {'images/s':>9} {'GFLOP/s':>8} "
        f"{'of matmul':>9}",
    ]
    for name, r in record["ways"].items():
        layout = "channels_last" if r["channels_last"] else "NCHW"
        lines.append(
            f"{name:<13} {r['batch_size']:>5} {r['optimizer']:<15} {layout:<13} {r['images_per_s']:>9.0f} "
            f"{r['flops'] / 1e9:>8.1f} {r['share_of_matmul']:>9.0%}"
        )
    t, ok = record["targets"], {k: "met" if v else "NOT met" for k, v in record["meets"].items()}
    lines += [
        "",
        f"ours / reference = {record['ratio']:.2f}x   (target >= {t['ratio']:.0f}x: {ok['ratio']}; "
        "batch 128 Adam vs batch 64 Adadelta)",
        f"at equal batch   = {record['ratio_equal_batch']:.2f}x   (ours_b64 / reference, both batch 64)",
        f"ours / matmul    = {record['share']:.0%}    (target >= {t['share']:.0%}: {ok['share']})",
    ]
    if "ours_compiled" in record["ways"]:
        r = record["ways"]["ours_compiled"]
        speedup = r["images_per_s"] / record["ways"]["ours"]["images_per_s"]
        target = f"target >= {t['compiled_share']:.0%}: {ok['compiled_share']}"
        lines.append(f"compiled / matmul = {r['share_of_matmul']:.0%}   ({target}; {speedup:.2f}x ours)")
    return "\n".join(lines)

