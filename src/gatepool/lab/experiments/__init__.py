"""The lecture's experiments, one file per claim group; importing this package registers them all.

See ``harness.py`` for how an experiment declares and checks its claims, ``reproduce.py`` for the
resumable run of them all, and ``report.py`` for the report.
"""

import importlib

from gatepool.lab.harness import Claim, Context, experiment, get, registry, run_experiment

# Claim groups, in the lecture's order.
GROUPS: list[str] = ["conv_variance", "pool_variance", "network", "soft_gate", "pool_comparison",
                     "attention_reach", "sqrt_d", "attention_cost", "flashcards", "seq_demo", "vit_mnist"]

for _group in GROUPS:
    importlib.import_module(f"gatepool.lab.experiments.{_group}")

__all__ = ["Claim", "Context", "experiment", "get", "registry", "run_experiment"]
