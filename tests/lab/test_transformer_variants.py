"""transformer-variants on a tiny setup: every row, the structural claims hold exactly, the score claims
leave the card's bars once --set moves their training, and the figures are written."""

from __future__ import annotations

import math

import pytest

from gatepool.lab.claims import Context
from gatepool.lab.experiments.transformer_variants import VARIANTS, caption_perplexity_floor, variant_config
from gatepool.lab.harness import get

TINY = {"clip_steps": "3", "clip_batch": "8", "unet_steps": "2", "unet_batch": "4", "ddim_steps": "2",
        "samples_per_prompt": "1", "lm_steps": "3", "flamingo_steps": "2", "flamingo_batch": "4",
        "encdec_steps": "50", "test_size": "50", "galleries": "2", "captions_test": "6"}  # fmt: skip


def test_the_perplexity_floor_is_the_caption_entropy():
    # one slot: every caption is "w EOS": 10 equally likely captions over 2 tokens
    assert caption_perplexity_floor(1) == pytest.approx(math.sqrt(10))
    # three slots, by enumeration: p(caption of n digits) = 1/3 · 10^-n
    h = sum((1 / 3) * math.log(3 * 10**n) for n in (1, 2, 3))
    assert caption_perplexity_floor(3) == pytest.approx(math.exp(h / 3))


def test_configs_follow_the_setup():
    exp = get("transformer-variants")
    setup = exp.resolve_setup("full", {"clip_loss": "siglip", "unet_steps": "7"})
    assert variant_config(setup, "dual_encoder")["model_kwargs"] == {"loss": "siglip"}
    assert variant_config(setup, "cross_attention_unet")["steps"] == 7


@pytest.mark.slow
def test_a_tiny_run_checks_every_variant(tmp_path):
    exp = get("transformer-variants")
    ctx = Context(exp, "quick", exp.resolve_setup("quick", TINY), tmp_path, progress=False)
    exp.fn(ctx)
    claims = {c["id"]: c for c in ctx.claim_records()}
    for cid in ("encoder-only-equivariant", "encoder-decoder-causal", "decoder-only-causal",
                "dual-separate-towers", "unet-cross-attention-only", "flamingo-equals-lm-at-init"):
        assert claims[cid]["verdict"] == "ok", claims[cid]
    for cid in ("dual-zero-shot", "unet-follows-prompt", "flamingo-exact-match"):  # trained for seconds
        assert claims[cid]["bar"] is None and claims[cid]["verdict"] == "not run"
    assert [r["variant"] for r in ctx.data["rows"]] == [v[0] for v in VARIANTS]
    assert {p.rsplit("/", 1)[-1] for p in ctx.figures} == {"dual-encoder.png", "unet-samples.png",
                                                           "flamingo-captions.png"}  # fmt: skip


@pytest.mark.slow
def test_quick_judges_the_shipped_variants(tmp_path):
    """Quick with its training settings untouched loads the three shipped models (named in the claims and
    the record) instead of training them; smaller test sets keep it short."""
    exp = get("transformer-variants")
    setup = exp.resolve_setup("quick", {"test_size": "200", "galleries": "5", "captions_test": "40",
                                        "samples_per_prompt": "2", "encdec_steps": "50"})  # fmt: skip
    ctx = Context(exp, "quick", setup, tmp_path, progress=False)
    exp.fn(ctx)
    shipped = {"dual_encoder-s0", "cross_attention_unet-s0", "flamingo-s0"}
    assert shipped <= set(ctx.pretrained)
    claims = {c["id"]: c for c in ctx.claim_records()}
    assert claims["dual-recall-i2t"]["shipped_model"] == "dual_encoder-s0"
    assert claims["dual-recall-i2t"]["verdict"] == "ok"  # its bar does not depend on the test sizes
    assert claims["unet-follows-swapped-context"]["verdict"] == "ok"
    assert claims["lm-perplexity"]["verdict"] == "ok"
    assert claims["flamingo-exact-match"]["measured"] > 0.5  # bar moved with captions_test: measured only
    assert "train_seconds" not in ctx.data  # nothing trained but the encoder-decoder
