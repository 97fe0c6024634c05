"""Experiment 20.5 ``seq-demo-encdec``: the encoder–decoder learns seq-demo's task too, against the same bars.

An encoder over x and a causal decoder cross-attending to it; the task, the training and the claims:
:mod:`gatepool.lab.common.seq_task`.
"""

from __future__ import annotations

from gatepool.lab.claims import Context, experiment
from gatepool.lab.common.seq_task import QUICK, SETUP, seq_claims, train_and_check


@experiment("seq-demo-encdec", title="the encoder–decoder learns it too: the same task, the same bars",
            order=20.5, setup={**SETUP, "arch": "encoder-decoder"}, quick=QUICK, claims=seq_claims)
def seq_demo_encdec(ctx: Context) -> None:
    train_and_check(ctx)
