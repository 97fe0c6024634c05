"""The trusted reference for the pool tests: explicit padding, Tensor.unfold and softmax, in float64.

The output size comes from torch's own max pool (not from our code), the window positions are padded
with a mask that is written out here, so nothing in the reference is shared with ``gatepool.layers``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def windows_ref(x, scores, k, s, p, ceil_mode):
    """Values and scores per window: ``(N, C, *out, K)`` each; padded scores −inf, padded values 0."""
    d = x.dim() - 2
    out_size = MAX_POOL[d](x.detach(), k, s, p, ceil_mode=ceil_mode).shape[2:]  # torch decides the size
    span = [(o - 1) * si + ki for o, si, ki in zip(out_size, s, k)]  # padded length the windows read
    size = x.shape[2:]
    full = [max(sp, n + pi) for sp, n, pi in zip(span, size, p)]
    place = tuple(slice(pi, pi + n) for pi, n in zip(p, size))
    crop = tuple(slice(0, sp) for sp in span)

    def pad(t, fill):
        out = torch.full((*t.shape[:2], *full), fill, dtype=t.dtype)
        out[(slice(None), slice(None), *place)] = t
        out = out[(slice(None), slice(None), *crop)]
        for i in range(d):
            out = out.unfold(2 + i, k[i], s[i])
        return out.reshape(*out.shape[: 2 + d], -1)

    return pad(x, 0.0), pad(scores, float("-inf"))


def soft_pool_ref(x, k, s=None, p=0, ceil_mode=False, tau=1.0):
    """``Σ_j softmax(v/τ)_j v_j`` per window; returns (out, gates). Works for float or (C,) tensor τ."""
    d = x.dim() - 2
    k = (k,) * d if isinstance(k, int) else tuple(k)
    s = k if s is None else ((s,) * d if isinstance(s, int) else tuple(s))
    p = (p,) * d if isinstance(p, int) else tuple(p)
    if isinstance(tau, torch.Tensor) and tau.dim() == 1:
        tau = tau.reshape(-1, *([1] * d))
    v, sc = windows_ref(x, x / tau, k, s, p, ceil_mode)
    g = torch.softmax(sc, dim=-1)
    return (g * v).sum(-1), g


@pytest.fixture(scope="session")
def ref():
    return soft_pool_ref


@pytest.fixture(scope="session")
def windows():
    return windows_ref
