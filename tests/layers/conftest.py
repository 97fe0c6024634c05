"""The trusted reference for the pool tests: explicit padding, Tensor.unfold and softmax, in float64.

The output size comes from torch's own max pool (not from our code), the window positions are padded
with a mask that is written out here, so nothing in the reference is shared with ``gatepool.layers``.
"""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _tuple(v, d):
    return (v,) * d if isinstance(v, int) else tuple(v)


def windows_ref(x, scores, k, s, p, ceil_mode, dilation=1):
    """Values and scores per window: ``(N, C, *out, K)`` each; padded scores −inf, padded values 0."""
    d = x.dim() - 2
    dl = _tuple(dilation, d)
    out_size = MAX_POOL[d](x.detach(), k, s, p, dl, ceil_mode=ceil_mode).shape[2:]  # torch decides the size
    reach = [di * (ki - 1) + 1 for ki, di in zip(k, dl)]
    span = [(o - 1) * si + r for o, si, r in zip(out_size, s, reach)]  # padded length the windows read
    size = x.shape[2:]
    full = [max(sp, n + pi) for sp, n, pi in zip(span, size, p)]
    place = tuple(slice(pi, pi + n) for pi, n in zip(p, size))
    crop = tuple(slice(0, sp) for sp in span)

    def pad(t, fill):
        out = torch.full((*t.shape[:2], *full), fill, dtype=t.dtype)
        out[(slice(None), slice(None), *place)] = t
        out = out[(slice(None), slice(None), *crop)]
        for i in range(d):
            out = out.unfold(2 + i, reach[i], s[i])[..., :: dl[i]]
        return out.reshape(*out.shape[: 2 + d], -1)

    return pad(x, 0.0), pad(scores, float("-inf"))


def soft_pool_ref(x, k, s=None, p=0, ceil_mode=False, tau=1.0, dilation=1):
    """``Σ_j softmax(v/τ)_j v_j`` per window; returns (out, weights). Works for float or (C,) tensor τ."""
    d = x.dim() - 2
    k = _tuple(k, d)
    s = k if s is None else _tuple(s, d)
    p = _tuple(p, d)
    if isinstance(tau, torch.Tensor) and tau.dim() == 1:
        tau = tau.reshape(-1, *([1] * d))
    v, sc = windows_ref(x, x / tau, k, s, p, ceil_mode, dilation)
    g = torch.softmax(sc, dim=-1)
    # a window with no input tap (only with dilation): weights 0 and −inf out, as torch's max pool
    empty = torch.isneginf(sc).all(-1, keepdim=True)
    g = g.masked_fill(empty, 0.0)
    return (g * v).sum(-1).masked_fill(empty[..., 0], float("-inf")), g


FUSED_BACKWARD = "torch::autograd::CppNode<gatepool::SoftmaxPoolEager>"  # fused_pool.eager: the C++ op


@pytest.fixture(params=["fused", "python"])
def pool_path(request, monkeypatch):
    """A soft-family test on both paths: the fused C kernel, and the pure-PyTorch ones (tiled, plain).

    ``.name`` says which; ``.backward(tiles)`` the autograd node a soft pool's output should then have,
    and ``.node(out)`` the one it has.
    """
    from gatepool.layers import fused_pool

    if request.param == "fused":
        if not fused_pool.available():
            pytest.skip("the fused kernels could not be built here (no C compiler)")
    else:
        monkeypatch.setattr(fused_pool, "usable", lambda x: False)

    def backward(tiles):
        if request.param == "fused":
            return FUSED_BACKWARD
        return "_TiledSoftPoolBackward" if tiles else "MaskedFillBackward0"  # weighted_sum's last op

    def node(out):
        return out.grad_fn.name()

    return types.SimpleNamespace(name=request.param, backward=backward, node=node)


@pytest.fixture(scope="session")
def ref():
    return soft_pool_ref


@pytest.fixture(scope="session")
def windows():
    return windows_ref
