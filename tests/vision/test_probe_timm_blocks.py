"""The correlated walk through timm's own blocks that had no rule (``make test-vision``): VGG's head
``ConvMlp`` (an ``if`` on its input's size that torch.fx cannot trace), TResNet's stem ``SpaceToDepth`` and
its anti-aliased downsampling ``BlurPool2d`` (a reflect pad, a functional conv) after a norm whose
activation is a LeakyReLU; each module's output variance and gradient E[g²] against the measurement."""

from __future__ import annotations

import pytest
import torch

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated_predict import predict_correlated

pytest.importorskip("timm")


def measured(net: torch.nn.Module, x: torch.Tensor, names: list[str]) -> dict[str, tuple[float, float]]:
    """Each named module's output Var and gradient E[g²] (the backward seeded with unit-variance noise at
    the logits, as predicted)."""
    out, grads = {}, {}

    def hook(m, a, y, n):
        out[n] = y.detach()
        y.register_hook(lambda g: grads.__setitem__(n, g.detach()))

    hooks = [net.get_submodule(n).register_forward_hook(lambda m, a, y, n=n: hook(m, a, y, n)) for n in names]
    logits = net(x.requires_grad_())
    seed = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    (logits * seed).sum().backward()
    for h in hooks:
        h.remove()
    return {n: (float(out[n].var(unbiased=False)), float(grads[n].pow(2).mean())) for n in names}


def _walk_holds(net: torch.nn.Module, x: torch.Tensor, names: list[str]) -> None:
    """Each named module's predicted Var within 10% and gradient E[g²] within 15% of the measured."""
    pred = predict_correlated(net, cr.measure_input(x), batch=len(x))
    assert not pred.notes, pred.notes
    for n, (var, e2) in measured(net, x, names).items():
        row = pred[n]
        assert row.var is not None and row.grad_e2 is not None, (n, row.note)
        assert abs(row.var / var - 1) < 0.10, (n, row.var)
        assert abs(row.grad_e2 / e2 - 1) < 0.15, (n, row.grad_e2)


class _VGGHead(torch.nn.Module):
    def __init__(self) -> None:
        from timm.models.vgg import ConvMlp

        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.MaxPool2d(2))  # fmt: skip
        self.pre_logits = ConvMlp(16, 64, kernel_size=7, drop_rate=0.0)  # a 4 × 4 map: pooled up to 7 × 7
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.pre_logits(self.features(x)).flatten(1))


def test_vgg_head_is_predicted_whole():
    torch.manual_seed(0)
    net = _VGGHead()
    x = torch.randn(2000, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    _walk_holds(net, x, ["features.2", "pre_logits"])


def test_vgg_head_conv_over_the_whole_map_is_the_conv_rule():
    """ConvMlp's fc1 (its kernel the pooled map's size: one output position) as a Linear over the
    flattened map: the conv rule's numbers, forward and backward, at a fraction of its cost."""
    from timm.models.vgg import ConvMlp

    from gatepool.analysis.probe.correlated.conv_mlp import WholeMap

    torch.manual_seed(0)
    fc1 = ConvMlp(6, 20, kernel_size=5).fc1.double()
    field = cr.measure_input(torch.randn(400, 6, 5, 5, generator=torch.Generator().manual_seed(1)).cumsum(3))
    field.components = None  # the channels as they are (both rules fold them alike)
    conv, whole = cr.rule_for(fc1)(fc1), WholeMap(fc1, cr.rule_for(fc1))
    a, b = conv.forward(field), whole.forward(field)
    assert isinstance(whole.step, cr.FlatLinear)
    assert torch.allclose(a.mean, b.mean) and torch.allclose(a.var, b.var, rtol=1e-9)
    dt = torch.float64
    g = cr.Field(torch.zeros(20, 1, 1, dtype=dt), torch.linspace(0.5, 2.0, 20, dtype=dt)[:, None, None],
                 torch.ones(20, 1, 1, dtype=dt))  # fmt: skip
    ga, gb = conv.backward(g), whole.backward(g)
    assert torch.allclose(ga.var, gb.var, rtol=1e-9)
    assert torch.allclose(ga.lag_sums(), gb.lag_sums(), rtol=1e-9, atol=1e-12)
    larger = cr.measure_input(torch.randn(50, 6, 7, 7, generator=torch.Generator().manual_seed(2)))
    whole.forward(larger)  # a 7 × 7 map: three output positions a side, the conv's own rule
    assert isinstance(whole.step, cr.Conv)


class _TResNetStem(torch.nn.Module):
    def __init__(self) -> None:
        from timm.layers import BatchNormAct2d, BlurPool2d, SpaceToDepth

        super().__init__()
        self.s2d = SpaceToDepth(4)
        self.conv = torch.nn.Conv2d(48, 64, 3, padding=1, bias=False)
        self.bn = BatchNormAct2d(64, act_layer=torch.nn.LeakyReLU)
        self.aa = BlurPool2d(64, filt_size=3, stride=2)  # given its channels, as TResNet's
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.aa(self.bn(self.conv(self.s2d(x)))).mean((2, 3)))


def test_tresnet_stem_and_blur_pool_are_predicted():
    torch.manual_seed(0)
    net = _TResNetStem()
    x = torch.randn(2000, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _walk_holds(net, x, ["s2d", "conv", "bn", "aa"])


class _SplitAttnNet(torch.nn.Module):
    """ResNeSt's split attention (timm's ``SplitAttn``, radix 2, its norm a BatchNorm) after a conv stem
    and a norm, then the global pool and a classifier of 256 logits (with few, their gradient's channels
    are correlated, which the state's are not)."""

    def __init__(self) -> None:
        from timm.layers import SplitAttn

        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.BatchNorm2d(64),
                                        torch.nn.ReLU())  # fmt: skip
        self.attn = SplitAttn(64, 64, radix=2, norm_layer=torch.nn.BatchNorm2d)
        self.fc = torch.nn.Linear(64, 256)

    def forward(self, x):
        return self.fc(self.attn(self.stem(x)).mean((2, 3)))


def test_resnest_split_attention_is_predicted_whole():
    torch.manual_seed(0)
    net = _SplitAttnNet()
    x = torch.randn(256, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    _walk_holds(net, x, ["stem.2", "attn"])


class _EfficientFormerTail(torch.nn.Module):
    """EfficientFormer's last stage from its ``Flat`` on: a 7 × 7 map of 32 channels (a patch conv) into
    49 tokens, one ``MetaBlock1d`` (LayerNorm, timm's EfficientFormer ``Attention``: queries and keys of
    32 channels a head, values of 128, 8 heads, interleaved in one qkv; layer scale; the MLP), the final
    LayerNorm, the mean over the tokens and the two heads averaged. Its Linears at EfficientFormer's init
    (normal of std 0.02, biases 0), the layer scales 1 (the model's 1e-5 would leave the block's rows a
    constant's fraction of the stream)."""

    def __init__(self) -> None:
        from timm.layers import trunc_normal_
        from timm.models.efficientformer import Flat, MetaBlock1d

        super().__init__()
        self.stem = torch.nn.Conv2d(3, 32, 4, stride=4)
        self.flat = Flat()
        self.block = MetaBlock1d(32, layer_scale_init_value=1.0)
        self.norm = torch.nn.LayerNorm(32)
        self.head, self.head_dist = torch.nn.Linear(32, 256), torch.nn.Linear(32, 256)
        for m in self.modules():
            if isinstance(m, torch.nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                torch.nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.norm(self.block(self.flat(self.stem(x)))).mean(1)
        return (self.head(x) + self.head_dist(x)) / 2


def test_efficientformer_attention_block_is_predicted():
    torch.manual_seed(0)
    net = _EfficientFormerTail()
    x = torch.randn(256, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    _walk_holds(net, x, ["block.norm1", "block.token_mixer", "block.ls1", "block.mlp.fc2", "block"])
