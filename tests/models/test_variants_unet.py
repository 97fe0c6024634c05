"""The cross-attention UNet and its diffusion: the caption enters through cross-attention only, the loss,
DDIM's determinism, guidance, and state_dict round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gatepool.models import create_model
from gatepool.models.diffusion import DDPMSchedule
from gatepool.models.digit_text import WORDS, DigitTokenizer
from gatepool.models.unet import CrossAttentionUNet

SMALL = dict(image_size=8, channels=(8, 16), attn_levels=(1,), num_heads=2, text_dim=8, text_depth=1)
TOK = DigitTokenizer(8)


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    model = CrossAttentionUNet(**{**SMALL, **kw}).eval()
    for m in model.modules():  # open the zero-initialised output projections, so every path carries signal
        if hasattr(m, "proj_out"):
            torch.nn.init.normal_(m.proj_out.weight, std=0.2)
    return model


def _ids(digits):
    return TOK.encode([f"the digit {WORDS[d]}" for d in digits])


def test_shapes_and_refusals():
    model = _model()
    x, t = torch.randn(3, 1, 8, 8), torch.tensor([0, 10, 999])
    assert model(x, t, _ids([1, 2, 3])).shape == (3, 1, 8, 8)
    with pytest.raises(ValueError, match="x must be"):
        model(torch.randn(3, 1, 6, 6), t, _ids([1, 2, 3]))
    with pytest.raises(ValueError, match="exactly one"):
        model(x, t)
    with pytest.raises(ValueError, match="divisible"):
        CrossAttentionUNet(image_size=6, channels=(8, 16, 16))
    assert len(model.cross_attentions()) == 3  # level 1 down, middle, level 1 up


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 9), st.integers(0, 9), st.integers(0, 999))
def test_the_caption_enters_through_cross_attention_only(a, b, t):
    """With every cross-attention's output zeroed, ε̂ is the same for any two captions, bit for bit;
    with them in place, different captions give different ε̂."""
    model = _model()
    x, tt = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(t)), torch.full((2,), t)
    if a != b:
        assert (model(x, tt, _ids([a, a])) - model(x, tt, _ids([b, b]))).abs().max() > 1e-6
    for attn in model.cross_attentions():
        torch.nn.init.zeros_(attn.to_out.weight)
        torch.nn.init.zeros_(attn.to_out.bias)
    assert torch.equal(model(x, tt, _ids([a, a])), model(x, tt, _ids([b, b])))


def test_padding_of_the_caption_is_masked():
    model = _model()
    x, t = torch.randn(1, 1, 8, 8), torch.tensor([5])
    ids = _ids([4])
    ctx, mask = model.encode_text(ids)
    assert mask.tolist() == [(ids[0] != 0).tolist()]
    ctx2 = ctx.clone()
    ctx2[0, ~mask[0]] = 100.0  # change the features of the padding positions only
    assert torch.equal(model(x, t, context=(ctx, mask)), model(x, t, context=(ctx2, mask)))


def test_q_sample_and_the_loss_lowers_with_training():
    s = DDPMSchedule(100)
    x0, noise = torch.randn(4, 1, 8, 8), torch.randn(4, 1, 8, 8)
    t = torch.tensor([0, 10, 50, 99])
    ab = s.alpha_bar[t].float().view(-1, 1, 1, 1)
    torch.testing.assert_close(s.q_sample(x0, t, noise), ab.sqrt() * x0 + (1 - ab).sqrt() * noise)
    torch.manual_seed(0)
    model = CrossAttentionUNet(**SMALL)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x0 = torch.rand(16, 1, 8, 8) * 2 - 1
    ids, null = _ids(list(range(10)) + list(range(6))), TOK.encode("")[0]

    def loss():
        return s.loss(model, x0, ids, null, 0.1, torch.Generator().manual_seed(3))

    first = loss().item()
    for _ in range(30):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < 0.7 * first


def test_ddim_is_deterministic_from_a_seed_and_guidance_one_is_conditional():
    model, s = _model(), DDPMSchedule(50)
    ids, null = _ids([3, 7]), TOK.encode("")[0]

    def run(seed, w=1.0):
        g = torch.Generator().manual_seed(seed)
        return s.ddim_sample(model, ids, null, steps=5, guidance=w, generator=g)

    a, b, c = run(0), run(0), run(1)
    assert a.shape == (2, 1, 8, 8) and torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(run(0, 3.0), a) and a.abs().max() <= 1.5  # x̂₀ clamped: samples stay in range
    with pytest.raises(ValueError, match="steps"):
        s.ddim_sample(model, ids, null, steps=0)


def test_ddim_with_one_step_returns_the_predicted_x0():
    model, s = _model(), DDPMSchedule(50)
    ids, null = _ids([5]), TOK.encode("")[0]
    noise = torch.randn(1, 1, 8, 8)
    out = s.ddim_sample(model, ids, null, steps=1, noise=noise)
    ab = s.alpha_bar[49].item()
    eps = model(noise, torch.tensor([49]), ids)
    torch.testing.assert_close(out, ((noise - (1 - ab) ** 0.5 * eps) / ab**0.5).clamp(-1, 1))


def test_state_dict_round_trip():
    model = _model()
    copy = create_model("cross_attention_unet", **SMALL).eval()
    copy.load_state_dict(model.state_dict())
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([1, 2])
    assert torch.equal(copy(x, t, _ids([0, 9])), model(x, t, _ids([0, 9])))
