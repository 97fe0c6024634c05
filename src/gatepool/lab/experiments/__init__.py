"""The lecture's experiments, one file per claim group; importing this package imports them all.

Each file declares its experiment with ``gatepool.lab.claims.experiment`` (claims, setups, the function
that measures); :func:`registry` lists them in the lecture's order. ``harness.py`` runs one,
``reproduce.py`` runs them all (resumable) and ``report.py`` writes the report.
"""

from __future__ import annotations

import importlib

from gatepool.lab.claims import Experiment, declared

# Claim groups, in the lecture's order.
GROUPS: list[str] = ["conv_variance", "pool_variance", "network", "soft_gate", "pool_comparison",
                     "attention_reach", "sqrt_d", "attention_cost", "flashcards", "seq_demo", "vit_mnist",
                     "init_rules", "conv_unrolled", "max_normals", "transformer_variants", "orange_numbers",
                     # beyond the lecture (``Experiment.beyond``): `reproduce --beyond`
                     "gate_matters", "distractor_study", "symmetry_gain"]

for _group in GROUPS:
    importlib.import_module(f"gatepool.lab.experiments.{_group}")


def registry(beyond: bool = True) -> dict[str, Experiment]:
    """Every declared experiment, in the lecture's order; ``beyond=False`` leaves out the extensions."""
    items = sorted(declared().items(), key=lambda kv: (kv[1].order, kv[0]))
    return {name: exp for name, exp in items if beyond or not exp.beyond}


__all__ = ["GROUPS", "registry"]
