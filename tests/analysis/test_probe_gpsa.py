"""ConViT's gated positional self-attention against Monte Carlo: timm's ``GPSA`` written out in plain
torch (its forward, its relative offsets and its local init), its rule (``correlated/gpsa.py``) on a
Gaussian field of tokens."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import _ramp, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.gpsa import gpsa_rule

B = 2000


class _GPSA(torch.nn.Module):
    """timm's ConViT ``GPSA`` as timm writes it, after its ``local_init`` (v the identity, each head's
    positional scores peaked at its own offset)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.dim, self.num_heads, self.scale = dim, num_heads, (dim // num_heads) ** -0.5
        self.qk = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.v = torch.nn.Linear(dim, dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim)
        self.pos_proj = torch.nn.Linear(3, num_heads)
        self.attn_drop, self.proj_drop = torch.nn.Dropout(0.0), torch.nn.Dropout(0.0)
        self.gating_param = torch.nn.Parameter(torch.ones(num_heads))
        with torch.no_grad():
            self.v.weight.copy_(torch.eye(dim))
            k = int(num_heads**0.5)
            center = (k - 1) / 2 if k % 2 == 0 else k // 2
            for h1 in range(k):
                for h2 in range(k):
                    p = h1 + k * h2
                    self.pos_proj.weight[p] = torch.tensor([2 * (h2 - center), 2 * (h1 - center), -1.0])

    def get_rel_indices(self, n: int) -> torch.Tensor:
        side = int(n**0.5)
        ind = torch.arange(side, dtype=torch.float32).view(1, -1) - torch.arange(
            side, dtype=torch.float32
        ).view(-1, 1)
        indx = ind.repeat(side, side)
        indy = ind.repeat_interleave(side, dim=0).repeat_interleave(side, dim=1)
        rel = torch.stack((indx, indy, indx**2 + indy**2), -1)[None]
        return rel.to(self.qk.weight.dtype)

    def forward(self, x):
        B, N, C = x.shape
        h = self.num_heads
        qk = self.qk(x).reshape(B, N, 2, h, C // h).permute(2, 0, 3, 1, 4)
        patch = ((qk[0] @ qk[1].transpose(-2, -1)) * self.scale).softmax(dim=-1)
        pos = self.pos_proj(self.get_rel_indices(N).expand(B, -1, -1, -1)).permute(0, 3, 1, 2).softmax(-1)
        g = torch.sigmoid(self.gating_param).view(1, -1, 1, 1)
        attn = (1.0 - g) * patch + g * pos
        attn = attn / attn.sum(dim=-1).unsqueeze(-1)
        v = self.v(x).reshape(B, N, h, C // h).permute(0, 2, 1, 3)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize("ell", [0.1, 0.8], ids=["independent-tokens", "correlated-tokens"])
def test_gpsa_matches_monte_carlo(ell):
    """16 tokens of a 4 × 4 map of a mean ramp, 16 channels, 4 heads after the local init (σ(1) = 0.73
    of each head's weights positional): the output's mean map within 5 standard errors plus 0.02, the
    pooled variance within 10% and x's E[g²] within 15% of Monte Carlo, the output's lag-1 correlation
    within 0.05."""
    torch.manual_seed(0)
    D, H, W = 16, 4, 4
    m = _GPSA(D, 4).double()
    rule = gpsa_rule(m)
    x, f = gaussian_field(C=D, H=H, W=W, ell=ell, mean=_ramp(D, H, W, -1.0, 1.0), batch=B)
    xr = x.clone().requires_grad_()
    y = m(xr.flatten(2).mT)  # (B, T, D)
    pred, mc = rule.forward(cr.FlattenPositions().forward(f)), cr.measure_field(y.detach().mT[:, :, None])
    se = y.detach().std(0).mT / B**0.5  # (D, T)
    assert bool(((pred.mean[:, 0] - mc.mean[:, 0]).abs() < 5 * se + 0.02).all())
    fwd = float(pred.var.mean()) / float(mc.var.mean())
    assert abs(fwd - 1) < 0.10, fwd
    assert abs(cr.neighbour_corr(pred, 1) - cr.neighbour_corr(mc, 1)) < 0.05
    g, gf = gaussian_field(C=D, H=1, W=H * W, seed=2, ell=1.0, var=_ramp(D, 1, H * W, 0.3, 3.0), batch=B)
    (y * g[:, :, 0].mT).sum().backward()
    bwd = float(rule.backward(gf).var.mean()) / float(xr.grad.pow(2).mean())
    assert abs(bwd - 1) < 0.15, bwd
