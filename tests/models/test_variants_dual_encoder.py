"""The dual encoder (CLIP / SigLIP): separate towers, normalized embeddings, both losses, zero-shot."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatepool.models import create_model
from gatepool.models.digit_text import EOS, PAD, PROMPTS, DigitTokenizer, caption, sequence_caption
from gatepool.models.dual_encoder import DualEncoder, TextEncoder

SMALL = dict(dim=16, depth=1, num_heads=2, text_dim=16, text_depth=1, text_heads=2, embed_dim=8)


def test_tokenizer_round_trip_and_refusals():
    tok = DigitTokenizer(6)
    ids = tok.encode(["seven", "a 7", "three one four"])
    assert ids.shape == (3, 6) and ids[0, 2] == EOS and ids[0, 3] == PAD
    assert [tok.decode(i) for i in ids] == ["seven", "a 7", "three one four"]
    assert tok.digits(ids[2]) == [3, 1, 4] and caption(7, "a {num}") == "a 7"
    assert sequence_caption([3, 1, 4]) == "three one four" and len(PROMPTS) == 10
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("eleven")
    with pytest.raises(ValueError, match="max_len"):
        DigitTokenizer(4).encode("one two three")


def _batch(b=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(b, 1, 28, 28, generator=g)
    ids = DigitTokenizer(8).encode([caption(d % 10, "the digit {word}") for d in range(b)])
    return images, ids


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_shapes_unit_norm_and_separate_towers(loss):
    torch.manual_seed(0)
    model = DualEncoder(loss=loss, **SMALL).eval()
    images, ids = _batch()
    e_i, e_t = model.encode_image(images), model.encode_text(ids)
    assert e_i.shape == e_t.shape == (6, 8)
    torch.testing.assert_close(e_i.norm(dim=1), torch.ones(6))
    logits = model(images, ids)
    # change image 0: only row 0 of the similarity matrix moves; change caption 0: only column 0
    images2 = images.clone()
    images2[0] = torch.randn(1, 28, 28)
    moved = model(images2, ids) - logits
    assert moved[0].abs().max() > 1e-3 and torch.equal(moved[1:], torch.zeros_like(moved[1:]))
    ids2 = ids.clone()
    ids2[0, 3] = DigitTokenizer().index["nine"]
    moved = model(images, ids2) - logits
    assert moved[:, 0].abs().max() > 1e-3 and torch.equal(moved[:, 1:], torch.zeros_like(moved[:, 1:]))


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(0, 2**16))
def test_text_embedding_is_independent_of_the_images_batch(b, seed):
    """The text tower's output is the same whatever images share the batch (and the reverse)."""
    torch.manual_seed(1)
    model = DualEncoder(**SMALL).eval()
    images, ids = _batch(b, seed)
    other, _ = _batch(b, seed + 1)
    e_t = model.encode_text(ids)
    z1, z2 = model(images, ids), model(other, ids)
    assert torch.equal(model.encode_text(ids), e_t)
    # the caption columns of both logit matrices are exp(τ)·e_I·e_T with the same e_T
    torch.testing.assert_close(z1 / model.scale(), model.encode_image(images) @ e_t.T)
    torch.testing.assert_close(z2 / model.scale(), model.encode_image(other) @ e_t.T)


def test_text_encoder_is_causal_and_pools_the_eos_token():
    torch.manual_seed(0)
    enc = TextEncoder(max_len=8, dim=16, depth=2, num_heads=2).eval()
    ids = DigitTokenizer(8).encode(["a 7", "three one four"])
    tok = enc(ids)
    padded = ids.clone()
    padded[0, 5] = 5  # a token after EOS: the EOS feature must not move
    assert torch.equal(enc.pool(padded, enc(padded))[0], enc.pool(ids, tok)[0])
    with pytest.raises(ValueError, match="EOS"):
        enc.pool(torch.ones(1, 4, dtype=torch.long), torch.zeros(1, 4, 16))


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_loss_formulas_and_a_training_step_lowers_it(loss):
    torch.manual_seed(0)
    model = DualEncoder(loss=loss, **SMALL)
    images, ids = _batch(8)
    z = model(images, ids)
    if loss == "clip":
        t = torch.arange(8)
        want = 0.5 * (torch.nn.functional.cross_entropy(z, t) + torch.nn.functional.cross_entropy(z.T, t))
    else:
        y = 2 * torch.eye(8) - 1
        want = -torch.log(torch.sigmoid(y * z)).sum() / 8
    torch.testing.assert_close(model.loss(images, ids), want)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = model.loss(images, ids)
    for _ in range(10):
        opt.zero_grad()
        model.loss(images, ids).backward()
        opt.step()
    assert model.loss(images, ids).item() < 0.8 * first.item()
    assert model.logit_scale.grad is not None  # the temperature is learned


def test_zero_shot_and_state_dict_round_trip():
    torch.manual_seed(0)
    model = create_model("dual_encoder", **SMALL).eval()
    images, _ = _batch(5)
    pred, sim = model.zero_shot(images)
    assert pred.shape == (5,) and sim.shape == (5, 10) and torch.equal(pred, sim.argmax(1))
    copy = create_model("dual_encoder", **SMALL).eval()
    copy.load_state_dict(model.state_dict())
    assert torch.equal(copy.zero_shot(images)[1], sim)
    with pytest.raises(ValueError, match="loss"):
        DualEncoder(loss="triplet")
