"""A residual block whose branch is exactly constant: timm zero-initialises each block's last BatchNorm
(``zero_init_last``: ResNet, RegNet, Res2Net …), so at init the branch is β = 0 and the block's output is
ReLU(x + 0) of a ReLU's output x. The sum is then not a normal mixture but r's own atoms: its gate at 0 is
shut (torch's ReLU passes no gradient at 0), and the law after the block is the stream's. Each against
Monte Carlo."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from test_probe_correlated import DT, assert_walk_holds

from gatepool.analysis.probe import correlated as cr


def test_a_constant_sums_gate_is_its_sign():
    """v = 0: P(x > 0) = 1[m > 0], the moments those of the point ReLU(m) (0 shut, not a half)."""
    m = torch.tensor([-0.5, 0.0, 0.7], dtype=DT)
    mu, e2, pos = cr.relu_moments_map(m, torch.zeros_like(m))
    assert torch.equal(pos, torch.tensor([0.0, 0.0, 1.0], dtype=DT))
    assert torch.allclose(mu, m.clamp_min(0)) and torch.allclose(e2, m.clamp_min(0) ** 2)


@pytest.mark.parametrize("shift", [0.0, -0.3, 0.2])
def test_a_constant_plus_a_relu_keeps_the_streams_law(shift):
    """ReLU(c + ReLU(y)) for a constant c (a branch of variance 0), three blocks in a row: the moments, the
    gate and the law's moments against 400000 draws; the law keeps its mass (a Gauss–Legendre density of
    a point mass would lose it). c = 0 (timm's init, β = 0) is exact; another c cuts the atoms (48 nodes
    over 9 sd) between two nodes, so P(x > 0) holds to their spacing only."""
    tol = 0.003 if shift == 0 else 0.02
    n = 400_000
    my, vy = torch.tensor([-0.4, 0.0, 0.6], dtype=DT), torch.tensor([0.5, 1.0, 2.0], dtype=DT)
    y = my + vy.sqrt() * torch.randn(n, 3, generator=torch.Generator().manual_seed(0), dtype=DT)
    mb, vb = torch.full((3,), shift, dtype=DT), torch.zeros(3, dtype=DT)
    law, x = cr.relu_law(my, vy), torch.relu(y)
    for _ in range(3):
        z = mb + x
        mean, e2, pos, both = cr.relu_of_sum_map(mb, vb, law)
        x = torch.relu(z)
        assert torch.allclose(mean, x.mean(0), rtol=0.01, atol=1e-3)
        assert torch.allclose(e2 - mean**2, x.var(0), rtol=0.02, atol=1e-3)
        assert torch.allclose(pos, (z > 0).double().mean(0), atol=tol)
        law = cr.relu_of_sum_law(mb, vb, law)
        assert torch.allclose(law.w.sum(-1), torch.ones(3, dtype=DT), atol=1e-9)
        assert torch.allclose((law.w * law.x).sum(-1), x.mean(0), rtol=0.01, atol=1e-3)
        assert torch.allclose(law.positive(), (x > 0).double().mean(0), atol=tol)


class _ZeroBranches(nn.Module):
    """A stem, then ``blocks`` residual blocks ReLU(BN(conv(x)) + x) whose BN has γ = 0 (timm's
    ``zero_init_last``); the shortcut x as it is (timm's ResNet) or through an ``nn.Identity`` (RegNet's)."""

    def __init__(self, blocks: int = 3, identity: bool = False, width: int = 6) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.convs = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in range(blocks))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(blocks))
        self.acts = nn.ModuleList(nn.ReLU() for _ in range(blocks))
        self.shortcut = nn.Identity() if identity else None
        self.head = nn.Linear(width, 5)
        for bn in self.bns:
            nn.init.zeros_(bn.weight)

    def forward(self, x):
        x = self.stem(x)  # (B, C, H, W)
        for conv, bn, act in zip(self.convs, self.bns, self.acts):
            shortcut = x if self.shortcut is None else self.shortcut(x)
            x = act(bn(conv(x)) + shortcut)
        return self.head(x.mean((2, 3)))  # (B, 5)


@pytest.mark.parametrize("identity", [False, True])
def test_the_walk_holds_through_zero_initialised_branches(identity):
    """Every block's output and the stem's ReLU, forward and backward: the two gates of ReLU(ReLU(y) + 0)
    are one (the gradient passes P(y > 0), not P(y > 0)², nor P(y > 0) · 3/4 from a gate half open at
    0), and through an ``nn.Identity`` shortcut the add still sees the ReLU's output."""
    torch.manual_seed(0)
    model = _ZeroBranches(identity=identity).double()
    x = torch.randn(2048, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=DT)
    assert_walk_holds(model, x, ["stem.2", "acts.0", "acts.1", "acts.2"])
