"""The sequence models: tasks, causal property, greedy decoding, and a tiny smoke run of the demo."""

from __future__ import annotations

import pytest
import torch

from gatepool.models.seq import (
    SEP,
    DecoderLM,
    EncoderDecoder,
    format_seq_demo,
    make_task_batch,
    train_seq_demo,
)


def test_tasks():
    g = torch.Generator().manual_seed(0)
    x, y = make_task_batch("copy", 4, 6, g)
    assert x.shape == y.shape == (4, 6) and torch.equal(x, y) and 0 <= x.min() and x.max() <= 9
    x, y = make_task_batch("reverse", 4, 6, g)
    assert all(y[i].tolist() == x[i].tolist()[::-1] for i in range(4))
    x, y = make_task_batch("sort", 4, 6, g)
    assert all(y[i].tolist() == sorted(x[i].tolist()) for i in range(4))
    with pytest.raises(ValueError, match="task"):
        make_task_batch("add", 4, 6)


def test_decoder_lm_is_causal():
    torch.manual_seed(0)
    lm = DecoderLM(max_len=12, dim=32, depth=2, num_heads=4).eval()
    idx = torch.randint(0, 11, (2, 10))
    logits = lm(idx)
    assert logits.shape == (2, 10, 11)
    for j in (3, 7):
        idx2 = idx.clone()
        idx2[:, j] = (idx2[:, j] + 1) % 11  # change token j
        logits2 = lm(idx2)
        torch.testing.assert_close(logits2[:, :j], logits[:, :j], rtol=0, atol=1e-5)
        assert (logits2[:, j:] - logits[:, j:]).abs().amax() > 1e-4


def test_encoder_decoder_decoder_is_causal_and_reads_all_of_the_source():
    torch.manual_seed(0)
    model = EncoderDecoder(max_len=12, dim=32, depth=1, num_heads=4).eval()
    src, tgt = torch.randint(0, 10, (2, 6)), torch.randint(0, 11, (2, 6))
    logits = model(src, tgt)
    assert logits.shape == (2, 6, 11)
    tgt2 = tgt.clone()
    tgt2[:, 4] = (tgt2[:, 4] + 1) % 11
    torch.testing.assert_close(model(src, tgt2)[:, :4], logits[:, :4], rtol=0, atol=1e-5)
    src2 = src.clone()
    src2[:, -1] = (src2[:, -1] + 1) % 10  # the last source token reaches the first output
    assert (model(src2, tgt)[:, 0] - logits[:, 0]).abs().amax() > 1e-4


@pytest.mark.parametrize("cls", [DecoderLM, EncoderDecoder])
def test_generate_is_greedy_argmax(cls):
    torch.manual_seed(0)
    model = cls(max_len=12, dim=16, depth=1, num_heads=2).eval()
    x = torch.randint(0, 10, (3, 5))
    out = model.generate(x, 5)
    assert out.shape == (3, 5)
    # re-scoring the generated sequence with teacher forcing gives back the same argmax at every step
    if cls is DecoderLM:
        logits = model(torch.cat([x, torch.full((3, 1), SEP), out[:, :-1]], 1))[:, 5:]
    else:
        logits = model(x, torch.cat([torch.full((3, 1), SEP), out[:, :-1]], 1))
    assert torch.equal(logits.argmax(-1), out)


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_train_seq_demo_smoke(arch):
    res = train_seq_demo(arch=arch, task="sort", length=4, steps=3, eval_every=2, eval_size=8, batch_size=8,
                         dim=16, depth=1, num_heads=2, num_examples=2, progress=False, threads=1)  # fmt: skip
    assert [row["step"] for row in res["curve"]] == [2, 3]
    assert res["steps_run"] == 3 and len(res["examples"]) == 2
    for ex in res["examples"]:
        assert ex["target"] == "".join(sorted(ex["input"])) and len(ex["output"]) == 4
    assert 0.0 <= res["final_token_acc"] <= 1.0 and res["params"] > 0
    text = format_seq_demo(res)
    assert "token acc" in text and res["examples"][0]["input"] in text


def test_train_seq_demo_errors():
    with pytest.raises(ValueError, match="arch"):
        train_seq_demo(arch="rnn")
    with pytest.raises(ValueError, match="task"):
        train_seq_demo(arch="decoder", task="add")
    with pytest.raises(ValueError, match="steps"):
        train_seq_demo(arch="decoder", steps=0)
