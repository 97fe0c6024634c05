"""Pools whose padding or output size follows the input (layers/dynamic_pools.py), and rewritten models
that pickle. Torch's modules only; against timm's own classes: tests/vision/test_convert_timm_pools.py.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.layers import fused_pool
from gatepool.layers.adaptive_pool import AdaptiveGatedPool2d
from gatepool.layers.convert import convert
from gatepool.layers.create_pool import create_pool
from gatepool.layers.dynamic_pools import SAME_FILL, AtLeastPool, PoolSame, same_padding
from gatepool.layers.global_pool import GlobalGatedPool2d


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("n", range(1, 14))
@pytest.mark.parametrize("k,s", [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (5, 2), (3, 3), (4, 3)])
def test_same_padding_gives_ceil_n_over_s_windows_that_start_in_the_input(n, k, s):
    """TensorFlow's "SAME": ⌈n / s⌉ outputs, the left pad at most the right, every window holding an input."""
    left, right = same_padding(n, k, s)
    out = (n + left + right - k) // s + 1
    assert out == -(-n // s) and 0 <= left <= right <= left + 1
    assert all(i * s - left < n and i * s - left + k > 0 for i in range(out))  # no window of padding only
    assert (out - 1) * s + k == n + left + right or left + right == 0  # the last window ends at the pad


def _gate_pool(gate, k, s, c, dilation=1):
    torch.manual_seed(0)
    pool = create_pool(gate, k, s, 0, dim=2, channels=c, **({"dilation": dilation} if dilation > 1 else {}))
    if gate == "conv":
        with torch.no_grad():
            pool.mixing.uniform_()  # not 1/K: a padded tap's weight would show
    return pool.double()


@pytest.mark.parametrize("gate", ["max", "avg", "soft", "soft-learned", "conv", "attention"])
def test_pool_same_is_the_gate_where_same_padding_is_symmetric(gate):
    """n odd, k 3, s 2: "SAME" pads 1 on each side, so PoolSame is the gate at padding 1 (the gate's own
    padding rule: gate 0 for padded taps, zeros counted by "avg", zeros adding nothing for "conv"),
    values and gradients."""
    x = _x(2, 3, 9, 7).requires_grad_()
    c = 3 if gate in ("soft-learned", "conv", "attention") else None
    ref = create_pool(gate, 3, 2, 1, dim=2, channels=c).double()
    same = PoolSame(_gate_pool(gate, 3, 2, c), (3, 3), (2, 2), SAME_FILL.get(gate))
    ref.load_state_dict(same.pool.state_dict())
    want, got = ref(x), same(x)
    assert got.shape == want.shape == (2, 3, 5, 4)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    (gx_want,) = torch.autograd.grad(want, x, g)
    (gx_got,) = torch.autograd.grad(got, x, g)
    torch.testing.assert_close(gx_got, gx_want)


def _by_hand(pool, x, pads):
    """The gate over each window's input taps only (a padded tap has no gate), by loops."""
    (top, bottom), (left, right) = pads
    (kh, kw), (sh, sw), (dh, dw) = pool.kernel_size, pool.stride, pool.dilation
    h, w = x.shape[-2:]
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (w + left + right - dw * (kw - 1) - 1) // sw + 1
    out = x.new_zeros(x.shape[0], x.shape[1], oh, ow)
    for i in range(oh):
        for j in range(ow):
            taps = [(a, b, i * sh - top + a * dh, j * sw - left + b * dw)
                    for a in range(kh) for b in range(kw)]  # fmt: skip
            taps = [(a, b, r, q) for a, b, r, q in taps if 0 <= r < h and 0 <= q < w]
            v = torch.stack([x[:, :, r, q] for _, _, r, q in taps], -1)  # (N, C, J): the input taps
            if pool.gate == "conv":
                wts = torch.stack([pool.mixing[:, 0, a, b] for a, b, _, _ in taps], -1)  # (C, J)
                out[:, :, i, j] = (wts * v).sum(-1)
            elif pool.gate == "attention":
                score = torch.einsum("ncj,c->nj", v, pool.score.weight.view(-1))
                g = score.softmax(-1).unsqueeze(1)  # (N, 1, J)
                out[:, :, i, j] = torch.einsum("dc,nc->nd", pool.value.weight.view(v.shape[1], -1),
                                               (g * v).sum(-1))  # fmt: skip
            else:
                tau = pool.temperature
                tau = tau.view(1, -1, 1) if isinstance(tau, torch.Tensor) else tau
                out[:, :, i, j] = ((v / tau).softmax(-1) * v).sum(-1)
    return out


@pytest.mark.parametrize("gate", ["soft", "soft-learned", "conv", "attention"])
@pytest.mark.parametrize(
    "size,k,s,dilation",
    [
        ((8, 6), 3, 2, 1),
        ((5, 4), 2, 1, 1),
        ((6, 7), 4, 1, 1),
        ((6, 9), 4, 3, 1),
        ((9, 8), 4, 1, 2),
        ((1, 4), 3, 2, 1),
    ],
)
@pytest.mark.parametrize("fused", [True, False])
def test_pool_same_gives_padded_taps_no_gate(gate, size, k, s, dilation, fused, monkeypatch):
    """Asymmetric "SAME" padding (left < right), every gate with content or position weights: the output
    is the gate over each window's input taps alone, as a pool's own padding. (The attention gate once
    pooled zero vectors there: score 0, a nonzero gate, which this catches.) The fused kernel and the
    plain path."""
    if not fused:
        monkeypatch.setattr(fused_pool, "usable", lambda x: False)
    x = _x(2, 3, *size) * 3 + 1  # away from 0: a zero vector in a window would take gate weight
    pool = _gate_pool(gate, k, s, 3, dilation)
    if gate == "soft-learned":
        with torch.no_grad():
            pool.log_temperature.copy_(torch.tensor([-0.5, 0.0, 0.7]))
    same = PoolSame(pool, (k, k), (s, s))
    pads = [same_padding(n, k, s) for n in size]
    assert any(left < right for left, right in pads)
    torch.testing.assert_close(same(x), _by_hand(pool, x, pads))
    torch.testing.assert_close(same(x.float()), _by_hand(pool, x, pads).float())
    torch.testing.assert_close(same(x[0]), same(x)[0])  # unbatched


def test_pool_same_takes_a_fill_for_torchs_pools_only():
    soft = create_pool("soft", 3, 2, 0, dim=2)
    with pytest.raises(ValueError, match="pads by its own rule"):
        PoolSame(soft, (3, 3), (2, 2), float("-inf"))
    with pytest.raises(ValueError, match="pass value="):
        PoolSame(nn.MaxPool2d(3, 2), (3, 3), (2, 2))
    with pytest.raises(ValueError, match="padding 0"):
        PoolSame(create_pool("soft", 3, 2, 1, dim=2), (3, 3), (2, 2))
    with pytest.raises(ValueError, match="channels=4"):
        PoolSame(create_pool("attention", 3, 2, 0, dim=2, channels=4), (3, 3), (2, 2))(_x(1, 3, 5, 5))


def test_pool_same_pads_asymmetrically_as_tensorflow():
    """n even, k 3, s 2: "SAME" pads 0 left, 1 right; max pool of the padded map, by hand."""
    x = _x(1, 1, 4, 6)
    same = PoolSame(nn.MaxPool2d(3, 2), (3, 3), (2, 2), SAME_FILL["max"])
    want = torch.stack([torch.stack([x[0, 0, i : i + 3, j : j + 3].max() for j in range(0, 6, 2)])
                        for i in range(0, 4, 2)])  # fmt: skip
    torch.testing.assert_close(same(x)[0, 0], want, rtol=0, atol=0)
    soft = PoolSame(create_pool("soft", 3, 2, 0, dim=2), (3, 3), (2, 2))
    last = x[0, 0, 2:4, 4:6].flatten()  # the bottom-right window: 2×2 inputs, 5 padded taps (gate 0)
    torch.testing.assert_close(soft(x)[0, 0, -1, -1], (last.softmax(0) * last).sum())
    with pytest.raises(ValueError, match="one entry per dim"):
        PoolSame(nn.MaxPool2d(3, 2), (3, 3), (2,), 0.0)


def test_at_least_pool_is_torchs_adaptive_pool_up_to_the_size():
    pool = AtLeastPool(nn.AdaptiveAvgPool2d((7, 7)), (7, 7))
    for h, w in [(2, 3), (2, 9), (9, 3), (7, 7), (9, 8)]:
        x = _x(2, 4, h, w)
        want = F.adaptive_avg_pool2d(x, (max(7, h), max(7, w))) if h < 7 or w < 7 else x
        torch.testing.assert_close(pool(x), want, rtol=0, atol=0)
    assert pool.pool.output_size == (7, 7)  # the mixed cases left it as it was
    with pytest.raises(ValueError, match="adaptive pool to size"):
        AtLeastPool(nn.AdaptiveAvgPool2d(5), (7, 7))


def test_at_least_pool_with_a_gate_shares_its_parameters_across_sizes():
    torch.manual_seed(0)
    gate = AdaptiveGatedPool2d((7, 7), gate="soft-learned", channels=4).double()
    pool = AtLeastPool(gate, (7, 7))
    x = _x(2, 4, 3, 9)
    out = pool(x)
    ref = AdaptiveGatedPool2d((7, None), gate="soft-learned", channels=4).double()
    ref.load_state_dict(gate.state_dict())
    torch.testing.assert_close(out, ref(x))
    out.sum().backward()
    assert gate.log_temperature.grad is not None and gate.log_temperature.grad.abs().sum() > 0


class MeanFromTheEnd(nn.Module):
    """pvt_v2's head: ``x.mean(dim=(-1, -2))`` of the last stage's map."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.fc = nn.Conv2d(3, 6, 3), nn.Linear(6, 2)

    def forward(self, x):
        return self.fc(self.conv(x).mean(dim=(-1, -2)))


def test_a_mean_over_the_last_dims_is_the_heads_global_pool():
    x = _x(2, 3, 8, 8).float()
    net = MeanFromTheEnd()
    want = net(x)
    _, replaced = convert(net, "max", global_pool="soft")
    assert [(r.name, r.role, r.source) for r in replaced] == [("mean", "head", "function")]
    assert isinstance(net.mean, GlobalGatedPool2d) and net(x).shape == (2, 2)
    convert(net, "max", global_pool="avg")  # the way back: the mean it replaced, the same numbers
    assert type(net.mean).__name__ == "SpatialMean" and net.mean.dims == (-2, -1)
    torch.testing.assert_close(net(x), want, rtol=0, atol=0)
    mean = net.mean
    assert convert(net, "max", global_pool="avg") == (net, []) and net.mean is mean  # idempotent


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        x = F.max_pool2d(self.conv(x), 3, stride=2, padding=1)
        return self.fc(x.mean((2, 3)))


@pytest.mark.parametrize("gate", ["max", "attention"])
def test_a_rewritten_model_pickles_whole(gate):
    """torch.save(model) / deepcopy of a model whose forward was rewritten: it loads as its own class,
    rewritten, with the same outputs; its traces are made again at the first call."""
    x = _x(2, 3, 16, 16).float()
    net = Functional()
    convert(net, gate, global_pool="soft-learned", example_input=x)
    net.eval()
    want = net(x)
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert isinstance(loaded, Functional) and type(loaded).__name__ == "Functional"
    assert loaded.__dict__["_gatepool_rewrite"].forwards == {}
    torch.testing.assert_close(loaded(x), want, rtol=0, atol=0)
    assert type(loaded.max_pool2d) is type(net.max_pool2d) and isinstance(loaded.mean, GlobalGatedPool2d)
    copied = copy.deepcopy(net)
    with torch.no_grad():
        copied.fc.weight.zero_()
    torch.testing.assert_close(net(x), want)  # the copy is its own
    assert not torch.equal(copied(x), want)
    convert(loaded, "max", global_pool="avg")  # the way back works on the loaded model too
    assert isinstance(loaded.mean, nn.Module) and type(loaded.mean).__name__ == "SpatialMean"
