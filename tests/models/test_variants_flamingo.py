"""Flamingo: exactly the text LM at initialisation, causal, gated layers that open, a frozen LM, greedy
captions, the strip canvases, state_dict round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatepool.models import create_model
from gatepool.models.digit_strip import make_strips
from gatepool.models.digit_text import BOS, EOS, VOCAB_SIZE, DigitTokenizer, sequence_caption
from gatepool.models.flamingo import Flamingo, caption_loss

SMALL = dict(canvas_size=(28, 56), dim=16, depth=2, num_heads=2, max_len=6, vision_channels=(8, 16))


def _data(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (20, 28, 28), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (20,), generator=g)
    canvas, digits = make_strips(images, labels, n, 2, g)
    ids = DigitTokenizer(6).encode([sequence_caption(d) for d in digits])
    return canvas, digits, ids


def test_strips_hold_their_digits_left_to_right():
    g = torch.Generator().manual_seed(0)
    images = torch.stack([torch.full((28, 28), 10 * (k + 1), dtype=torch.uint8) for k in range(10)])
    canvas, digits = make_strips(images, torch.arange(10), 50, 3, g)
    assert canvas.shape == (50, 1, 28, 84)
    for c, d in zip(canvas, digits):
        slots = [int(round(c[0, 0, 28 * s].item() * 255 / 10)) - 1 for s in range(3)]
        assert [s for s in slots if s >= 0] == d and 1 <= len(d) <= 3
    with pytest.raises(ValueError, match="images"):
        make_strips(images[:, :20], torch.arange(10), 2)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**16))
def test_at_init_flamingo_is_exactly_the_text_lm(seed):
    torch.manual_seed(seed % 7)
    model = Flamingo(**SMALL).eval()
    canvas, _, ids = _data(3, seed)
    assert torch.equal(model(ids, canvas), model.lm(ids))
    assert torch.equal(model(ids, torch.rand_like(canvas)), model.lm(ids))  # whatever the image


def test_opened_gates_let_the_image_in_and_stay_causal():
    torch.manual_seed(0)
    model = Flamingo(**SMALL).eval()
    for block in model.xattn:
        torch.nn.init.constant_(block.attn_gate, 0.5)
        torch.nn.init.constant_(block.ff_gate, 0.5)
    canvas, _, ids = _data(3)
    out = model(ids, canvas)
    assert out.shape == (3, 6, VOCAB_SIZE)
    assert (out - model.lm(ids)).abs().max() > 1e-4
    assert (model(ids, torch.rand_like(canvas)) - out).abs().max() > 1e-4
    for j in (2, 4):
        ids2 = ids.clone()
        ids2[:, j] = (ids2[:, j] + 3) % VOCAB_SIZE
        out2 = model(ids2, canvas)
        torch.testing.assert_close(out2[:, :j], out[:, :j], rtol=0, atol=1e-6)
        assert (out2[:, j:] - out[:, j:]).abs().max() > 1e-5


def test_caption_loss_skips_padding():
    logits = torch.randn(2, 5, VOCAB_SIZE)
    ids = torch.tensor([[BOS, 5, EOS, 0, 0], [BOS, 5, 6, 7, EOS]])
    want = torch.nn.functional.cross_entropy(
        torch.cat([logits[0, :2], logits[1, :4]]), torch.tensor([5, EOS, 5, 6, 7, EOS]))
    torch.testing.assert_close(caption_loss(logits, ids), want)


def test_training_the_gated_layers_lowers_the_loss_and_leaves_the_lm_alone():
    torch.manual_seed(0)
    model = Flamingo(**SMALL).freeze_lm()
    lm_before = {k: v.clone() for k, v in model.lm.state_dict().items()}
    canvas, _, ids = _data(8)
    params = [p for p in model.parameters() if p.requires_grad]
    assert params and all(not p.requires_grad for p in model.lm.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    first = caption_loss(model(ids, canvas), ids).item()
    for _ in range(30):
        opt.zero_grad()
        caption_loss(model(ids, canvas), ids).backward()
        opt.step()
    assert caption_loss(model(ids, canvas), ids).item() < 0.8 * first
    assert all(torch.equal(v, model.lm.state_dict()[k]) for k, v in lm_before.items())
    assert all(b.attn_gate.item() != 0 for b in model.xattn)  # the gates opened


def test_generate_and_state_dict_round_trip():
    torch.manual_seed(0)
    model = create_model("flamingo", **SMALL).eval()
    canvas, _, _ = _data(3)
    out = model.generate(canvas)
    assert out.shape[0] == 3 and out.shape[1] <= 6 and (out[:, 0] == BOS).all()
    copy = create_model("flamingo", **SMALL).eval()
    copy.load_state_dict(model.state_dict())
    assert torch.equal(copy.generate(canvas), out)
    with pytest.raises(ValueError, match="canvas must be"):
        model(out, torch.zeros(3, 1, 28, 28))
