"""``gatepool probe``: the ideal signal and gradient variance beside the measured one, per module.

    gatepool probe --model residual_cnn --pool max --data mnist --batch 512 --seed 0 --out DIR [--json]
    gatepool probe --model torchvision:resnet18 --batch 64 --size 64        (or timm:NAME; gatepool[vision])
    gatepool probe --model torchvision:resnet18 --data mnist --batch 64     (digits resized to --size)
    gatepool probe --model residual_cnn_canvas --data cluttered-mnist --batch 128   (any gatepool data set)

Builds the model at initialization, takes ``--batch`` training images, predicts the ideal
E[x²] forward and E[g²] backward after every module (:func:`gatepool.analysis.probe.predict`), measures
them with the correlation-aware ``predicted`` column beside (:func:`gatepool.analysis.probe.measure`,
``correlated=True``), prints the side-by-side table and writes ``DIR/probe.json``
and the figures (``DIR/*.png``). ``--device`` (auto: CUDA, else MPS, else CPU): the model is built and
the images drawn on the CPU (the same weights and batch anywhere), then both move there for the measurement.
A ``torchvision:NAME`` or ``timm:NAME`` model (random weights, nothing downloaded) is probed on N(0, 1)
noise images ``(batch, 3, size, size)``, or with ``--data NAME`` (any set :func:`gatepool.data.dataset_names`
lists: mnist, fashion-mnist, the canvases) on its images resized to ``size`` with their channel repeated
three times; its ideal rules averaged over the border
(``predict(border="average")``: small maps are mostly border).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gatepool.cli.args import UsageError, add_device, device, int_at_least, out_folder

# gatepool.data.dataset_names(), spelled out: importing gatepool.data imports torch (tests/test_cli.py
# holds the two equal)
DATA_SETS = ("mnist", "fashion-mnist", "translated-mnist", "cluttered-mnist", "distractor-mnist",
             "rotated-mnist")  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="signal-propagation probe: ideal vs measured variance per layer")
    p.add_argument("--model", default="residual_cnn",
                   help="model name (see gatepool.list_models()), "
                        "or torchvision:NAME / timm:NAME")  # fmt: skip
    p.add_argument(
        "--pool",
        default=None,
        help="gate of the model's pools (max, avg, soft, ...); default: the model's own",
    )
    p.add_argument("--data", default=None, choices=["noise", *DATA_SETS],
                   help="training images of a data set, or N(0,1) noise inputs (default: mnist for "
                        "gatepool's models, noise for torchvision/timm ones, whose images are resized "
                        "to --size)")  # fmt: skip
    p.add_argument("--batch", type=int_at_least(1), default=512, help="number of images (default 512)")
    p.add_argument("--size", type=int_at_least(8), default=64,
                   help="side of the images for a torchvision/timm model (default 64)")  # fmt: skip
    p.add_argument(
        "--seed", type=int_at_least(0), default=0, help="seed for the weights and the image choice"
    )
    p.add_argument(
        "--backward",
        choices=["unit-noise", "loss"],
        default="unit-noise",
        help="seed of the backward pass: unit-variance noise at the output, or the summed cross-entropy",
    )
    p.add_argument(
        "--no-predicted",
        action="store_true",
        help="leave out the correlation-aware 'predicted' column (seconds on a large model)",
    )
    add_device(p)
    p.add_argument("--out", default=None, help="folder for probe.json and the figures")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON instead of the table (no maps; probe.json has them)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import torch  # lazy: `gatepool --help` must not import torch

    from gatepool.analysis.probe import build_model, measure, predict, save_figures
    from gatepool.analysis.probe.external_models import resized_digits
    from gatepool.data import DataError
    from gatepool.models import create_model

    if args.out:
        out_folder(args.out)
    where = device(args)
    torch.manual_seed(args.seed)
    external = ":" in args.model  # torchvision:NAME, timm:NAME
    try:
        if external:
            if args.pool is not None:
                raise ValueError("--pool applies to gatepool's own models; convert() gates another's")
            model = build_model(args.model)
        else:
            model = create_model(args.model, **({"pool": args.pool} if args.pool is not None else {}))
    except (ValueError, TypeError) as e:  # a bad name, a model without pools, a library missing
        flag = "--pool" if args.pool is not None and "pool" in str(e) else "--model"
        raise UsageError(f"{flag}: {e}") from None
    data = args.data or ("noise" if external else "mnist")
    if external and data == "noise":
        g = torch.Generator().manual_seed(args.seed)
        inputs = torch.randn(args.batch, 3, args.size, args.size, generator=g)  # (B, 3, H, W)
        target = torch.randint(0, 10, (args.batch,), generator=g)
    else:
        try:
            inputs, target = _load_inputs(data, args.batch, args.seed)
        except DataError as e:  # a missing or corrupt data file: the message names it and how to get it
            print(f"error: {e}", file=sys.stderr)
            return 1
        if external:  # the images as a torchvision/timm model takes them: resized, three channels
            inputs = resized_digits(inputs, args.size)  # (B, 3, size, size)
    shape = tuple(inputs.shape)
    # the ideal starts from the batch's own mean and variance (N(0, 1) for noise)
    noise = data == "noise"
    input_stats = (0.0, 1.0) if noise else (float(inputs.mean()), float(inputs.var()))
    ideal = predict(model, shape, input_stats=input_stats, backward=args.backward, loss_reduction="sum",
                    border="average" if external else "middle")  # fmt: skip
    model, inputs, target = model.to(where), inputs.to(where), target.to(where)  # built on the CPU: same init
    report = measure(
        model,
        inputs,
        target=target if args.backward == "loss" else None,
        backward=args.backward,
        loss_reduction="sum",
        prediction=ideal,
        maps=True,
        correlated=inputs.dim() == 4 and not args.no_predicted,
    )
    report.setup = {
        "model": args.model,
        "pool": args.pool,
        "data": data,
        "batch": args.batch,
        "seed": args.seed,
        "backward": args.backward,
        "loss_reduction": report.loss_reduction if args.backward == "loss" else None,
        "input_shape": list(shape),
        "device": str(where),
    }
    if args.out:
        from gatepool.utils.io import atomic_write_text  # lazy: imports torch

        out = Path(args.out)
        atomic_write_text(out / "probe.json", report.to_json())
        figures = save_figures(report, out)
        if not args.json:
            print(f"wrote {out / 'probe.json'} and {len(figures)} figures", file=sys.stderr)
    if args.json:
        print(report.to_json(detail=False))
    else:
        print(report.table())
    return 1 if report.error else 0


def _load_inputs(data: str, batch: int, seed: int):
    """(B, 1, H, W) float inputs (normalized as the set's own) and (B,) labels: ``batch`` training images
    of ``data`` chosen by ``seed``."""
    import torch  # lazy: `gatepool --help` must not import torch

    if data == "noise":
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)
    from gatepool.data import load

    ds = load(data, "train")
    labels = torch.as_tensor(ds.labels)
    if batch > len(labels):
        raise UsageError(f"--batch {batch} is larger than the training set; choose 1 to {len(labels)}")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(labels), generator=g)[:batch]
    x = ds.images[idx].unsqueeze(1).float().div_(255.0)  # (B, 1, H, W): the chosen images only
    return x.sub_(ds.mean).div_(ds.std), labels[idx].long()
