"""Every `lecture` claim's measurement must depend on the code it names.

A claim counts as one of the lecture's *measured* claims only when its measurement runs our code on data
or on a model and could come out otherwise. This test replaces the code a claim names by a wrong one (a
mutation) and requires the claim's verdict to move from ``ok``; a claim whose verdict does not move
measures nothing of that code. Claims that cannot fail this way (restated arithmetic, definitions) are
``arithmetic``, and the walk at the end checks that every experiment with `lecture` claims is either
mutated here or named in ``NOT_MUTATED`` with the reason.
"""

from __future__ import annotations

import pytest
import torch.nn as nn

from gatepool.lab.experiments import registry
from gatepool.lab.harness import run_experiment


def _avg_for_max(module):
    real = module.create_pool

    def create_pool(gate, *args, **kwargs):  # the wrong gate: every "max" pool averages
        return real("avg" if gate == "max" else gate, *args, **kwargs)

    return create_pool


def _mutate_pool_variance(monkeypatch):
    import gatepool.lab.experiments.pool_variance as m

    monkeypatch.setattr(m, "create_pool", _avg_for_max(m))


def _mutate_max_normals(monkeypatch):
    import gatepool.lab.experiments.max_normals as m

    monkeypatch.setattr(m, "create_pool", _avg_for_max(m))


def _no_relu(monkeypatch):  # the ReLU of every step and block passes everything
    monkeypatch.setattr(nn, "ReLU", nn.Identity)


def _avg_cnn(module_name):
    def mutate(monkeypatch):
        import importlib

        from gatepool.models import ResidualCNN

        m = importlib.import_module(module_name)
        monkeypatch.setattr(m, "ResidualCNN", lambda **kw: ResidualCNN(**{**kw, "pool": "avg"}))

    return mutate


def _loud_stem(module_name):  # the stem initialized at twice its standard deviation
    def mutate(monkeypatch):
        import importlib

        from gatepool.models import ResidualCNN

        m = importlib.import_module(module_name)

        def loud(**kw):
            net = ResidualCNN(**kw)
            net.stem.weight.data.mul_(2.0)
            return net

        monkeypatch.setattr(m, "ResidualCNN", loud)

    return mutate


def _fused_explicit(monkeypatch):  # the "explicit" path secretly the fused kernel: no t × t gate held
    import gatepool.lab.bench.attention as bench

    real = bench.ways

    def ways():
        w = dict(real())
        w["ours (return_weights)"] = w["torch SDPA"]
        return w

    monkeypatch.setattr(bench, "ways", ways)


def _strided_unfold(monkeypatch):  # the backward's products read off every other position only
    import torch.nn.functional as F

    import gatepool.lab.experiments.init_rules as m

    real = F.unfold
    monkeypatch.setattr(m.F, "unfold", lambda x, k, padding=0: real(x, k, padding=padding, stride=2))


def _fixed_temperature(monkeypatch):  # the gate ignores τ
    import gatepool.layers as layers

    real = layers.GatedPool1d

    def pool(*args, temperature=1.0, **kwargs):
        return real(*args, temperature=1.0, **kwargs)

    monkeypatch.setattr(layers, "GatedPool1d", pool)


def _he_off(monkeypatch):  # the library's block conv initialized at half He's variance
    import gatepool.lab.experiments.init_rules as m
    from gatepool.models import ResidualCNN

    def half(**kw):
        net = ResidualCNN(**kw)
        net.block1.conv1.weight.data.mul_(0.5**0.5)
        return net

    monkeypatch.setattr(m, "ResidualCNN", half)


def _positional_trunk(monkeypatch):  # a trunk that knows where it is: not shift-equivariant
    import torch

    import gatepool.lab.experiments.flashcards as m

    real = m._trunk

    def trunk(model, x):
        out = real(model, x)
        return out + 1e-2 * torch.linspace(0, 1, out.shape[-1])

    monkeypatch.setattr(m, "_trunk", trunk)


# experiment -> (mutation, the lecture claims whose verdict must leave "ok")
MUTATIONS = {
    "pool-forward": (_mutate_pool_variance, ["max-mean", "max-variance"]),
    "max-normals": (_mutate_max_normals, ["pool-exceeds-1"]),
    "conv-forward": (_no_relu, ["relu-e2", "relu-mean", "relu-variance", "conv-variance"]),
    "conv-backward": (_no_relu, ["after-relu"]),
    "padding-map": (_no_relu, ["middle", "edge", "corner"]),
    "network-backward": (_avg_cnn("gatepool.lab.experiments.network"), ["pool-zeros", "spike-stem",
                                                                         "pool2-to-block1"]),
    # (an average pool instead of the max does NOT move measured-pool1: on smooth digits the 2×2 max
    # barely differs from the mean, and the seeds' ±30% covers both; the stem's init does move it)
    "network-forward": (_loud_stem("gatepool.lab.experiments.network"), ["measured-stem", "measured-pool1",
                                                                        "measured-block3"]),
    "attention-cost": (_fused_explicit, ["memory-exponent-explicit"]),
    "weight-uses": (_strided_unfold, ["uses-28", "uses-14"]),
    "temperature-dial": (_fixed_temperature, ["out-tau0.5", "out-tau2", "out-tau100", "gate3-tau2"]),
    "he-init": (_he_off, ["he-block"]),
    "head-chain": (_no_relu, ["relu"]),
    "definitions": (_positional_trunk, ["shift-equivariant"]),
}

# experiments with `lecture` claims that this file does not mutate, and why
NOT_MUTATED = {
    "he-fan-mode": "torch's own kaiming_normal_ on a torch conv: the claims test the rule, on torch's code",
    "stream-skew": "the skew of the real stream: a mutation of the pool keeps it positive (max and average "
                   "both keep the digits' strokes), so no one-line wrong code moves it",
    "soft-gate": "the same layer as temperature-dial (τ = 1 there; mutated at τ ≠ 1)",
    "soft-gradient": "autograd through the same layer as temperature-dial",
    "sqrt-d": "no code of ours: the lecture's own simulation of q·k, re-sampled",
    "flashcards": "identities of our attention and encoder (test_flashcards breaks them one by one)",
    "pool-comparison": "trainings (minutes): slow",
    "attention-reach": "trainings (minutes): slow",
    "attention-maps": "trained nets: slow",
    "shuffle": "trained nets: slow",
    "vit-mnist": "trainings: slow",
    "transformer-variants": "every bar is ours",
}


SLOW = {"network-forward", "network-backward", "attention-cost"}  # 15–30 s each: `make test-slow`


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(MUTATIONS)])
def test_a_wrong_code_path_moves_the_verdict(name, monkeypatch, tmp_path):
    mutate, ids = MUTATIONS[name]
    clean = {c["id"]: c for c in run_experiment(name, out=tmp_path / "clean", progress=False)["claims"]}
    for cid in ids:
        assert clean[cid]["source"] == "lecture", (name, cid)
        assert clean[cid]["verdict"] == "ok", (name, cid, clean[cid])
    mutate(monkeypatch)
    broken = {c["id"]: c for c in run_experiment(name, out=tmp_path / "broken", progress=False)["claims"]}
    moved = {cid: broken[cid]["verdict"] for cid in ids}
    assert all(v != "ok" for v in moved.values()), (name, moved)


def test_every_experiment_with_lecture_claims_is_mutated_or_says_why():
    reg = registry(beyond=False)
    with_lecture = {name for name, exp in reg.items()
                    if any(c.source == "lecture" for c in exp.claims(exp.resolve_setup("quick")))}
    unaccounted = with_lecture - set(MUTATIONS) - set(NOT_MUTATED)
    assert not unaccounted, sorted(unaccounted)
