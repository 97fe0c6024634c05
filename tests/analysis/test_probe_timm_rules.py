"""timm's blocks' correlated rules against Monte Carlo: a product of two independent maps (StarNet,
MambaOut), a Linear over the tokens (MLP-Mixer, ResMLP), space to depth (TResNet's stem), a map padded by
reflection (TResNet's blur pool): each on Gaussian fields of known correlation, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_probe_correlated import DT, _ramp, assert_walk_holds, close, gaussian_field
from test_probe_zoo_rules import _map_against_monte_carlo

from gatepool.analysis.probe import correlated as cr


def _walk_holds(block: type, names: list[str]) -> None:
    """The walk through ``block`` (seed 0's init, float64) against 2048 N(0, 1) images of 3 × 8 × 8."""
    torch.manual_seed(0)
    model = block().double()
    x = torch.randn(2048, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT)
    assert_walk_holds(model, x, names)


def _backward(rule, y: torch.Tensor, xs: list[torch.Tensor], seed: int = 3) -> list[tuple]:
    """(the rule's gradient field, Monte Carlo's) of each input, the output's gradient a Gaussian field
    whose variance ramps."""
    C, h, w = y.shape[1:]
    g, gf = gaussian_field(C=C, H=h, W=w, var=_ramp(C, h, w, 0.3, 3.0), seed=seed, ell=1.0)
    (y * g).sum().backward()
    got = rule.backward(gf)
    return list(zip(got if isinstance(got, list) else [got], [x.grad for x in xs]))


def test_a_product_of_two_independent_maps_matches_monte_carlo():
    """StarNet's ``act(f1(x)) · f2(x)``: the product's mean, variance map and correlation, and each
    input's gradient g times the other (the two independent, their means and ramps unlike)."""
    H = 8
    a, fa = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, -0.5, 0.8), var=_ramp(2, H, H, 0.5, 2.0), ell=1.2)
    b, fb = gaussian_field(H=H, W=H, mean=_ramp(2, H, H, 1.0, -0.3), var=_ramp(2, H, H, 1.5, 0.4), ell=0.7,
                           seed=5)  # fmt: skip
    ar, br = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    y = ar * br
    rule = cr.Product()
    close(rule.forward([fa, fb]), y.detach())
    for got, want in _backward(rule, y, [ar, br]):
        close(got, want)
    with pytest.raises(ValueError, match="one shape"):
        rule.forward([fa, cr.Field(fb.mean[:1], fb.var[:1], fb.corr[:1])])


@pytest.mark.parametrize("bias", [False, True])
def test_a_linear_over_the_tokens_matches_monte_carlo(bias):
    """MLP-Mixer's token MLP: ``F.linear`` along the T tokens of each channel, (C, 1, T) → (C, 1, T_out)."""
    T, To = 12, 7
    x, f = gaussian_field(H=1, W=T, mean=_ramp(2, 1, T, -0.5, 0.8), var=_ramp(2, 1, T, 0.5, 2.0), ell=1.5)
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(To, T, generator=gen, dtype=DT) / T**0.5
    b = torch.randn(To, generator=gen, dtype=DT) if bias else None
    xr = x.clone().requires_grad_(True)
    y = F.linear(xr, weight, b)
    rule = cr.TokenLinear(weight, b)
    close(rule.forward(f), y.detach())
    for got, want in _backward(rule, y, [xr]):
        close(got, want)
    with pytest.raises(ValueError, match="T_out"):
        cr.TokenLinear(weight, torch.zeros(3))


def test_space_to_depth_then_a_conv_matches_monte_carlo():
    """TResNet's stem: ``SpaceToDepth(4)`` of a white map with a mean and a variance ramp (the N(0, 1)
    images' case), its three channels mixed (the input's components), then a 3 × 3 conv; forward at
    both, the gradient at the map. The conv has 64 outputs, as TResNet's: its backward, as every conv's
    in the state, leaves its inputs' gradients uncorrelated, here two positions of one block (with 5
    outputs their measured correlation is −0.04)."""
    H = 8
    z, fz = gaussian_field(C=3, H=H, W=H, mean=_ramp(3, H, H, -0.5, 0.8), var=_ramp(3, H, H, 0.5, 2.0),
                           ell=0.01)  # fmt: skip
    mix = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.3, -0.4, 0.9]], dtype=DT)
    x = torch.einsum("ir,brhw->bihw", mix, z)
    f = cr.measure_input(x)  # what the walk starts from: the channels' own covariance as components
    xr = x.clone().requires_grad_(True)
    y = _space_to_depth(xr, 4)
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(48, 64, 3, padding=1).double()
    out = conv(y)
    rule, crule = cr.SpaceToDepth(4), cr.Conv(conv.weight, conv.bias, (1, 1), (1, 1))
    fy = rule.forward(f)
    close(fy, y.detach(), lags=(1,))  # a 2 × 2 map
    close(crule.forward(fy), out.detach(), lags=(1,))
    (got, want), = _backward(_Both(rule, crule), out, [xr])
    close(got, want)


def _space_to_depth(x: torch.Tensor, bs: int) -> torch.Tensor:
    """timm's ``SpaceToDepth.forward`` (timm.layers.space_to_depth), its three lines."""
    N, C, H, W = x.size()
    x = x.view(N, C, H // bs, bs, W // bs, bs).permute(0, 3, 5, 1, 2, 4).contiguous()
    return x.view(N, C * bs * bs, H // bs, W // bs)


class _Both:
    def __init__(self, *steps) -> None:
        self.steps = steps

    def backward(self, g):
        for s in reversed(self.steps):
            g = s.backward(g)
        return g


def test_space_to_depth_of_a_map_correlated_within_its_blocks_has_no_rule():
    _, f = gaussian_field(H=8, W=8, ell=1.2)
    with pytest.raises(NotImplementedError, match="correlated within a block"):
        cr.SpaceToDepth(4).forward(f)


@pytest.mark.parametrize("pads, mode", [((1, 1, 1, 1), "reflect"), ((2, 0, 1, 3), "replicate"),
                                        ((1, 2, 0, 1), "circular")])  # fmt: skip
def test_a_map_padded_by_reflection_matches_monte_carlo(pads, mode):
    """BlurPool2d's ``F.pad(x, pads, mode='reflect')`` (and the two other copying modes): a border value's
    copies are the same value (the padded map's lags pair them), and its gradient gets theirs."""
    out, y = _map_against_monte_carlo(cr.ModePad(pads, mode), lambda x: F.pad(x, pads, mode=mode), 7)
    assert out.shape == y.shape[1:]
    with pytest.raises(ValueError, match="mode must be"):
        cr.ModePad(pads, "constant")


class _Star(torch.nn.Module):
    """StarNet's block: a depthwise conv, two 1 × 1 convs, ``relu6(f1) · f2``, a 1 × 1 conv, the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.f1, self.f2 = torch.nn.Conv2d(16, 32, 1), torch.nn.Conv2d(16, 32, 1)
        self.act = torch.nn.ReLU6()
        self.g = torch.nn.Conv2d(32, 16, 1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x)
        x = x + self.g(self.act(self.f1(y)) * self.f2(y))
        return self.fc(x.mean((2, 3)))


def test_the_walk_carries_a_product_of_two_maps():
    _walk_holds(_Star, ["f1", "f2", "act", "g"])


class _GatedChannelsLast(torch.nn.Module):
    """MambaOut's gated block, channels last: LayerNorm, fc1, split, a depthwise conv of one piece (permuted
    to channels first and back), ``gelu(g) · cat((i, c), -1)``, fc2, the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 48)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(24, 16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x).permute(0, 2, 3, 1)  # (B, H, W, C)
        g, i, c = torch.split(self.fc1(self.norm(x)), [24, 16, 8], dim=-1)
        c = self.conv(c.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        x = x + self.fc2(self.act(g) * torch.cat((i, c), dim=-1))
        return self.head(x.permute(0, 3, 1, 2).mean((2, 3)))


def test_the_walk_carries_a_cat_and_a_product_channels_last():
    _walk_holds(_GatedChannelsLast, ["norm", "fc1", "conv", "act", "fc2"])


class _MeanChannelsLast(torch.nn.Module):
    """MambaOut's head: the mean over the positions of a channels-last map, ``x.mean((1, 2))``, then an
    MLP (of 256 logits: with 10, their gradient fcᵀ s is correlated across fc1's outputs, 0.3, which the
    state's uncorrelated channels leave out, 1.08–1.2 at the map whichever the layout)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.LayerNorm(16)
        self.fc1, self.act, self.fc = torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 256)

    def forward(self, x):
        x = self.norm(self.stem(x).permute(0, 2, 3, 1))  # (B, H, W, C)
        return self.fc(self.act(self.fc1(x.mean((1, 2)))))  # (B, C) pooled


def test_the_walk_carries_a_mean_over_the_positions_channels_last():
    _walk_holds(_MeanChannelsLast, ["norm", "fc1", "act"])


class _TokenMixer(torch.nn.Module):
    """MLP-Mixer's block and ResMLP's affine: patches as tokens, ``β + α · x`` (torch.addcmul), a token MLP
    over the transposed tokens, a channel Linear, the mean over the tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 2, stride=2)
        self.alpha = torch.nn.Parameter(torch.linspace(0.5, 1.5, 16).reshape(1, 1, 16))
        self.beta = torch.nn.Parameter(torch.linspace(-0.2, 0.3, 16).reshape(1, 1, 16))
        self.tokens1, self.tokens2 = torch.nn.Linear(16, 24), torch.nn.Linear(24, 16)
        self.act = torch.nn.GELU()
        self.channels = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)  # (B, 16 tokens, 16 channels)
        y = torch.addcmul(self.beta, self.alpha, x)
        x = x + self.tokens2(self.act(self.tokens1(y.transpose(1, 2)))).transpose(1, 2)
        x = x + self.channels(x)
        return self.head(x.mean(1))


def test_the_walk_carries_a_token_mlp_and_an_affine():
    _walk_holds(_TokenMixer, ["tokens1", "act", "tokens2", "channels"])


class _TokenSlices(torch.nn.Module):
    """CrossViT's slices of its tokens with an Ellipsis: the first kept as a token (``x[:, 0:1, ...]``), the
    others (``x[:, 1:, ...]``), each through its own Linear and put back together."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 2, stride=2)
        self.first, self.rest = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)  # (B, 16 tokens, 16 channels)
        x = torch.cat((self.first(x[:, 0:1, ...]), self.rest(x[:, 1:, ...])), dim=1)
        return self.head(x.mean(1))


def test_the_walk_slices_tokens_with_an_ellipsis():
    _walk_holds(_TokenSlices, ["first", "rest"])


@pytest.mark.parametrize("start, stop", [(0, 1), (1, 17), (3, 9)])
def test_a_slice_of_tokens_is_their_position_map(start, stop):
    """The cut tokens and the gradient padded back: the numbers of the slice's (T, T) position map (its
    covariance A Cov Aᵀ, 5 GB at CoaT's 3,137 tokens) to 1e-10."""
    T = 17
    mean, var = _ramp(3, 1, T, -0.5, 0.8), _ramp(3, 1, T, 0.5, 2.0)
    _, f = gaussian_field(C=3, H=1, W=T, mean=mean, var=var, ell=2.0)
    n = stop - start
    _, g = gaussian_field(C=3, H=1, W=n, var=_ramp(3, 1, n, 0.3, 3.0), seed=3, ell=1.0)
    ours = cr.TokenSlice(start, stop)
    dense = cr.PositionMap(torch.eye(T, dtype=DT)[start:stop], (1, n))
    for a, b in ((ours.forward(f), dense.forward(f)), (ours.backward(g), dense.backward(g))):
        for t in ("mean", "var", "corr"):
            torch.testing.assert_close(getattr(a, t), getattr(b, t), rtol=0, atol=1e-10)


class _BlurPool(torch.nn.Module):
    """TResNet's anti-aliased downsampling: LeakyReLU, ``F.pad(x, [1] * 4, mode='reflect')``, a binomial
    blur by ``F.conv2d(x, filt, stride=2, groups=C)``, filt (C, 1, 3, 3) (timm's BlurPool2d given its
    channels, as TResNet's)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.act = torch.nn.LeakyReLU(0.1)
        b = torch.tensor([1.0, 2.0, 1.0]) / 4
        self.register_buffer("filt", (b[:, None] * b[None, :]).repeat(16, 1, 1, 1))  # (16, 1, 3, 3)
        self.conv = torch.nn.Conv2d(16, 16, 1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = F.pad(self.act(self.stem(x)), [1, 1, 1, 1], mode="reflect")
        x = F.conv2d(x, self.filt, stride=2, groups=16)
        return self.fc(self.conv(x).mean((2, 3)))


def test_the_walk_carries_a_leaky_relu_and_a_blur_pool():
    _walk_holds(_BlurPool, ["act", "conv"])


class _Swish(torch.nn.Module):
    """timm's ``swish``: ``x · sigmoid(x)``, a product of a map and a function of its own channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        x = self.norm(self.conv(x))
        return (x * x.sigmoid()).mean((2, 3))


def test_a_product_of_a_map_and_a_function_of_itself_has_no_rule():
    """The two factors are not independent (both the same channels of one tensor): no prediction, said."""
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    pred = predict_correlated(_Swish().double(), cr.measure_input(torch.randn(64, 3, 6, 6, dtype=DT)))
    assert pred["(output)"].var is None
    assert "not two independent maps" in pred["(output)"].note


class _PadToWindows(torch.nn.Module):
    """Swin's block before its window partition: a channels-last map padded at its bottom and right to
    whole windows of ``window``, ``F.pad(x, (0, 0, 0, pad_w, 0, pad_h))`` (6 sides), the pads computed from
    the map's size (0 where it is whole), then a LayerNorm and a Linear per position; ``window`` None: no
    pad."""

    def __init__(self, window: int | None = 4) -> None:
        super().__init__()
        self.window = window
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x).permute(0, 2, 3, 1)  # (B, H, W, C)
        if self.window is not None:
            _, H, W, _ = x.shape
            w = self.window
            x = F.pad(x, (0, 0, 0, (w - W % w) % w, 0, (w - H % w) % w))
        x = self.fc(self.norm(x))
        return self.head(x.mean((1, 2)))


def test_a_pad_of_zero_on_every_side_is_the_tensor_itself():
    """A map already whole in windows (8 × 8, windows of 4): the 6-sided pad adds nothing, the walk goes
    on through it as through the identity (the same numbers as the net without it) and holds against the
    measurement; where the pad adds a row (windows of 3) the walk still stops there, saying why."""
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    _walk_holds(_PadToWindows, ["norm", "fc"])
    torch.manual_seed(0)
    net = _PadToWindows().double()
    stats = cr.measure_input(torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT))
    plain = _PadToWindows().double()
    plain.load_state_dict(net.state_dict())
    plain.window = None
    a, b = predict_correlated(net, stats), predict_correlated(plain, stats)
    assert a["fc"].var == b["fc"].var and a["(input)"].grad_e2 == b["(input)"].grad_e2
    net.window = 3
    row = predict_correlated(net, stats)["fc"]
    assert row.var is None and "pad in mode 'constant' of 6 sides" in row.note
