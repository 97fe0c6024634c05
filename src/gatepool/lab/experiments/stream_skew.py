"""Experiment 6.5 ``stream-skew``: the real stream through Tuesday's CNN is right-skewed.

On real digits the values of Tuesday's CNN are right-skewed after each pool and block,
skew = E[(x − μ)³]/σ³ > 0 (a max keeps the large values; the residual carries them on); the stem before
it (a conv with random-sign filters) has no sign of its own. The stages and the setup it shares with
head-chain: :mod:`gatepool.lab.common.cnn_at_init`.
"""

from __future__ import annotations

import torch

from gatepool.data import mnist_batch
from gatepool.lab.claims import Claim, Context, experiment
from gatepool.lab.common.cnn_at_init import QUICK, SETUP, STAGES, seeded_cnn


def skewness(x: torch.Tensor) -> float:
    """E[(x − μ)³]/σ³ over every value of ``x`` (float64)."""
    d = x.double().reshape(-1)
    d = d - d.mean()
    return (d.pow(3).mean() / d.pow(2).mean().pow(1.5)).item()


def _skew_claims(setup: dict) -> list[Claim]:
    claims = []
    claims.append(
        Claim(
            "skew-stem",
            "the stem's output (before any pool: a conv with random-sign filters) has no sign of its own: "
            "its skewness is positive for some seeds' inits and negative for others",
            True,
            0,
            "a direction at each seed (the seeds' values in the note)",
            kind="equal",
            depends=("pool",),
            source="ours",
            ref="a contrast of ours: the lecture speaks of the stream after the pools; a random-sign filter "
            "flips the skew of the digits' strokes",
        )
    )
    for stage in STAGES[1:]:
        claims.append(
            Claim(
                f"skew-{stage}",
                f"the stream after {stage} is right-skewed: the smallest skewness over the seeds > 0",
                0.0,
                0.0,
                "the sign at every seed (the least of the seeds is measured); per-seed values in the note",
                kind="min",
                depends=("pool",),
                source="lecture",
                ref="lecture, the real stream: 'right-skewed', after each pool and block",
            )
        )
    return claims


@experiment(
    "stream-skew",
    title="the real stream is right-skewed: skewness per stage of Tuesday's CNN on MNIST",
    order=6.5,
    setup=SETUP,
    quick=QUICK,
    claims=_skew_claims,
)
def stream_skew(ctx: Context) -> None:
    images, _ = mnist_batch(ctx["batch"])
    skews: dict[str, list[float]] = {s: [] for s in STAGES}
    for seed in ctx["seeds"]:
        model = seeded_cnn(ctx["pool"], seed).eval()
        h = images
        with torch.no_grad():
            for name in STAGES:
                h = getattr(model, name)(h)
                skews[name].append(skewness(h))
    stem = skews["stem"]
    ctx.check("skew-stem", min(stem) < 0 < max(stem), theory=True,
              note="seeds: " + ", ".join(f"{v:.2f}" for v in stem))
    for stage in STAGES[1:]:
        ctx.check(f"skew-{stage}", min(skews[stage]), theory=0.0,
                  note="seeds: " + ", ".join(f"{v:.2f}" for v in skews[stage]))
