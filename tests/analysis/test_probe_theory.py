"""The rules of gatepool.analysis.probe.theory against closed forms and Monte Carlo computed here."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from gatepool.analysis.probe import theory
from gatepool.analysis.probe.theory import max_of_normals, padding_variance_map, relu_moments


def test_max_of_normals_closed_forms():
    # n = 1 is N(0, 1); n = 2: E[max] = 1/√π, Var = 1 − 1/π (known closed forms)
    assert max_of_normals(1) == pytest.approx((0.0, 1.0), abs=1e-9)
    assert max_of_normals(2) == pytest.approx((1 / math.sqrt(math.pi), 1 - 1 / math.pi), abs=1e-9)


def test_max_of_normals_lecture_values():
    mean, var = max_of_normals(4)
    assert round(mean, 2) == 1.03 and round(var, 2) == 0.49


@pytest.mark.parametrize("n", [3, 4, 9])
def test_max_of_normals_vs_monte_carlo(n):
    # 200k maxima: sd of the mean ≈ √(0.5/2e5) ≈ 0.0016, of the variance ≈ 0.002; tolerance 0.01 ≈ 5 sd
    g = torch.Generator().manual_seed(n)
    m = torch.randn(200_000, n, generator=g, dtype=torch.float64).max(1).values
    mean, var = max_of_normals(n)
    assert mean == pytest.approx(float(m.mean()), abs=0.01)
    assert var == pytest.approx(float(m.var()), abs=0.01)


def test_max_of_normals_rejects_bad_n():
    for n in (0, -2, 2.5):
        with pytest.raises(ValueError, match="n must be"):
            max_of_normals(n)


def test_relu_of_standard_normal():
    mean, var, e2, pos = relu_moments()
    assert (mean, var, e2, pos) == pytest.approx(
        (1 / math.sqrt(2 * math.pi), 0.5 - 1 / (2 * math.pi), 0.5, 0.5), abs=1e-12
    )
    assert round(mean, 2) == 0.40 and round(var, 2) == 0.34  # the lecture's 0.40 and 0.34


@pytest.mark.parametrize("mu,var", [(0.7, 2.0), (-1.0, 0.5), (1.03, 0.49), (0.0, 4.0)])
def test_relu_moments_vs_monte_carlo(mu, var):
    # 400k samples: sd of each moment < 0.5% of its scale; tolerance 2% relative (+0.005 absolute)
    g = torch.Generator().manual_seed(1)
    x = mu + math.sqrt(var) * torch.randn(400_000, generator=g, dtype=torch.float64)
    p = x.relu()
    mean, v, e2, pos = relu_moments(mu, var)
    assert mean == pytest.approx(float(p.mean()), rel=0.02, abs=0.005)
    assert v == pytest.approx(float(p.var()), rel=0.02, abs=0.005)
    assert e2 == pytest.approx(float(p.pow(2).mean()), rel=0.02, abs=0.005)
    assert pos == pytest.approx(float((x > 0).double().mean()), abs=0.005)
    # backward: the gate H(x) passes g where x > 0
    grad = torch.randn(400_000, generator=g, dtype=torch.float64) * (x > 0)
    assert theory.relu_backward(1.0, mu, var) == pytest.approx(float(grad.pow(2).mean()), rel=0.02, abs=0.005)


def test_relu_of_a_constant():
    assert relu_moments(2.0, 0.0) == (2.0, 0.0, 4.0, 1.0)
    assert relu_moments(-1.0, 0.0) == (0.0, 0.0, 0.0, 0.0)


def test_padding_map_lecture_14x14():
    m = padding_variance_map(14, 14, 3, 1)
    assert m.shape == (14, 14)
    assert float(m[7, 7]) == pytest.approx(1.0)
    assert float(m[0, 0]) == pytest.approx(4 / 9) and float(m[13, 13]) == pytest.approx(4 / 9)
    assert float(m[0, 7]) == pytest.approx(6 / 9) and float(m[7, 13]) == pytest.approx(6 / 9)


def _brute_force_map(h, w, kh, kw, ph, pw, sh, sw, dh, dw):
    """Count, for every output, the kernel taps that land on a real input (plain loops)."""
    h_out = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    w_out = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = torch.zeros(h_out, w_out, dtype=torch.float64)
    for i in range(h_out):
        for j in range(w_out):
            n = 0
            for a in range(kh):
                for b in range(kw):
                    r, c = i * sh - ph + a * dh, j * sw - pw + b * dw
                    n += 0 <= r < h and 0 <= c < w
            out[i, j] = n / (kh * kw)
    return out


def test_padding_map_vs_brute_force_random_sizes():
    rng = random.Random(0)
    checked = 0
    while checked < 60:
        h, w = rng.randint(1, 12), rng.randint(1, 12)
        kh, kw = rng.randint(1, 5), rng.randint(1, 5)
        ph, pw = rng.randint(0, kh), rng.randint(0, kw)
        sh, sw, dh, dw = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 2)
        if h + 2 * ph < dh * (kh - 1) + 1 or w + 2 * pw < dw * (kw - 1) + 1:
            with pytest.raises(ValueError, match="does not fit"):
                padding_variance_map(h, w, (kh, kw), (ph, pw), (sh, sw), (dh, dw))
            continue
        got = padding_variance_map(h, w, (kh, kw), (ph, pw), (sh, sw), (dh, dw))
        want = _brute_force_map(h, w, kh, kw, ph, pw, sh, sw, dh, dw)
        assert got.shape == want.shape
        assert torch.allclose(got, want), (h, w, kh, kw, ph, pw, sh, sw, dh, dw)
        # and torch's own zero-padded conv of ones with a ones kernel agrees
        ones = torch.ones(1, 1, h, w, dtype=torch.float64)
        kernel = torch.ones(1, 1, kh, kw, dtype=torch.float64)
        conv = F.conv2d(ones, kernel, stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw))[0, 0] / (kh * kw)
        assert torch.allclose(got, conv)
        checked += 1


def test_padding_map_bad_arguments():
    with pytest.raises(ValueError, match="padding"):
        padding_variance_map(5, 5, 3, -1)
    with pytest.raises(ValueError, match="kernel_size"):
        padding_variance_map(5, 5, 0, 0)
    with pytest.raises(ValueError, match="height must be an integer >= 1, got 0"):
        padding_variance_map(0, 5, 3, 1)
    with pytest.raises(ValueError, match="does not fit"):
        padding_variance_map(2, 2, 5, 0)
    with pytest.raises(TypeError, match="kernel_size"):
        padding_variance_map(5, 5, (3, 3, 3), 1)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_cross_entropy_grad_at_zero_logits(reduction):
    # the gradient of torch's own cross-entropy at logits 0, read by autograd
    b, c = 8, 10
    z = torch.zeros(b, c, dtype=torch.float64, requires_grad=True)
    F.cross_entropy(z, torch.arange(b) % c, reduction=reduction).backward()
    assert theory.cross_entropy_grad(c, b, reduction) == pytest.approx(float(z.grad.pow(2).mean()))


def test_pool_rules_by_counting():
    # average of n: each input gets g/n; max: the winner gets g, the n − 1 others exact zeros
    assert theory.avg_pool_backward(4, 1.0) == 1 / 16
    assert theory.max_pool_backward(4, 1.0) == (0.25, 0.75)
    assert theory.max_pool_backward(4, 2.0, zero_share=0.5) == (0.5, 1 - 0.5 / 4)
    assert theory.avg_pool_forward(4, 1.0) == 0.25
