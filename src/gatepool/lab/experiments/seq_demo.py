"""Experiment 20 ``seq-demo``: a causal decoder learns a digit-sequence task to 99% in < 2 minutes.

The task, the training and the claims it shares with seq-demo-encdec: :mod:`gatepool.lab.common.seq_task`.
"""

from __future__ import annotations

from gatepool.lab.claims import Context, experiment
from gatepool.lab.common.seq_task import QUICK, SETUP, seq_claims, train_and_check


@experiment("seq-demo", title="a decoder or an encoder–decoder learns a sequence task to 99% in < 2 minutes",
            order=20, setup=SETUP, quick=QUICK, claims=seq_claims)
def seq_demo(ctx: Context) -> None:
    train_and_check(ctx)
