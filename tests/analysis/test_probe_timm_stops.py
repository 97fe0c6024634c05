"""The rules that unblock timm's families where the correlated walk stopped, against Monte Carlo on
Gaussian fields of known correlation: a stride-1 avg pool without ``count_include_pad`` and
``pool(x) − x`` as a stencil with border-dependent weights (EfficientFormer's token mixer on a 56 × 56
map, too large for a dense matrix of the positions)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import DT, assert_walk_holds
from test_probe_zoo_rules import _map_against_monte_carlo

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe import register_correlated_rule
from gatepool.analysis.probe.correlated.adaptive import avg_windows
from gatepool.analysis.probe.correlated.reparam import _act as _after
from gatepool.analysis.probe.correlated.reparam import repvggdw_rule


def _pool(H, k, p, include, minus):
    A = [avg_windows(H, k, 1, p, False, include)] * 2
    return cr.pool_stencil(2, *A, (k, k), (p, p), minus_identity=minus)


@pytest.mark.parametrize("k, p, include, minus", [(3, 1, False, False), (3, 1, False, True),
                                                  (3, 1, True, True), (5, 1, False, False)])  # fmt: skip
def test_a_stride_one_pool_as_a_stencil_matches_monte_carlo(k, p, include, minus):
    """``avg_pool2d(x, k, 1, p, count_include_pad=...)`` and ``pool(x) − x``: mean, variance map and
    correlation forward, the gradient's backward (the border windows divided by their own taps)."""

    def fn(x):
        y = F.avg_pool2d(x, k, 1, p, count_include_pad=include)
        return y - x if minus else y

    _map_against_monte_carlo(_pool(9, k, p, include, minus), fn, 9)


class _TokenMixer(nn.Module):
    """EfficientFormer's and PoolFormer's token mixer ``pool(x) − x`` after a conv, then a pool and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.pool2 = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        x = self.conv(x)
        x = self.pool(x) - x
        return self.head(self.pool2(x).mean((2, 3)))


def test_the_walk_takes_a_stride_one_pool_and_its_difference_as_stencils():
    """The walk through the module and ``pool(x) − x`` against the measurement on 16 × 16 maps. The
    stencil is exact (above); the state after it keeps one stationary correlation per channel, which the
    border windows' own weights break: on 8 × 8 maps (most positions at the border) pool2's variance is
    12% high."""
    torch.manual_seed(0)
    model = _TokenMixer().double()
    x = torch.randn(1024, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=DT)
    assert_walk_holds(model, x, ["conv", "pool", "pool2", "head"])


class _Branch(nn.Module):
    def __init__(self, ci, co, k, groups) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ci, co, k, padding=k // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(co)


class SEModule(nn.Module):
    """timm's squeeze-and-excitation (the rule reads its parts by these names)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc1, self.bn, self.act = nn.Conv2d(c, 4, 1), nn.Identity(), nn.ReLU()
        self.fc2, self.gate = nn.Conv2d(4, c, 1), nn.Sigmoid()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.bn(self.fc1(x.mean((2, 3), keepdim=True))))))


class _RepBlock(nn.Module):
    """MobileOne's block at training time: two k × k branches, a 1 × 1 one and the identity's BatchNorm,
    added, then a ReLU (depthwise where ``groups`` is the width)."""

    def __init__(self, c: int = 2, groups: int = 2, se: bool = False) -> None:
        super().__init__()
        self.se, self.act = SEModule(c) if se else nn.Identity(), nn.ReLU()
        self.conv_kxk = nn.ModuleList([_Branch(c, c, 3, groups) for _ in range(2)])
        self.conv_scale = _Branch(c, c, 1, groups)
        self.identity = nn.BatchNorm2d(c)
        for m in self.modules():  # γ and β away from 1 and 0: each branch's affine map counts
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.3, 0.3)

    def forward(self, x, act: bool = True):
        out = self.identity(x) + self.conv_scale.bn(self.conv_scale.conv(x))
        for b in self.conv_kxk:
            out = out + b.bn(b.conv(x))
        return self.act(self.se(out)) if act else out


def _branches(block: _RepBlock) -> list:
    return [(b.conv, b.bn) for b in block.conv_kxk] + [(block.conv_scale.conv, block.conv_scale.bn),
                                                      (None, block.identity)]  # fmt: skip


@pytest.mark.parametrize("groups", [2, 1])
def test_a_reparameterisable_block_is_one_conv_and_matches_monte_carlo(groups):
    """The branches of one input folded into one conv (each BatchNorm in training at its predicted batch
    statistics): the sum's mean, variance map and correlation and the input's gradient against Monte
    Carlo. Taken as independent terms, the depthwise branches' sum is off by their cross terms."""
    torch.manual_seed(0)
    block = _RepBlock(groups=groups).double()
    rule = cr.Reparam(_branches(block))
    _map_against_monte_carlo(rule, lambda x: block.forward(x, act=False), 9)


@pytest.mark.parametrize("se", [False, True])
def test_the_walk_takes_a_reparameterisable_block_whole(se):
    """A conv, the block (its rule registered as timm's blocks' are) with its squeeze-and-excitation and
    its ReLU, a pool and a head: each row against the measurement."""
    torch.manual_seed(0)
    register_correlated_rule(_RepBlock, lambda m: cr.Reparam(_branches(m), act=_after(m)))
    model = nn.Sequential(nn.Conv2d(3, 2, 3, padding=1), _RepBlock(se=se), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(2, 5)).double()  # fmt: skip
    x = torch.randn(1024, 3, 12, 12, generator=torch.Generator().manual_seed(1), dtype=DT)
    assert_walk_holds(model, x, ["0", "1", "2", "4"])


def test_squeeze_excitation_as_one_step_matches_monte_carlo():
    """x · σ(fc2(ReLU(fc1(mean_p x)))) as one step (a re-parameterisable block's ``se``): forward and the
    input's gradient (the gate's path back to x, through the mean over 81 positions, is a small part)."""
    torch.manual_seed(0)
    se = SEModule(2).double()
    with torch.no_grad():
        se.fc1.weight.mul_(3.0)  # a gate that varies: the product's second moment E[s²] ≠ E[s]²
    _map_against_monte_carlo(cr.SqueezeExcite(se), se, 9)


def test_fastvit_repmixer_fold_matches_monte_carlo():
    """FastViT's RepMixer ``x + γ (mixer(x) − norm(x))``: a depthwise branch and the identity's BatchNorm
    less another identity BatchNorm, scaled per channel by γ (0.5 here: at init 1e-5), plus x."""
    torch.manual_seed(0)
    mixer, norm = _RepBlock(groups=2).double(), nn.BatchNorm2d(2).double()
    nn.init.uniform_(norm.weight, 0.5, 1.5)
    gamma = torch.tensor([0.5, -0.7], dtype=DT)
    branches = _branches(mixer) + [(None, norm)]
    rule = cr.Reparam(branches, [1.0] * 4 + [-1.0], scale=gamma, residual=True)

    def fn(x):
        return x + gamma[:, None, None] * (mixer.forward(x, act=False) - norm(x))

    _map_against_monte_carlo(rule, fn, 9)


class _RepVggDw(nn.Module):
    """RepViT's token mixer ``bn(conv(x) + conv1(x) + x)``: a depthwise 3 × 3 conv and its BatchNorm, a
    1 × 1 depthwise conv with a bias, the identity, then a BatchNorm (timm's, not ``legacy``)."""

    def __init__(self, c: int = 2) -> None:
        super().__init__()
        self.conv = nn.Sequential()
        self.conv.add_module("c", nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False))
        self.conv.add_module("bn", nn.BatchNorm2d(c))
        self.conv1, self.bn = nn.Conv2d(c, c, 1, groups=c), nn.BatchNorm2d(c)
        nn.init.uniform_(self.conv.bn.weight, 0.5, 1.5)

    def forward(self, x):
        return self.bn(self.conv(x) + self.conv1(x) + x)


def test_repvit_token_mixer_fold_matches_monte_carlo():
    """The three terms of one x folded into one depthwise conv, then the BatchNorm of their sum: forward and
    the input's gradient against Monte Carlo. Taken as independent terms, the sum's variance misses
    2 Cov(conv1(x), x) and the conv's centre tap's covariances with both, so the BatchNorm after it divides
    by the wrong σ."""
    torch.manual_seed(0)
    mixer = _RepVggDw().double()
    _map_against_monte_carlo(repvggdw_rule(mixer), mixer, 9)
