"""A residual add whose branch is a function of the stream channel by channel (XCiT's local patch
interaction: depthwise conv, GELU, BatchNorm, depthwise conv, layer scale): the two terms' cross term per
channel, forward and backward, against Monte Carlo."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from test_probe_correlated import DT, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated_predict import predict_correlated


class _LPI(nn.Module):
    """x + γ · conv2(BN(GELU(conv1(x)))), both convs 3 × 3 depthwise."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(C, C, 3, padding=1, groups=C)
        self.act, self.bn = nn.GELU(), nn.BatchNorm2d(C)
        self.conv2 = nn.Conv2d(C, C, 3, padding=1, groups=C)

    def forward(self, x):
        return x + 0.7 * self.conv2(self.bn(self.act(self.conv1(x))))


class _Net(nn.Module):
    def __init__(self, C: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(C, C, 1, groups=C)  # the identity: its row's gradient is x's
        self.block, self.bn = _LPI(C), nn.BatchNorm2d(C)  # a BatchNorm after it divides channel by channel
        self.head = nn.Linear(C, 10)
        nn.init.ones_(self.stem.weight)
        nn.init.zeros_(self.stem.bias)

    def forward(self, x):
        return self.head(self.bn(self.block(self.stem(x))).mean((2, 3)))


def _predicted_and_measured(model: nn.Module, x: torch.Tensor, names=("stem", "block")) -> tuple:
    """The walk's prediction (x's statistics, x's batch), and the ``names`` modules' outputs and their
    gradients measured on x with a Gaussian ∂L/∂logits."""
    pred = predict_correlated(model, cr.measure_input(x), batch=len(x))
    acts, grads = {}, {}

    def hook(m, a, y, n):
        acts[n] = y.detach()
        y.register_hook(lambda g: grads.__setitem__(n, g))

    for name in names:
        model.get_submodule(name).register_forward_hook(lambda m, a, y, n=name: hook(m, a, y, n))
    out = model(x)
    seed = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=DT)
    (out * seed).sum().backward()
    return pred, acts, grads


def test_a_channelwise_branch_and_its_stream_share_their_cross_term():
    """16 channels of a 6 × 6 map, 2000 draws (at seed 0, torch 2.13.0: the block's variance within 1% of
    Monte Carlo's at every channel; x's E[g²] per channel 0.97–1.09, 0.03 off on average (the cross term
    added to the add's gradient alone, clamped at 0 where it is negative: one channel at 1.22). The add
    taken as independent: 0.78–1.83 forward, 0.77–2.02 backward (0.15 and 0.17 off on average); the cross
    term forward only: 0.64–2.91 backward)."""
    torch.manual_seed(0)
    C = 16
    model = _Net(C).double()
    x, _ = gaussian_field(C=C, H=6, W=6, ell=0.8, batch=2000)
    pred, acts, grads = _predicted_and_measured(model, x)
    fwd = pred["block"].field.var.mean((1, 2)) / acts["block"].var((0, 2, 3), unbiased=False)
    bwd = pred["stem"].grad.var.mean((1, 2)) / grads["stem"].pow(2).mean((0, 2, 3))
    assert float((fwd - 1).abs().max()) < 0.03, fwd
    assert float((bwd - 1).abs().mean()) < 0.08, bwd


class _ClassBlock(nn.Module):
    """XCiT's class attention block's first add on (B, T, C) tokens: x + cat(f(x̂_0), x̂[:, 1:]), x̂ = LN(x),
    f a Linear of the first token (in the class attention's place)."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.norm, self.f = nn.LayerNorm(C), nn.Linear(C, C)

    def forward(self, x):
        xn = self.norm(x)
        return x + torch.cat([self.f(xn[:, 0:1]), xn[:, 1:]], dim=1)


class _Tokens(nn.Module):
    """A class token (a parameter, as XCiT's) before the map's tokens, then :class:`_ClassBlock`."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, C))
        self.stem = nn.Conv2d(C, C, 1, groups=C)
        self.block, self.head = _ClassBlock(C), nn.Linear(C, 10)
        nn.init.ones_(self.stem.weight)
        nn.init.zeros_(self.stem.bias)

    def forward(self, x):
        t = self.stem(x).flatten(2).transpose(1, 2)
        t = self.block(torch.cat([self.cls.expand(len(x), -1, -1), t], dim=1))
        return self.head(t[:, 0] + t[:, 1:].mean(1))


def test_a_cat_of_tokens_leads_the_branch_back_to_its_stream():
    """x + cat(f(x̂_0), x̂[:, 1:]): the patches' sum doubles where their LayerNorm's gain meets the stream
    (a class token, a parameter, before 12 tokens, 16 channels, 2000 draws; at seed 0, torch 2.13.0: the
    patches' variance 1.00–1.01 of Monte Carlo's at every channel, x's E[g²] 0.93–1.12; the add taken as
    independent: 0.51 forward and 0.48–0.57 backward; the cross term forward only: 0.48–0.57 backward)."""
    torch.manual_seed(0)
    C = 16
    model = _Tokens(C).double()
    x, _ = gaussian_field(C=C, H=3, W=4, ell=0.8, batch=2000)
    pred, acts, grads = _predicted_and_measured(model, x)
    fwd = pred["block"].field.var[..., 1:].mean((1, 2)) / acts["block"][:, 1:].var((0, 1), unbiased=False)
    bwd = pred["stem"].grad.var.mean((1, 2)) / grads["stem"].pow(2).mean((0, 2, 3))
    assert float((fwd - 1).abs().max()) < 0.05, fwd
    assert float((bwd - 1).abs().mean()) < 0.08, bwd


class _PosConv(nn.Module):
    """Twins' position conv s + proj(s), proj a 3 × 3 depthwise conv of timm's init (std √(2/9): Σ_t w_t
    below −½ in a third of the channels, where the branch's gradient Gᵀg and the add's g cancel), then a
    full 3 × 3 conv, the mean over the positions and a Linear of orthonormal columns (the gradient's
    channels independent, as the per-channel state holds them); s the identity of x, or its ReLU (whose
    backward takes its users' gradients one by one)."""

    def __init__(self, C: int, relu: bool) -> None:
        super().__init__()
        self.stem = nn.Conv2d(C, C, 1, groups=C)
        self.act = nn.ReLU() if relu else nn.Identity()
        self.proj = nn.Conv2d(C, C, 3, padding=1, groups=C)
        self.mix, self.head = nn.Conv2d(C, C, 3, padding=1), nn.Linear(C, 2 * C)
        nn.init.ones_(self.stem.weight)
        nn.init.zeros_(self.stem.bias)
        nn.init.normal_(self.proj.weight, 0.0, (2 / 9) ** 0.5)
        nn.init.orthogonal_(self.head.weight)

    def forward(self, x):
        s = self.act(self.stem(x))
        return self.head(self.mix(self.proj(s) + s).mean((2, 3)))


@pytest.mark.parametrize("relu", [False, True], ids=["stream", "relu-stream"])
def test_a_position_conv_whose_gradients_cancel_keeps_their_cross_term_signed(relu):
    """16 channels of an 8 × 8 map, 4000 draws (at seed 0, torch 2.13.0: 10 channels with Σ_t w_t < −½;
    x's E[g²] per channel 0.99–1.08 of Monte Carlo's, 0.976–1.008 of the exact (the Jacobian's; Monte
    Carlo's own 0.92–1.01 of it); through the ReLU 1.00–1.08. The cross term added to the add's gradient
    alone, its variance clamped at 0 where it is negative: 0.99–10.2; the add taken as independent:
    0.58–19.0, as through the ReLU where it takes the two gradients one by one, each without the cross
    term)."""
    torch.manual_seed(0)
    C = 16
    model = _PosConv(C, relu).double()
    assert int((model.proj.weight.sum((1, 2, 3)) < -0.5).sum()) >= 3  # the cancelling channels are there
    x, _ = gaussian_field(C=C, H=8, W=8, ell=0.8, batch=4000)
    pred, _, grads = _predicted_and_measured(model, x, ("stem",))
    bwd = pred["stem"].grad.var.mean((1, 2)) / grads["stem"].pow(2).mean((0, 2, 3))
    assert float((bwd - 1).abs().max()) < 0.12, bwd  # Monte Carlo's noise per channel about 3%
    assert float((bwd - 1).abs().mean()) < 0.04, bwd
