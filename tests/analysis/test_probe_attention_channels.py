"""The channels' correlation through an attention (``Attention._channels``) and read by the next one's
lean (its C = W_v Σ_x W_kᵀ from the tokens' covariance within a sample), against Monte Carlo: two of
LeViT's attentions in a row (timm's ``Attention``, then its ``AttentionDownsample``, written out in
``test_probe_levit``), 64 tokens of 32 channels, 2000 draws."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import _ramp, gaussian_field
from test_probe_levit import _Attention

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated.levit import levit_attention_downsample_rule, levit_attention_rule
from gatepool.analysis.probe.correlated_predict import _parts

B, D, H = 2000, 32, 8
DT = torch.float64


def _pair():
    """The two attentions (seed 0) and their rules, the norms' batch B."""
    torch.manual_seed(0)
    a1 = _Attention(D, key_dim=8, heads=2, ratio=4, hw=(H, H)).double()
    a2 = _Attention(D, key_dim=8, heads=2, ratio=4, hw=(H, H), stride=2, out=48).double()
    r1, r2 = levit_attention_rule(a1), levit_attention_downsample_rule(a2)
    for part in _parts(r1) + _parts(r2):
        if isinstance(part, cr.BatchNorm):
            part.batch = B
    return a1, a2, r1, r2


def _chain(ell: float, known: bool):
    """The first attention's output h, measured (B, T, D) and predicted (its field, with its R and Q), and
    the E[g²] at h and at x, predicted over measured, for a gradient shared by the second's tokens (a mean
    pool's)."""
    a1, a2, r1, r2 = _pair()
    x, f = gaussian_field(C=D, H=H, W=H, ell=ell, mean=_ramp(D, H, H, -0.5, 0.5), batch=B)
    xr = x.clone().requires_grad_()
    h = a1(xr.flatten(2).mT)  # (B, T, D)
    h.retain_grad()
    y = a2(h)
    g = torch.randn(B, 1, y.shape[2], dtype=DT, generator=torch.Generator().manual_seed(3))
    (y * g).sum().backward()
    tokens = cr.FlattenPositions().forward(f)
    if known:  # x's channels independent, and known to be
        tokens.chan = tokens.chan_dc = torch.eye(D, dtype=DT)
    ph = r1.forward(tokens)
    r2.forward(ph)
    T2, Do = y.shape[1], y.shape[2]
    shared = cr.Field(torch.zeros(Do, 1, T2, dtype=DT), torch.ones(Do, 1, T2, dtype=DT),
                      torch.ones(Do, 1, 2 * T2 - 1, dtype=DT))  # fmt: skip
    gh = r2.backward(shared)
    gx = r1.backward(gh)
    return h.detach(), ph, (float(gh.var.mean()) / float(h.grad.pow(2).mean()),
                            float(gx.var.mean()) / float(xr.grad.pow(2).mean()))  # fmt: skip


def test_the_next_attentions_lean_reads_them():
    """The second attention's C = Cov_tok(v, k) (the tokens' covariance within a sample of its values and
    keys, what its lean and its queries' gradient read) within 15% rms of the measured, from its input's
    channel correlations (0.076 at seed 0, torch 2.13.0, over independent tokens); with its input's channels
    taken as uncorrelated, 0.79."""
    a1, a2, r1, r2 = _pair()
    x, f = gaussian_field(C=D, H=H, W=H, ell=0.1, mean=_ramp(D, H, H, -0.5, 0.5), batch=B)
    with torch.no_grad():
        h = a1(x.flatten(2).mT)  # (B, T, D)
        k, v = a2.kv(h).view(B, H * H, 2, -1).split([8, 32], dim=3)  # the heads' keys and values
    k, v = (t.flatten(2) - t.flatten(2).mean(1, keepdim=True) for t in (k, v))
    measured = torch.einsum("btv,bta->va", v, k) / (B * H * H)
    tokens = cr.FlattenPositions().forward(f)
    tokens.chan = tokens.chan_dc = torch.eye(D, dtype=DT)
    r2.forward(r1.forward(tokens))
    err = (r2.C - measured).pow(2).mean().sqrt() / measured.pow(2).mean().sqrt()
    assert float(err) < 0.15, float(err)


def _off(M: torch.Tensor) -> torch.Tensor:
    return M[~torch.eye(len(M), dtype=torch.bool)]


def test_an_attentions_channel_correlations_match_monte_carlo():
    """The heads' outputs through Hardswish and a LinearNorm: R (lag 0) and Q (the sums over the tokens)
    within 0.05 and 0.035 rms of the measured off the diagonal, where they spread by 0.19 and 0.20 rms
    (seed 0, torch 2.13.0: 0.017 and 0.024; without the cross term of the keys' mean and the lean,
    0.025 and 0.038)."""
    h, ph, _ = _chain(1.0, True)
    C = h.shape[-1]
    R = torch.corrcoef((h - h.mean((0, 1))).reshape(-1, C).T)
    Q = torch.corrcoef(h.sum(1).T)
    assert float(_off(R).pow(2).mean().sqrt()) > 0.1 and float(_off(Q).pow(2).mean().sqrt()) > 0.1
    assert float(_off(ph.chan - R).pow(2).mean().sqrt()) < 0.05
    assert float(_off(ph.chan_dc - Q).pow(2).mean().sqrt()) < 0.035


def test_the_next_attentions_gradient_reads_them():
    """Over independent tokens the gradient at the first attention's output, through the second's
    queries, keys and values, within 15% of Monte Carlo with the channels' correlation known (0.918 at seed
    0, torch 2.13.0), where without it the second takes its input's channels as uncorrelated (0.782)."""
    _, _, (with_r, _) = _chain(0.1, True)
    _, _, (without, _) = _chain(0.1, False)
    assert abs(with_r - 1) < 0.15 and abs(without - 1) > 0.15, (with_r, without)


@pytest.mark.xfail(strict=True, reason=(
    "x's 0.708 and 0.853 over independent and correlated tokens, h's 0.918 and 1.039 (0.591, 0.680, 0.782, "
    "0.864 without the channels): the second attention's weights spread by κ 2.0–2.2 (Monte Carlo) where "
    "the rule gives 1.07, its keys' scores far from normal (excess kurtosis 9, their spread varying by "
    "sample and query, sd/mean 1.4), so its outputs' own variation is 0.33 of the measured"))  # fmt: skip
def test_the_gradient_at_the_input_through_both():
    for ell in (0.1, 1.0):
        _, _, (gh, gx) = _chain(ell, True)
        assert abs(gh - 1) < 0.15 and abs(gx - 1) < 0.15, (ell, gh, gx)


def test_tokens_of_a_map_keep_its_channel_correlations():
    """Flattening a map's positions into tokens and back moves no value: R and Q as they were."""
    _, f = gaussian_field(C=4, H=3, W=5, batch=8)
    f.chan = torch.eye(4, dtype=DT) * 0.5 + 0.5
    f.chan_dc = torch.eye(4, dtype=DT) * 0.25 + 0.75
    tokens = cr.FlattenPositions().forward(f)
    back = cr.UnflattenPositions(3, 5).forward(tokens)
    for g in (tokens, back):
        assert g.chan is f.chan and g.chan_dc is f.chan_dc
