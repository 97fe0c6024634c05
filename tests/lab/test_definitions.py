"""definitions' block order and 2-D positions: the traced programs, and the claims failing on wrong code."""

from __future__ import annotations

import pytest
import torch

from gatepool.lab.experiments.definitions import (
    FLASHCARD_DECODER,
    FLASHCARD_ENCODER,
    block_program,
    program_differences,
)
from gatepool.lab.harness import run_experiment
from gatepool.layers.blocks import DecoderBlock, EncoderBlock
from gatepool.layers.positional import LearnedPositionalEmbedding2d


def _verdicts(tmp_path) -> dict[str, str]:
    rec = run_experiment("definitions", profile="quick", out=tmp_path, progress=False, device="cpu")
    assert rec["status"] == "complete", rec["error"]
    return {c["id"]: c["verdict"] for c in rec["claims"]}


def test_post_norm_blocks_trace_to_the_flashcards_programs():
    enc = block_program(EncoderBlock(16, 2, prenorm=False))
    assert [op for op, _ in enc] == ["self-attention", "add", "LayerNorm", "MLP", "add", "LayerNorm"]
    assert program_differences(enc, FLASHCARD_ENCODER) == 0
    dec = block_program(DecoderBlock(16, 2, prenorm=False), ("x", "context"))
    assert dec[3] == ("cross-attention", (3, "Z")) and program_differences(dec, FLASHCARD_DECODER) == 0
    # the pre-norm default norms before each sub-operation: not the flashcards' order
    assert program_differences(block_program(EncoderBlock(16, 2)), FLASHCARD_ENCODER) > 0
    assert program_differences(enc[:-1], FLASHCARD_ENCODER) == 1  # a missing last norm counts


class _NormInsideResidual(EncoderBlock):
    def forward(self, x, attn_mask=None, key_mask=None, is_causal=False, return_weights=False):
        x = x + self.norm1(self.attn(x))  # wrong: the norm on the branch, not after the add
        return self.norm2(x + self.mlp(x))


class _UnmaskedDecoder(DecoderBlock):
    def forward(self, x, context, attn_mask=None, key_mask=None, context_mask=None, is_causal=False):
        return super().forward(x, context, attn_mask, key_mask, context_mask, is_causal)


def test_the_order_claims_fail_on_a_wrong_block(tmp_path, monkeypatch):
    import gatepool.lab.experiments.definitions as m

    monkeypatch.setattr(m, "EncoderBlock", _NormInsideResidual)
    monkeypatch.setattr(m, "DecoderBlock", _UnmaskedDecoder)  # self-attention without the causal mask
    verdicts = _verdicts(tmp_path)
    assert verdicts["encoder-order"] == "off" and verdicts["decoder-order"] == "off"


def test_the_2d_positions_claim_fails_on_transposed_codes(tmp_path, monkeypatch):
    def transposed(self):  # P(r, c) = row_c + col_r: the grid read column-major
        return (self.rows[None, :, :] + self.cols[:, None, :]).reshape(self.height * self.width, self.dim)

    assert _verdicts(tmp_path / "right")["vit-2d-positions"] == "ok"
    monkeypatch.setattr(LearnedPositionalEmbedding2d, "embedding", transposed)
    assert _verdicts(tmp_path / "wrong")["vit-2d-positions"] == "off"


def test_block_program_names_what_it_cannot_map():
    block = EncoderBlock(16, 2, prenorm=False, norm="rms")  # RMSNorm is not the flashcards' LayerNorm
    steps = block_program(block)
    assert steps[2][0] == "RMSNorm" and program_differences(steps, FLASHCARD_ENCODER) == 2
    with pytest.raises(ValueError, match="inputs must name"):
        block_program(torch.nn.Linear(2, 2), ("input", "missing"))
