"""Experiment 11 ``gradient-share``: max pool passes the gradient to ¼ of its inputs, the soft gates to all.

Every gate of the library pools i.i.d. N(0, 1) maps in 2×2 windows; the share of inputs that get a
non-zero gradient is counted by autograd.
"""

from __future__ import annotations

import torch

from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common import GATES

POOLS = list(GATES)  # every gate of the library, in its order


def _share_claims(setup: dict) -> list[Claim]:
    return [
        Claim(
            f"{p}",
            f"share of {p}-pool inputs that receive a non-zero gradient at initialization",
            0.25 if p == "max" else 1.0,
            0.01,
            "the share is exact up to ties and gradients that are exactly zero upstream (rare events)",
            source="arithmetic" if p in ("max", "avg", "soft") else "identity",
            ref="lecture, the gradient share: max pool reaches ¼ of its inputs, average and soft pooling all "
            "(by the gates' definitions: one winner in four, or every input a positive weight)"
            if p in ("max", "avg", "soft")
            else "the lecture's 'a soft gate reaches every input', applied to our other gates (each gives "
            "every input of its window a non-zero weight by its definition: no correct gate misses it)",
        )
        for p in setup["pools"]
    ]


@experiment(
    "gradient-share",
    title="max pool passes gradient to ¼ of its inputs, soft gates to all",
    order=11,
    setup={"pools": POOLS, "batch": 512, "seed": 0},
    quick={"batch": 64},
    claims=_share_claims,
)
def gradient_share(ctx: Context) -> None:
    from gatepool.data import load_dataset
    from gatepool.models import ResidualCNN

    ds = load_dataset("mnist", "train")
    x = ds.normalized()[: ctx["batch"]]  # (B, 1, 28, 28)
    y = ds.labels[: ctx["batch"]]
    for name in ctx["pools"]:
        torch.manual_seed(ctx["seed"])
        model = ResidualCNN(pool=name)
        inputs: list[torch.Tensor] = []

        def keep_input(_module, args, _inputs=inputs):
            args[0].retain_grad()
            _inputs.append(args[0])

        handles = [
            model.pool1.register_forward_pre_hook(keep_input),
            model.pool2.register_forward_pre_hook(keep_input),
        ]
        try:
            loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
            loss.backward()
        finally:
            for h in handles:
                h.remove()
        nonzero = sum(int((t.grad != 0).sum()) for t in inputs)
        total = sum(t.numel() for t in inputs)
        per_pool = [round(float((t.grad != 0).float().mean()), 4) for t in inputs]
        ctx.check(name, nonzero / total, note=f"pool1 {per_pool[0]}, pool2 {per_pool[1]}")
