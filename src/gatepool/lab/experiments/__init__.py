"""The lecture's experiments, one file per experiment, named as the experiment: ``conv-forward`` is
``conv_forward.py``. Importing this package imports them all.

One flat folder rather than a folder per lecture section: the name a user types (``gatepool run
padding-map``, a row of the report) is the file to open, without knowing which section it belongs to.
What two or more experiments share (a family's setup, the attention nets and their trainings, the
lecture's window of scores, relative error, the gate list) lives in ``gatepool.lab.common``; no
experiment imports another's file.

Each file declares its experiment with ``gatepool.lab.claims.experiment`` (claims, setups, the function
that measures); :func:`registry` lists them in the lecture's order. ``harness.py`` runs one,
``reproduce.py`` runs them all (resumable) and ``report.py`` writes the report.
"""

from __future__ import annotations

import importlib

from gatepool.lab.claims import Experiment, declared

# Every experiment, in the lecture's order (its ``order``); experiment ``a-b`` is the module ``a_b``.
EXPERIMENTS: list[str] = [
    "conv-forward", "he-init", "he-fan-mode", "padding-map", "conv-unrolled", "conv-backward", "weight-uses",
    "pool-forward", "max-normals", "pool-backward", "pool-compound", "network-forward", "stream-skew",
    "network-backward", "orange-numbers", "head-chain", "soft-gate", "temperature-dial", "soft-gradient",
    "gradient-share", "pool-comparison", "adam-reach", "attention-reach", "conv-reach", "sqrt-d",
    "attention-maps", "shuffle", "attention-cost", "batchnorm", "flashcards", "definitions", "vit-mnist",
    "seq-demo", "seq-demo-encdec", "transformer-variants",
    # beyond the lecture (``Experiment.beyond``): `reproduce --beyond`
    "gate-matters", "distractor-study", "symmetry-gain",
]  # fmt: skip

for _name in EXPERIMENTS:
    importlib.import_module(f"gatepool.lab.experiments.{_name.replace('-', '_')}")


def registry(beyond: bool = True) -> dict[str, Experiment]:
    """Every declared experiment, in the lecture's order; ``beyond=False`` leaves out the extensions."""
    items = sorted(declared().items(), key=lambda kv: (kv[1].order, kv[0]))
    return {name: exp for name, exp in items if beyond or not exp.beyond}


__all__ = ["EXPERIMENTS", "registry"]
