"""The missing claims (issue #14 item 4): the helpers each experiment measures with, against references
computed here (brute-force loops, torch's functional convs, BatchNorm's eval output, closed forms), and
one run of every new experiment through the harness.
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.lab.claims import SOURCES
from gatepool.lab.experiments.batchnorm import affine_error, ema, feed_batchnorm, fold_batchnorm
from gatepool.lab.experiments.conv_unrolled import (
    FILTER,
    WINDOW,
    mlp_as_conv,
    nine_products,
    tap_uses,
    tied_gradient,
    unrolled_matrix,
)
from gatepool.lab.experiments.he_fan_mode import fan_mode_moments
from gatepool.lab.experiments.head_chain import FULL_RULE, IDEAL_VAR, head_factors
from gatepool.lab.experiments.max_normals import max_moments, phi
from gatepool.lab.experiments.network_backward import prediction_interval
from gatepool.lab.experiments.pool_compound import two_max_pools
from gatepool.lab.experiments.stream_skew import skewness
from gatepool.lab.experiments.weight_uses import weight_uses
from gatepool.lab.harness import run_experiment
from gatepool.layers.blocks import MLP
from gatepool.models import ResidualCNN

# ----------------------------------------------------------------------------- conv as a matrix


@pytest.mark.parametrize("n,k,p", [(8, 3, 1), (7, 3, 0), (9, 5, 2), (6, 3, 2)])
def test_unrolled_matrix_is_the_conv_and_its_transpose_the_backward(n, k, p):
    gen = torch.Generator().manual_seed(n + k + p)
    w = torch.randn(k, generator=gen)
    x = torch.randn(n, generator=gen, requires_grad=True)
    W = unrolled_matrix(w, n, p)
    y = F.conv1d(x.view(1, 1, n), w.view(1, 1, k), padding=p).reshape(-1)
    assert W.shape == (n + 2 * p - k + 1, n)
    torch.testing.assert_close(W @ x.detach(), y.detach(), rtol=1e-6, atol=1e-6)
    g = torch.randn(y.shape, generator=gen)
    (gx,) = torch.autograd.grad(y, x, grad_outputs=g)
    torch.testing.assert_close(W.T @ g, gx, rtol=1e-6, atol=1e-6)
    flipped = F.conv1d(g.view(1, 1, -1), w.flip(0).view(1, 1, k), padding=k - 1 - p).reshape(-1)
    torch.testing.assert_close(flipped, gx, rtol=1e-6, atol=1e-6)


def test_unrolled_matrix_zeros_and_ties():
    w = torch.tensor([1.0, 2.0, 3.0])
    W = unrolled_matrix(w, 8, 1)
    assert int((W == 0).sum()) == 64 - (8 + 7 + 7) == 42
    for i in range(8):
        for j in range(8):
            assert W[i, j] == (w[j - i + 1] if abs(i - j) <= 1 else 0)


def test_tied_gradient_is_the_sum_over_uses():
    gen = torch.Generator().manual_seed(3)
    n, k, p = 8, 3, 1
    w = torch.randn(k, generator=gen, requires_grad=True)
    x = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen)
    W = unrolled_matrix(w, n, p)
    W.retain_grad()
    (W @ x).backward(g)
    by_loop = torch.zeros(k)
    for i in range(n):
        for tap in range(k):
            j = i + tap - p
            if 0 <= j < n:
                by_loop[tap] += g[i] * x[j]
    torch.testing.assert_close(tied_gradient(W.grad, k, p), by_loop, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w.grad, by_loop, rtol=1e-6, atol=1e-6)


def test_tap_uses():
    assert tap_uses(8, 3, 1) == [7, 8, 7]
    assert tap_uses(8, 3, 0) == [6, 6, 6]
    assert tap_uses(10, 5, 2) == [8, 9, 10, 9, 8]


def test_nine_products_and_conv2d():
    window, filt = torch.tensor(WINDOW), torch.tensor(FILTER)
    prods = nine_products(window, filt)
    assert prods.sum().item() == 3.0
    assert prods.sum() == F.conv2d(window.view(1, 1, 3, 3), filt.view(1, 1, 3, 3)).reshape(())
    assert prods.sum() == sum(WINDOW[a][b] * FILTER[a][b] for a in range(3) for b in range(3))


def test_mlp_as_conv():
    torch.manual_seed(0)
    mlp = MLP(16).eval()
    x = torch.randn(2, 16, 5, 5)
    ref = mlp(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    torch.testing.assert_close(mlp_as_conv(mlp)(x), ref, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- init, uses, batchnorm


def test_weight_uses_against_a_loop():
    b, size, k = 2, 5, 3
    counts = weight_uses(b, size, k)
    for a in range(k):
        for c in range(k):
            real = sum(
                1 for i in range(size) for j in range(size) if 0 <= i + a - 1 < size and 0 <= j + c - 1 < size
            )
            assert counts[0, 0, a, c].item() == b * real
    assert weight_uses(512, 14)[1, 0, 1, 1].item() == 100_352  # the lecture's block 1 on 512 digits
    assert weight_uses(512, 7)[0, 1, 1, 1].item() == 25_088  # and blocks 2–3 at 7 × 7
    assert weight_uses(512, 14)[0, 0, 0, 0].item() == 512 * 13 * 13


def test_fan_modes():
    fi = [fan_mode_moments(16, 64, "fan_in", 16, 12, s) for s in range(2)]
    fo = [fan_mode_moments(16, 64, "fan_out", 16, 12, s) for s in range(2)]
    assert sum(f for f, _ in fi) / 2 == pytest.approx(1.0, rel=0.15)
    assert sum(b for _, b in fi) / 2 == pytest.approx(4.0, rel=0.1)
    assert sum(f for f, _ in fo) / 2 == pytest.approx(0.25, rel=0.15)
    assert sum(b for _, b in fo) / 2 == pytest.approx(1.0, rel=0.1)


def test_ema_and_batchnorm_running_stats():
    assert ema([1.0, 2.0], 0.1, 0.0) == pytest.approx(0.9 * 0.1 + 0.2)
    means = [1.0, 5.0, -2.0, 3.0]
    bn, variances = feed_batchnorm(means, 4, 16, 3, seed=0)
    torch.testing.assert_close(
        bn.running_mean.double(),
        torch.full((4,), ema(means, 0.1, 0.0), dtype=torch.float64),
        rtol=0,
        atol=1e-5,
    )
    expected_var = torch.ones(4, dtype=torch.float64)
    for v in variances:
        expected_var = 0.9 * expected_var + 0.1 * v
    torch.testing.assert_close(bn.running_var.double(), expected_var, rtol=1e-5, atol=0)
    assert (bn.running_mean - sum(means) / len(means)).abs().min() > 0.1  # not the cumulative mean
    for v in variances:  # the batches really had unit-ish variance and the stated means
        assert v.shape == (4,)


def test_fold_batchnorm_matches_eval():
    torch.manual_seed(1)
    for bias in (True, False):
        conv = nn.Conv2d(3, 5, 3, padding=1, bias=bias)
        bn = nn.BatchNorm2d(5)
        with torch.no_grad():
            bn.running_mean.copy_(torch.randn(5))
            bn.running_var.copy_(torch.rand(5) + 0.2)
            bn.weight.copy_(torch.randn(5))
            bn.bias.copy_(torch.randn(5))
        bn.eval()
        x = torch.randn(2, 3, 6, 6)
        with torch.no_grad():
            torch.testing.assert_close(fold_batchnorm(conv, bn)(x), bn(conv(x)), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- max of normals, pools, head


def test_phi_and_max_moments():
    assert phi(1.0) == pytest.approx(0.8413447461, abs=1e-9)
    assert phi(1.0) ** 4 == pytest.approx(0.5010, abs=1e-4)
    m1, s1, k1 = max_moments(1)
    assert (m1, s1, k1) == pytest.approx((0.0, 1.0, 3.0), abs=1e-7)
    m2, s2, _ = max_moments(2)
    assert m2 == pytest.approx(1 / math.sqrt(math.pi), abs=1e-7)
    assert s2 == pytest.approx(math.sqrt(1 - 1 / math.pi), abs=1e-7)
    x = torch.randn(200_000, 9, generator=torch.Generator().manual_seed(0)).max(1).values
    m9, s9, _ = max_moments(9)
    assert m9 == pytest.approx(x.mean().item(), abs=0.005)
    assert s9 == pytest.approx(x.std().item(), abs=0.005)


def test_skewness():
    gen = torch.Generator().manual_seed(0)
    assert skewness(torch.randn(400_000, generator=gen)) == pytest.approx(0.0, abs=0.02)
    expo = -torch.log(torch.rand(400_000, generator=gen))
    assert skewness(expo) == pytest.approx(2.0, abs=0.1)
    assert skewness(-expo) == pytest.approx(-2.0, abs=0.1)


def test_two_max_pools_against_a_reshape():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 8, 8, generator=gen)
    g = torch.randn(3, 2, 2, 2, generator=gen)
    out, gx = two_max_pools(x, g)
    blocks = x.reshape(3, 2, 2, 4, 2, 4)  # a 4×4 window per output (two 2×2 maxes = one 4×4 max)
    torch.testing.assert_close(out, blocks.amax(dim=(3, 5)))
    assert int((gx != 0).sum()) == g.numel()
    assert (gx.pow(2).sum() - g.pow(2).sum()).abs() < 1e-5
    assert g.pow(2).mean() / gx.pow(2).mean() == pytest.approx(16.0, rel=1e-5)


def test_head_factors():
    torch.manual_seed(0)
    model = ResidualCNN()
    images = torch.randn(16, 1, 28, 28)
    f = head_factors(model, images, seed=0)
    assert f["avg"] == pytest.approx(1 / 2401, rel=1e-5)
    assert f["chain"] == pytest.approx(f["fc"] * f["avg"] * f["relu"] / f["norm"], rel=1e-5)
    w2 = model.head.fc.weight.detach().double().pow(2)
    assert f["fc"] == pytest.approx(w2.sum(0).mean().item(), rel=0.25)  # E[g²]-weighted Σ_o w², 160 g's
    assert 0 < f["relu"] < 1 and 0 < f["positive"] < 1


def test_groupnorm_backward_divides_by_the_full_rule_not_the_variance():
    """On the ideal stream N(0, 2.68) the head's GroupNorm divides E[g²] by 2.68/(1 − 1/8 − 1/(4π)) = 3.37:
    its backward also removes the group mean of g and g's component along x̂ (head_chain's docstring)."""
    assert FULL_RULE == pytest.approx(3.369, abs=1e-3)
    divisors = []
    for seed in range(5):
        torch.manual_seed(seed)
        model = ResidualCNN()
        gen = torch.Generator().manual_seed(100 + seed)
        stream = IDEAL_VAR**0.5 * torch.randn(256, 32, 7, 7, generator=gen)  # (B, C, 7, 7)
        divisors.append(head_factors(model, torch.zeros(1), seed, stream=stream)["norm"])
    mean = sum(divisors) / len(divisors)
    assert mean == pytest.approx(FULL_RULE, rel=0.06)
    assert mean > 1.15 * IDEAL_VAR  # the lecture's ÷σ² alone is not what GroupNorm's backward does


def test_prediction_interval_for_one_more_init():
    from scipy.stats import t

    mean, half = prediction_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(t.ppf(0.975, 2) * 1.0 * math.sqrt(4 / 3))
    with pytest.raises(ValueError, match="values"):
        prediction_interval([1.0])


def test_batchnorm_affine_against_its_definition():
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 1.5, 2.0, 0.7]))
        bn.bias.copy_(torch.tensor([1.0, -2.0, 0.3, 0.0]))
    running = bn.running_mean.clone()
    assert affine_error(bn, torch.Generator().manual_seed(0)) < 1e-5
    torch.testing.assert_close(bn.running_mean, running)  # left as it was

    class NoShift(nn.BatchNorm2d):  # forgets β
        def forward(self, x):
            return super().forward(x) - self.bias.view(1, -1, 1, 1)

    wrong = NoShift(4)
    wrong.load_state_dict(bn.state_dict())
    assert affine_error(wrong, torch.Generator().manual_seed(0)) > 1e-2


# ----------------------------------------------------------------------------- the harness

NEW = {
    "he-init": {},
    "he-fan-mode": {},
    "weight-uses": {},
    "batchnorm": {},
    "conv-unrolled": {},
    "max-normals": {"samples": "100000"},
    "pool-compound": {},
    "stream-skew": {"batch": "64", "seeds": "0"},
    "head-chain": {"batch": "64", "seeds": "0"},
}


def test_every_new_experiment_runs_with_sourced_verdicts(tmp_path):
    records = {}
    for name, overrides in NEW.items():
        rec = run_experiment(name, profile="quick", overrides=overrides, out=tmp_path, progress=False)
        assert rec["status"] == "complete", rec["error"]
        assert rec["claims"], name
        for c in rec["claims"]:
            assert c["verdict"] in ("ok", "off"), (name, c)
            assert c["source"] in SOURCES and c["ref"], (name, c)
        records[name] = {c["id"]: c for c in rec["claims"]}
    z = records["conv-unrolled"]["zeros"]
    assert z["measured"] == 42 and z["lecture"] == 50 and z["verdict"] == "off"
    assert records["weight-uses"]["uses-14"]["measured"] == 100_352
    assert records["pool-compound"]["nonzero-share"]["measured"] == 1 / 16
