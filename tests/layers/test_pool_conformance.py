"""The gates against torch's pools, called with the same positional arguments, over a grid of geometries.

    nn.MaxPool2d(k, s, p, dl, indices, ceil)  ==  GatedPool2d(k, s, p, dl, indices, ceil, gate="max")
    nn.AvgPool2d(k, s, p, ceil, c)  ==  GatedPool2d(k, s, p, 1, False, ceil, gate="avg", count_include_pad=c)

max and avg: values, input gradients and indices are compared bit for bit. Dilated avg (torch has none)
and the soft / attention gates are compared with references written out here, in float64.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from gatepool.layers import (
    AttentionGatePool1d,
    AttentionGatePool2d,
    AttentionGatePool3d,
    GatedPool1d,
    GatedPool2d,
    GatedPool3d,
    SoftPool1d,
    SoftPool2d,
    SoftPool3d,
)

MAX = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
AVG = {1: nn.AvgPool1d, 2: nn.AvgPool2d, 3: nn.AvgPool3d}
GATED = {1: GatedPool1d, 2: GatedPool2d, 3: GatedPool3d}
SOFT = {1: SoftPool1d, 2: SoftPool2d, 3: SoftPool3d}
ATTENTION = {1: AttentionGatePool1d, 2: AttentionGatePool2d, 3: AttentionGatePool3d}
SIZE = {1: (9,), 2: (7, 8), 3: (5, 6, 4)}

pytestmark = pytest.mark.usefixtures("pool_path")  # every test on the fused and the pure-PyTorch paths


def geometries(d: int, dilations=(1, 2)):
    """Every (kernel, stride, padding, dilation, ceil_mode) torch accepts on SIZE[d], a few anisotropic."""
    out = []
    for k, s, dl, ceil in itertools.product((1, 2, 3), (None, 1, 2, 3), dilations, (False, True)):
        for p in range(k // 2 + 1):
            if all(dl * (k - 1) + 1 <= n + 2 * p for n in SIZE[d]):
                out.append((k, s, p, dl, ceil))
    if d > 1:  # one value per dimension
        k, s, dl = (3, 2, 1)[:d], (1, 2, 2)[:d], (1, max(dilations), 1)[:d]
        out += [(k, s, (1, 0, 0)[:d], dl, ceil) for ceil in (False, True)]
    return out


def _run(pool, x, grad_out=None):
    """Outputs (a tuple), the input gradient for Σ out · grad_out, and grad_out (random if None)."""
    x = x.detach().clone().requires_grad_()
    res = pool(x)
    res = res if isinstance(res, tuple) else (res,)
    if grad_out is None:
        grad_out = torch.randn_like(res[0])
    (g,) = torch.autograd.grad((res[0] * grad_out).sum(), x)
    return res, g, grad_out


@pytest.mark.parametrize("d", [1, 2, 3])
def test_max_gate_is_torch_max_pool_bit_for_bit(d):
    torch.manual_seed(d)
    x = torch.randn(2, 3, *SIZE[d])
    x[0, 0].view(-1)[:4] = 0.5  # ties: both must pick the same input
    cases = geometries(d)
    assert len(cases) > 50
    for i, geo in enumerate(cases):
        k, s, p, dl, ceil = geo
        return_indices = i % 2 == 1
        args = (k, s, p, dl, return_indices, ceil)  # the same positional arguments, in torch's order
        want, g_want, grad_out = _run(MAX[d](*args), x)
        got, g, _ = _run(GATED[d](*args, gate="max"), x, grad_out)
        assert len(got) == len(want) == 1 + return_indices, geo
        for a, b in zip(got, want):  # values, then indices
            assert torch.equal(a, b), (geo, return_indices)
        assert torch.equal(g, g_want), geo


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_gate_is_torch_avg_pool_bit_for_bit(d, count_include_pad):
    torch.manual_seed(d)
    x = torch.randn(2, 3, *SIZE[d])
    for geo in geometries(d, dilations=(1,)):
        k, s, p, dl, ceil = geo
        want, g_want, grad_out = _run(AVG[d](k, s, p, ceil, count_include_pad), x)  # torch's avg order
        got, g, _ = _run(GATED[d](k, s, p, dl, False, ceil, gate="avg", count_include_pad=count_include_pad),
                         x, grad_out)
        assert torch.equal(got[0], want[0]), geo
        assert torch.equal(g, g_want), geo
    assert GATED[d](2, gate="avg").count_include_pad  # torch's default


def avg_pool_ref(x, k, s, p, dl, ceil, count_include_pad):
    """Average pooling by its definition, one output position and one tap at a time (float64, autograd).

    A window's taps are at ``o·s − p + j·dl``; the sum runs over the taps inside the input; the divisor
    counts the taps inside the padded input ``[−p, n + p)`` (count_include_pad) or inside the input.
    The output size is torch's (from its max pool, which has dilation).
    """
    d = x.dim() - 2
    k, s, p, dl = ((v,) * d if isinstance(v, int) else v for v in (k, s or k, p, dl))
    out_size = MAX[d](k, s, p, dl, ceil_mode=ceil)(x.detach()).shape[2:]
    size = x.shape[2:]
    out = torch.zeros(*x.shape[:2], *out_size, dtype=x.dtype)
    for o in itertools.product(*(range(n) for n in out_size)):
        total, counted = 0.0, 0
        for j in itertools.product(*(range(ki) for ki in k)):
            pos = [oi * si - pi + ji * di for oi, si, pi, ji, di in zip(o, s, p, j, dl)]
            inside = all(0 <= q < n for q, n in zip(pos, size))
            if inside:
                total = total + x[(slice(None), slice(None), *pos)]
            if inside or (count_include_pad and all(-pi <= q < n + pi for q, pi, n in zip(pos, p, size))):
                counted += 1
        out[(slice(None), slice(None), *o)] = total / counted
    return out


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_dilated_avg_gate_matches_its_definition(d, count_include_pad):
    torch.manual_seed(d)
    x = torch.randn(1, 2, *SIZE[d], dtype=torch.float64)
    cases = [g for g in geometries(d) if max((g[3],) if isinstance(g[3], int) else g[3]) > 1]
    if d == 1:  # the reference itself, where torch has the op: it must equal torch
        for k, s, p, _, ceil in geometries(1, dilations=(1,)):
            want = AVG[1](k, s, p, ceil, count_include_pad)(x)
            torch.testing.assert_close(avg_pool_ref(x, k, s, p, 1, ceil, count_include_pad), want)
    for geo in cases[:: 3 if d == 3 else 1]:  # 3-D: every third, to stay quick
        k, s, p, dl, ceil = geo
        pool = GATED[d](k, s, p, dl, False, ceil, gate="avg", count_include_pad=count_include_pad)
        got, g, grad_out = _run(pool, x)
        x_ref = x.clone().requires_grad_()
        want = avg_pool_ref(x_ref, k, s, p, dl, ceil, count_include_pad)
        (g_want,) = torch.autograd.grad((want * grad_out).sum(), x_ref)
        torch.testing.assert_close(got[0], want, msg=lambda m, geo=geo: f"{geo}: {m}")
        torch.testing.assert_close(g, g_want, msg=lambda m, geo=geo: f"{geo}: {m}")


@pytest.mark.parametrize("d", [1, 2, 3])
def test_soft_pool_matches_unfold_softmax_reference(ref, d):
    """SoftPool*d with nn.MaxPool*d's positional arguments (bar return_indices): values, weights, grads."""
    torch.manual_seed(d)
    x = torch.randn(2, 3, *SIZE[d], dtype=torch.float64)
    for geo in geometries(d)[:: {1: 2, 2: 3, 3: 4}[d]]:  # a spread of the grid, to stay quick
        k, s, p, dl, ceil = geo
        pool = SOFT[d](k, s, p, dl, ceil, temperature=0.7, return_weights=True)
        (out, weights), g, grad_out = _run(pool, x)
        x_ref = x.clone().requires_grad_()
        kk, ss, pp = ((v,) * d if isinstance(v, int) else v for v in (k, s or k, p))
        want, want_weights = ref(x_ref, kk, ss, pp, ceil, 0.7, dl)
        grad_out = grad_out.masked_fill(want.isinf(), 0)  # a window with no input tap: −inf, no gradient
        (g,) = torch.autograd.grad((pool(x_ref)[0] * grad_out).sum(), x_ref)
        (g_want,) = torch.autograd.grad((want * grad_out).sum(), x_ref)
        torch.testing.assert_close(out, want, msg=lambda m, geo=geo: f"{geo}: {m}")
        torch.testing.assert_close(weights, want_weights, msg=lambda m, geo=geo: f"{geo}: {m}")
        torch.testing.assert_close(g, g_want, msg=lambda m, geo=geo: f"{geo}: {m}")


@pytest.mark.parametrize("d", [1, 2, 3])
def test_attention_gate_matches_explicit_computation(windows, d):
    """softmax(x·w / τ) over each window, applied to V x: values, weights, input and parameter grads."""
    torch.manual_seed(d)
    x = torch.randn(2, 4, *SIZE[d], dtype=torch.float64)
    for geo in geometries(d)[:: {1: 3, 2: 6, 3: 9}[d]]:  # a spread of the grid, to stay quick
        k, s, p, dl, ceil = geo
        pool = ATTENTION[d](k, s, p, dl, ceil, channels=4, temperature=0.7, return_weights=True).double()
        with torch.no_grad():
            pool.value.weight.normal_()  # not the identity, so values are really projected
        x_g = x.clone().requires_grad_()
        out, weights = pool(x_g)
        grad_out = torch.randn_like(out)
        got = torch.autograd.grad((out * grad_out).sum(), [x_g, pool.score.weight, pool.value.weight])

        x_r = x.clone().requires_grad_()
        w = pool.score.weight.detach().reshape(4).clone().requires_grad_()  # (C,)
        V = pool.value.weight.detach().reshape(4, 4).clone().requires_grad_()  # (C_out, C_in)
        scores = torch.einsum("nc...,c->n...", x_r, w)[:, None] / 0.7  # s_j = x_j · w / τ
        values = torch.einsum("nc...,dc->nd...", x_r, V)  # v_j = V x_j
        kk, ss, pp = ((v,) * d if isinstance(v, int) else v for v in (k, s or k, p))
        vw, _ = windows(values, values, kk, ss, pp, ceil, dl)
        _, sw = windows(scores, scores, kk, ss, pp, ceil, dl)
        g = torch.softmax(sw, -1)  # (N, 1, *out, K)
        if torch.isneginf(sw).all(-1).any():  # a window with no input tap: not compared here
            continue
        want = (g * vw).sum(-1)
        wants = torch.autograd.grad((want * grad_out).sum(), [x_r, w, V])
        torch.testing.assert_close(out, want, msg=lambda m, geo=geo: f"{geo}: {m}")
        torch.testing.assert_close(weights, g.expand_as(weights), msg=lambda m, geo=geo: f"{geo}: {m}")
        for a, b in zip(got, wants):
            torch.testing.assert_close(a.reshape(b.shape), b, msg=lambda m, geo=geo: f"{geo}: {m}")


@pytest.mark.parametrize("geo", [(2, None, 0), (3, 2, 1), (3, 1, 1)])
def test_max_gate_indices_feed_max_unpool(geo):
    """GatedPool2d(..., return_indices=True, gate="max") → nn.MaxUnpool2d, exactly as nn.MaxPool2d does."""
    k, s, p = geo
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 7)
    out, idx = GatedPool2d(k, s, p, return_indices=True, gate="max")(x)
    unpool = nn.MaxUnpool2d(k, s, p)
    back = unpool(out, idx, output_size=x.shape[-2:])
    want = unpool(*nn.MaxPool2d(k, s, p, return_indices=True)(x), output_size=x.shape[-2:])
    assert torch.equal(back, want)
    kept = back != 0  # every kept value is the input's own value, at its own place
    assert torch.equal(back[kept], x[kept]) and kept.any()
    if s == k:  # non-overlapping windows: the round trip keeps exactly the window maxima
        assert int(kept.sum()) == out.numel()
    # and unbatched, and through the 1-D and 3-D poolings
    out_u, idx_u = GatedPool2d(k, s, p, return_indices=True, gate="max")(x[0])
    assert torch.equal(unpool(out_u, idx_u, output_size=x.shape[-2:]), want[0])
    for d, xd in ((1, torch.randn(2, 3, 9)), (3, torch.randn(1, 2, 4, 5, 6))):
        unpool = {1: nn.MaxUnpool1d, 3: nn.MaxUnpool3d}[d](k, s, p)
        size = xd.shape[2:]
        got = unpool(*GATED[d](k, s, p, return_indices=True, gate="max")(xd), output_size=size)
        assert torch.equal(got, unpool(*MAX[d](k, s, p, return_indices=True)(xd), output_size=size))
