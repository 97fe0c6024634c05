"""Gate parameters shared by the windowed, global and adaptive pools; the attention gate pools first.

Each pool computes ``V · Σ_j g_j x_j``; the reference here computes ``Σ_j g_j · (V x_j)`` the long way (the
projection at every position, then the windows by explicit loops), in float64, with a V that is not the
identity, and compares values and the gradients of x, w and V.
"""

from __future__ import annotations

import math

import pytest
import torch

from gatepool.layers import AdaptiveGatedPool2d, GatedPool2d, GlobalGatedPool2d


def _attention_reference(x, w, v, windows):
    """``Σ_j softmax(s)_j · (V x_j)`` per window; ``windows``: per output (i, j), the list of input (h, w)."""
    values = torch.einsum("oc,nchw->nohw", v, x)  # V x_j at every position
    scores = torch.einsum("c,nchw->nhw", w, x)  # s_j = x_j · w
    rows = []
    for taps in windows:
        s = torch.stack([scores[:, h, q] for h, q in taps], -1)  # (N, K)
        vals = torch.stack([values[:, :, h, q] for h, q in taps], -1)  # (N, C, K)
        rows.append((torch.softmax(s, -1).unsqueeze(1) * vals).sum(-1))  # (N, C)
    return torch.stack(rows, -1)  # (N, C, number of windows)


def _windowed(h, w, k, s, p):
    out = []
    for i in range((h + 2 * p - k) // s + 1):
        for j in range((w + 2 * p - k) // s + 1):
            out.append(
                [
                    (a, b)
                    for a in range(i * s - p, i * s - p + k)
                    for b in range(j * s - p, j * s - p + k)
                    if 0 <= a < h and 0 <= b < w
                ]
            )  # padded taps have gate 0: left out
    return out


def _adaptive(h, w, o):
    def axis(n, i):
        return range(math.floor(i * n / o), math.ceil((i + 1) * n / o))

    return [[(a, b) for a in axis(h, i) for b in axis(w, j)] for i in range(o) for j in range(o)]


CASES = {
    "windowed k3 s2 p1": (
        lambda c: GatedPool2d(3, 2, 1, gate="attention", channels=c),
        _windowed(7, 6, 3, 2, 1),
    ),
    "global": (
        lambda c: GlobalGatedPool2d("attention", channels=c),
        [[(a, b) for a in range(7) for b in range(6)]],
    ),
    "adaptive 4x4": (lambda c: AdaptiveGatedPool2d(4, gate="attention", channels=c), _adaptive(7, 6, 4)),
    "adaptive 7x2 (tiling: the windowed path)": (
        lambda c: AdaptiveGatedPool2d((7, 2), gate="attention", channels=c),
        [[(i, b) for b in range(3 * j, 3 * j + 3)] for i in range(7) for j in range(2)],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("channels_last", [False, True])
def test_attention_pools_first_and_projects_after(case, channels_last):
    make, windows = CASES[case]
    torch.manual_seed(0)
    pool = make(5).double()
    with torch.no_grad():
        pool.value.weight.normal_()  # not the identity: the projection must really be applied
    x = torch.randn(2, 5, 7, 6, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    out = pool(x).reshape(2, 5, -1)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad((out * grad_out).sum(), [x, pool.score.weight, pool.value.weight])

    w = pool.score.weight.detach().reshape(5).clone().requires_grad_()
    v = pool.value.weight.detach().reshape(5, 5).clone().requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    ref = _attention_reference(x_ref, w, v, windows)
    expected = torch.autograd.grad((ref * grad_out).sum(), [x_ref, w, v])
    torch.testing.assert_close(out, ref)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.reshape(b.shape), b)


@pytest.mark.parametrize(
    "make",
    [
        lambda g, **kw: GatedPool2d(2, gate=g, **kw),
        lambda g, **kw: GlobalGatedPool2d(g, **kw),
        lambda g, **kw: AdaptiveGatedPool2d(3, gate=g, **kw),
    ],
)
def test_every_pool_has_the_same_parameters_and_checks(make):
    torch.manual_seed(0)
    attention = make("attention", channels=4)
    assert {k: tuple(p.shape) for k, p in attention.named_parameters()} == {
        "score.weight": (1, 4, 1, 1),
        "value.weight": (4, 4, 1, 1),
    }
    torch.testing.assert_close(attention.value.weight.reshape(4, 4), torch.eye(4))
    learned = make("soft-learned", channels=3, temperature=0.5)
    torch.testing.assert_close(learned.temperature, torch.full((3,), 0.5))
    assert "channels=3" in repr(learned) and "temperature=2.0" in repr(make("soft", temperature=2.0))
    with pytest.raises(ValueError, match="gate='attention' has weights: pass channels=C"):
        make("attention")
    with pytest.raises(ValueError, match="gate='max' has no temperature"):
        make("max", temperature=0.5)
    with pytest.raises(ValueError, match="channels must be an integer >= 1 or None"):
        make("soft", channels=0)
