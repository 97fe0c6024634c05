"""Experiment 18 (flashcards), quick. Besides the verdicts: the hand normalization against explicit loops,
Var(q·k) against d, and the residual MLP stack against its mean-field prediction, all computed here."""

import math

import numpy as np
import pytest
import torch

from gatepool.lab.common.flashcard_checks import FAR
from gatepool.lab.experiments.flashcards import cross_attention_checks, normalize_over
from gatepool.lab.harness import run_experiment

MUST_HOLD = [
    "var-qk", "encoder-equivariant", "positions-break-equivariance", "causal-future-independent",
    "unmasked-sees-future", "cross-attention-query-local", "cross-attention-follows-context",
    "cross-attention-context-order",
    "layernorm-batch-independent", "batchnorm-train-batch-dependent", "batchnorm-eval-batch-independent",
    "norm-axes-batch", "norm-axes-layer", "norm-axes-instance", "norm-axes-group", "norm-axes-distinct",
    "residual-gradient-mlp",
]


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    return run_experiment("flashcards", out=tmp_path_factory.mktemp("fc"), progress=False)


def test_flashcards_reach_their_verdicts(record):
    c = {x["id"]: x for x in record["claims"]}
    assert record["status"] == "complete"
    assert set(MUST_HOLD) <= set(c)
    assert [i for i in MUST_HOLD if c[i]["verdict"] != "ok"] == []
    # a GroupNorm in every block keeps the plain stack's gradient from vanishing: it grows instead
    assert c["residual-gradient-preact"]["measured"] < 0 and c["residual-gradient-preact"]["verdict"] == "off"
    assert c["residual-gradient-transformer"]["measured"] is not None


def test_var_qk_is_d(record):
    c = {x["id"]: x for x in record["claims"]}
    d, n = record["setup"]["d"], record["setup"]["samples"]
    assert abs(c["var-qk"]["measured"] - d) < 5 * d * math.sqrt(2 / n)


def test_residual_mlp_matches_the_mean_field_prediction(record):
    # nn.Linear's default init has Var(w) = 1/(3 fan_in): a Linear scales ‖g‖² by 1/3, a ReLU by 1/2.
    # Without skips each block scales ‖g‖² by 1/18; with skips by 1 + 1/18. Over 32 blocks:
    depth = record["setup"]["residual_depth"]
    predicted = depth / 2 * (math.log10(18) + math.log10(19 / 18))
    c = {x["id"]: x for x in record["claims"]}
    assert abs(c["residual-gradient-mlp"]["measured"] - predicted) < 1.0
    rows = record["data"]["residual_gradients"]["mlp"]
    for r in rows:
        assert r["log10_ratio"] == pytest.approx(math.log10(r["with_skips"] / r["without"]), abs=1e-3)


def test_deep_residual_mlp_matches_the_mean_field_prediction(record):
    # at the flashcards' L ≫ 100 (152 blocks, float64): with skips ‖g‖² grows by 19/18 a block, without it
    # shrinks by 1/18, so log10(‖∇x‖/‖g‖) ≈ L/2·log10(19/18) = 1.8 with skips and −L/2·log10(18) = −95 without
    depth = record["setup"]["residual_deep"]
    c = {x["id"]: x for x in record["claims"]}
    assert c["residual-deep-mlp"]["verdict"] == "ok"
    assert abs(c["residual-deep-mlp"]["measured"] - depth / 2 * math.log10(19 / 18)) < 1.0
    for r in record["data"]["residual_deep"]["mlp"]:
        assert abs(r["without"] + depth / 2 * math.log10(18)) < 5.0


def _loop_normalize(x, kind, groups, eps=1e-5):
    """Statistics gathered element by element with numpy, per the flashcards' axes."""
    x = x.numpy().astype(np.float64)
    n, c, h, w = x.shape
    out = np.empty_like(x)
    if kind == "batch":
        cells = [(slice(None), ch) for ch in range(c)]
    elif kind == "layer":
        cells = [(i,) for i in range(n)]
    elif kind == "instance":
        cells = [(i, ch) for i in range(n) for ch in range(c)]
    else:
        size = c // groups
        cells = [(i, slice(g * size, (g + 1) * size)) for i in range(n) for g in range(groups)]
    for cell in cells:
        v = x[cell]
        out[cell] = (v - v.mean()) / np.sqrt(v.var() + eps)
    return torch.from_numpy(out)


@pytest.mark.parametrize("kind", ["batch", "layer", "instance", "group"])
def test_normalize_over_matches_explicit_loops(kind):
    x = torch.randn(4, 6, 3, 5, generator=torch.Generator().manual_seed(0)) * 2 + 1
    assert torch.allclose(normalize_over(x, kind, groups=3), _loop_normalize(x, kind, 3), atol=1e-10)


def test_bad_setting_is_reported(tmp_path):
    rec = run_experiment("flashcards", overrides={"residual_blocks": "mlp,resnet"}, out=tmp_path,
                         progress=False)
    assert rec["status"] == "error" and "residual_blocks" in rec["error"]


class _Ctx(dict):
    """The settings cross_attention_checks reads."""


def test_cross_attention_checks_catch_a_query_mixing_attention(monkeypatch):
    from gatepool.layers.attention import MultiHeadAttention

    ctx = _Ctx(dim=32, heads=4, context_tokens=10, seed=0)
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(0))
    local, follows, order = cross_attention_checks(ctx, x, torch.Generator().manual_seed(1))
    assert local < 1e-5 and follows > FAR and order < 1e-5
    forward = MultiHeadAttention.forward

    def mixes_queries(self, q, *args, **kwargs):  # a wrong cross-attention: every query sees the others' mean
        return forward(self, q + q.mean(1, keepdim=True), *args, **kwargs)

    monkeypatch.setattr(MultiHeadAttention, "forward", mixes_queries)
    local, _, _ = cross_attention_checks(ctx, x, torch.Generator().manual_seed(1))
    assert local > FAR
