"""Tuesday's CNN at initialization, as network-forward, network-backward, stream-skew, head-chain and
orange-numbers read it: 512 MNIST digits through the nets of five seeds' inits (``SETUP``; quick: 256
digits, three seeds), the stages a probe reads, each seed's probe report, the rules' ideal averaged over
the seeds, and the histograms of seed 0's values and gradients.

The variance of a stage depends on the random init: every measured claim is the mean over ``seeds``.
"""

from __future__ import annotations

import statistics

import torch

from gatepool.analysis.probe import measure
from gatepool.data import mnist_batch
from gatepool.lab.claims import Context
from gatepool.models import ResidualCNN
from gatepool.utils.plotting import pyplot

STAGES = ["stem", "pool1", "block1", "pool2", "block2", "block3"]
SETUP = {"batch": 512, "pool": "max", "seeds": [0, 1, 2, 3, 4]}
QUICK = {"batch": 256, "seeds": [0, 1, 2]}
SEED_WHY = (
    "mean over seeds; one init's stage variance differs from the next by up to ±30% "
    "(seeds 0–4: block 3 from 3.1 to 5.4)"
)


def seeded_cnn(pool: str, seed: int) -> ResidualCNN:
    """Tuesday's CNN with ``pool`` in both pools, initialized from ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return ResidualCNN(pool=pool)


def probe_seeds(ctx: Context, backward: str | None) -> list:
    """One probe report per seed, on the same digits."""
    x, _ = mnist_batch(ctx["batch"])
    reports = []
    for seed in ctx["seeds"]:
        reports.append(measure(seeded_cnn(ctx["pool"], seed), x, backward=backward, seed=seed, samples=20000))
    return reports


def mean_ideal(reports: list, stage: str, field: str = "grad_e2") -> float | None:
    """The rules' ``field`` (``var`` or ``grad_e2``) at ``stage``, averaged over the seeds' inits (the
    rules use each init's actual weights)."""
    values = [getattr(r[stage].ideal, field) for r in reports if r[stage].ideal]
    return statistics.fmean(values) if values else None


LECTURE_BACK = {"block3": 13.3e-6, "block2": 16.7e-6, "pool2": 22.2e-6, "block1": 5.5e-6}


def histograms(report, which: str):
    """Per stage, the sampled values (forward) or gradients (backward) of seed 0's net.

    Forward, over each the Gaussian the rules assume (the measured mean, the ideal σ²); backward, on a log
    scale, with the share of exact zeros: the spike at 0 below each max pool.
    """
    import numpy as np

    plt = pyplot()
    stages = STAGES if which == "forward" else list(LECTURE_BACK)
    fig, axes = plt.subplots(1, len(stages), figsize=(2.6 * len(stages), 2.6))
    for ax, stage in zip(axes, stages):
        row = report[stage]
        s = (row.samples if which == "forward" else row.grad_samples).double().numpy()
        ax.hist(s, bins=80, density=True, color="#47a", alpha=0.7)
        if which == "forward":
            var = row.ideal.var if row.ideal else row.forward.var
            x = np.linspace(s.min(), s.max(), 200)
            pdf = np.exp(-((x - row.forward.mean) ** 2) / (2 * var)) / np.sqrt(2 * np.pi * var)
            ax.plot(x, pdf, color="C3", lw=1.2, label=f"N(μ, {var:.2f})")
            ax.set_title(f"{stage}: σ² {row.forward.var:.2f}", fontsize=8)
            ax.legend(fontsize=6)
        else:
            ax.set_yscale("log")
            ax.set_title(f"{stage} out: g = 0 for {row.backward.zero_share:.0%}", fontsize=8)
        ax.tick_params(labelsize=6)
    fig.suptitle("seed 0: " + ("values per stage, the rules' Gaussian over them" if which == "forward"
                               else "gradients per stage (unit-variance at the logits)"), fontsize=9)
    fig.subplots_adjust(top=0.78, wspace=0.3)  # the panels' titles below the figure's
    return fig
