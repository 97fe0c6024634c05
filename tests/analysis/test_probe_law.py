"""The state's law where the field is not normal (a spike at the background and a tail of strokes), against
Monte Carlo on a synthetic sparse field of known correlation: x = Q(Φ(z)), z a smooth Gaussian field,
Q zero with probability 0.85 and an exponential tail above. Each test shows the Gaussian rule (the same
statistics without their law) off and the law's rule within tolerance."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import measure
from gatepool.analysis.probe.correlated import (
    BatchNorm,
    Conv,
    Field,
    MaxPool,
    ReLU,
    conv_law,
    latent_corr,
    measure_field,
    measure_input,
    sum_law,
)
from gatepool.analysis.probe.correlated.law import (
    add_normal,
    bins,
    hermite_steps,
    levels,
    on_levels,
    quantile_law,
)
from gatepool.analysis.probe.correlated.normal import Law

SPIKE = 0.85  # P(x = 0): the background
H = 16


def _kernel():
    k = torch.exp(-0.5 * (torch.arange(-2, 3, dtype=torch.float64) / 1.2) ** 2)
    return (k[:, None] * k[None, :]) / (k[:, None] * k[None, :]).pow(2).sum().sqrt()  # Σ k² = 1


def _latent(batch: int, seed: int) -> torch.Tensor:
    """z (B, 1, H, H): white noise through a 5×5 Gaussian kernel, unit variance, stationary correlation."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch, 1, H + 4, H + 4, generator=g, dtype=torch.float64)
    return F.conv2d(noise, _kernel()[None, None])


def _latent_rho(dh: int, dw: int) -> float:
    k = _kernel()
    return float(F.conv2d(F.pad(k, (4, 4, 4, 4))[None, None], k[None, None])[0, 0, 4 + dh, 4 + dw])


def _sparse(batch: int, seed: int = 0) -> torch.Tensor:
    """x = Q(Φ(z)): 0 below the 0.85 quantile, Exp(1) above (B, 1, H, H)."""
    u = torch.special.ndtr(_latent(batch, seed))
    return torch.where(u > SPIKE, -torch.log((1 - u).clamp_min(1e-12) / (1 - SPIKE)), torch.zeros_like(u))


@pytest.fixture(scope="module")
def data():
    stats = measure_input(_sparse(20000, seed=1), law=True)  # the input: statistics of one batch
    truth = _sparse(40000, seed=2)  # Monte Carlo, an independent batch
    return stats, truth


def _gauss(f: Field) -> Field:
    return replace(f, law=None)


def test_rebin_keeps_the_mean_and_each_bins_mean():
    """Atom k is the mean of the quantile function over its bin (its mass the bin's), the mean kept."""
    x = torch.linspace(0, 1, 1000, dtype=torch.float64).pow(3)[None]  # a right tail
    law = quantile_law(x, 16)
    edges = levels(16)
    assert torch.allclose(law.w[0], edges.diff())
    assert float((law.x * law.w).sum()) == pytest.approx(float(x.mean()), rel=1e-12)
    u = (torch.arange(10**6, dtype=torch.float64) + 0.5) / 10**6
    q = x[0, (u * 1000).long()]  # Q(u) on a fine grid
    for k in range(16):
        inside = (u > edges[k]) & (u <= edges[k + 1])
        assert float(law.x[0, k]) == pytest.approx(float(q[inside].mean()), abs=2e-3)


def test_quantile_table_is_the_step_function():
    """A draw's bin from :func:`bins`, shared by every position, picks Q_p(Φ(z)) from :func:`on_levels`'s
    table: the atom whose cumulative masses bracket Φ(z) (a law on other masses is rebinned first, its
    mean kept)."""
    g = torch.Generator().manual_seed(0)
    law = quantile_law(torch.randn(5, 3, 4000, generator=g, dtype=torch.float64).exp())  # (5, 3, 64)
    z = torch.randn(1000, generator=g, dtype=torch.float64)
    got = on_levels(law).gather(-1, bins(z, 64).expand(5, 3, -1))  # (5, 3, 1000)
    u = torch.special.ndtr(z)
    want = torch.stack([torch.stack([row[torch.searchsorted(cw, u)] for row, cw in zip(x, c)])
                        for x, c in zip(law.x, law.w.cumsum(-1))])  # fmt: skip
    assert torch.equal(got, want)
    other = Law(law.x[..., ::4], torch.rand(5, 3, 16, generator=g, dtype=torch.float64).softmax(-1))
    table = on_levels(other)
    assert torch.allclose(table.mul(levels(16).diff()).sum(-1), (other.x * other.w).sum(-1), rtol=1e-12)
    assert not torch.equal(table, other.x)


def test_bins_in_closed_form_are_the_search_over_the_edges():
    """:func:`bins` counts the edges below Φ(z) on each of :func:`levels`' two grids: the bin a search
    over the sorted edges finds, for every atom count (odd, even, small), but for draws within rounding
    of an edge (none of 200 000 in float64)."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(200_000, generator=g, dtype=torch.float64) * 1.7
    for atoms in (64, 49, 16, 7):
        want = torch.bucketize(torch.special.ndtr(z), levels(atoms)[1:-1])
        assert torch.equal(bins(z, atoms), want), atoms


def test_hermite_steps_of_a_step_function():
    """a_n of 1[z > t] is φ(t) He_{n−1}(t): a law with atoms 0, 1 and masses Φ(t), 1 − Φ(t)."""
    t = torch.tensor([0.3, -1.1], dtype=torch.float64)
    w0 = torch.special.ndtr(t)
    law = quantile_law(torch.zeros(2, 1)).__class__(
        torch.tensor([[0.0, 1.0]] * 2, dtype=torch.float64), torch.stack([w0, 1 - w0], -1)
    )
    a = hermite_steps(law, 3)
    phi = torch.exp(-t * t / 2) / (2 * torch.pi) ** 0.5
    for got, want in zip(a, (phi, phi * t, phi * (t * t - 1))):
        assert torch.allclose(got, want, atol=1e-9)


def test_latent_corr_recovers_the_copula(data):
    """NORTA: the sparse field's correlation is far below its latent field's; latent_corr finds ρ_z."""
    stats, _ = data
    rz = latent_corr(stats.law, stats.corr)
    c = H - 1
    for dh, dw in ((0, 1), (1, 0), (1, 1), (0, 2), (2, 2)):
        want = _latent_rho(dh, dw)
        assert float(stats.corr[0, c + dh, c + dw]) < want - 0.05  # the field's own: the Gaussian's
        assert float(rz[0, c + dh, c + dw]) == pytest.approx(want, abs=0.03)


def _mc_relu_after_norm(y: torch.Tensor):
    """ReLU(BN(y)) of a batch: BN over the batch and positions per channel (train, no affine)."""
    yn = (y - y.mean((0, 2, 3), keepdim=True)) / y.var((0, 2, 3), unbiased=False, keepdim=True).sqrt()
    r = yn.clamp_min(0)
    return r, float((yn > 0).double().mean())


def _predicted_relu_after_norm(f: Field):
    relu = ReLU()
    out = relu.forward(BatchNorm(None, None, 0.0).forward(f))
    return out, float(relu.pos.mean()), relu


def test_max_pool_then_norm_then_relu(data):
    """max pool of the sparse field, a norm, a ReLU: the ReLU's P(x > 0) and variance. A normal of the
    pool's own moments passes far too many positions; the law's draws pass the right share."""
    stats, truth = data
    pooled = F.max_pool2d(truth, 2)
    r, pos = _mc_relu_after_norm(pooled)
    mc_var = float(r.var(0, unbiased=False).mean())
    new = MaxPool((2, 2), (2, 2)).forward(stats)
    assert float(new.var.mean()) == pytest.approx(float(pooled.var(0).mean()), rel=0.05)
    out, p_new, _ = _predicted_relu_after_norm(new)
    old, p_old, _ = _predicted_relu_after_norm(_gauss(MaxPool((2, 2), (2, 2)).forward(_gauss(stats))))
    assert p_new == pytest.approx(pos, abs=0.02)
    assert abs(p_old - pos) > 0.05
    assert float(out.var.mean()) == pytest.approx(mc_var, rel=0.05)
    assert abs(float(old.var.mean()) / mc_var - 1) > 0.08


def test_relu_of_a_law_correlations(data):
    """ReLU(x − 0.5) of the sparse field: variance, P(x > 0), lag-1 and lag-2 covariance by the copula's
    series (a normal of the same moments and correlation is off), and the backward's gate E[g²]."""
    stats, truth = data
    law = stats.law.__class__(stats.law.x - 0.5, stats.law.w)
    moved = replace(stats.regime, bg=stats.regime.bg - 0.5)  # its background shifted with the field
    shifted = replace(stats, mean=stats.mean - 0.5, law=law, regime=moved)
    r = (truth - 0.5).clamp_min(0)
    mc = measure_field(r)
    relu = ReLU()
    new = relu.forward(shifted)
    old = ReLU().forward(_gauss(shifted))
    c = H - 1
    assert float(relu.pos.mean()) == pytest.approx(float((truth > 0.5).double().mean()), abs=0.01)
    assert float(new.var.mean()) == pytest.approx(float(mc.var.mean()), rel=0.03)
    for dh, dw in ((0, 1), (1, 1), (0, 2)):
        want = float(mc.lag_sums()[0, c + dh, c + dw])
        assert float(new.lag_sums()[0, c + dh, c + dw]) == pytest.approx(want, rel=0.05)
        assert abs(float(old.lag_sums()[0, c + dh, c + dw]) / want - 1) > 0.1
    # backward: unit independent gradient, E[g_x²] = P(x > 0) and the gate's joint at lag 1
    g = Field(torch.zeros(1, H, H, dtype=torch.float64), torch.ones(1, H, H, dtype=torch.float64),
              torch.zeros(1, 2 * H - 1, 2 * H - 1, dtype=torch.float64))  # fmt: skip
    g.corr[0, c, c] = 1.0
    g.corr[0, c, c + 1] = g.corr[0, c, c - 1] = 0.5
    back = relu.backward(g)
    gate = (truth > 0.5).double()
    joint = float((gate[..., :, 1:] * gate[..., :, :-1]).mean(0).sum()) * 0.5
    assert float(back.lag_sums()[0, c, c + 1]) == pytest.approx(joint, rel=0.05)


def test_conv_law_then_pool_norm_relu(data):
    """The first conv's law from draws of its taps (the input's marginal and copula), through a max
    pool, a norm and a ReLU: P(x > 0) and the variance; the Gaussian rule passes too many."""
    stats, truth = data
    torch.manual_seed(0)
    w = torch.randn(4, 1, 3, 3, dtype=torch.float64).abs() / 3  # positive: the strokes stay a tail
    b = torch.zeros(4, dtype=torch.float64)
    conv = Conv(w, b, (1, 1), (1, 1))
    y = F.conv2d(truth, w, b, padding=1)
    f = conv.forward(stats)
    law = conv_law(stats, conv, f)
    assert law is not None and law.x.shape == (4, H, H, 64)
    assert torch.allclose((law.w * law.x).sum(-1), f.mean)  # moved to the conv's exact moments
    # the shape: the draws' skew as Monte Carlo's (a normal's is 0)
    z = (law.x - f.mean[..., None]) / f.var.sqrt()[..., None]
    skew = (law.w * z**3).sum(-1)
    mc_skew = ((y - y.mean(0)) ** 3).mean(0) / y.var(0) ** 1.5
    assert float(skew[:, 2:-2, 2:-2].mean()) == pytest.approx(float(mc_skew[:, 2:-2, 2:-2].mean()), rel=0.1)
    r, pos = _mc_relu_after_norm(F.max_pool2d(y, 2))
    out, p_new, _ = _predicted_relu_after_norm(MaxPool((2, 2), (2, 2)).forward(replace(f, law=law)))
    old, p_old, _ = _predicted_relu_after_norm(MaxPool((2, 2), (2, 2)).forward(f))
    assert p_new == pytest.approx(pos, abs=0.02)
    assert abs(p_old - pos) > 0.05
    assert float(out.var.mean()) == pytest.approx(float(r.var(0, unbiased=False).mean()), rel=0.06)


def test_sum_law_of_a_law_and_a_normal(data):
    """x + b, b ~ N(−0.5, 0.25) independent: P(x + b > 0), E[ReLU(x + b)] and the third central moment
    from the sum's law, as Monte Carlo."""
    stats, truth = data
    full = torch.ones((1, H, H), dtype=torch.float64)
    b = Field(-0.5 * full, 0.25 * full, stats.corr)
    law = sum_law(b, stats)
    assert law is not None
    g = torch.Generator().manual_seed(3)
    s = truth - 0.5 + 0.5 * torch.randn(truth.shape, generator=g, dtype=torch.float64)
    p = float((law.w * (law.x > 0)).sum(-1).mean())  # to within about half an atom's mass
    assert p == pytest.approx(float((s > 0).double().mean()), abs=0.015)
    relu = float((law.w * law.x.clamp_min(0)).sum(-1).mean())
    assert relu == pytest.approx(float(s.clamp_min(0).mean()), rel=0.03)
    skew = float(((law.w * (law.x - law.x.mul(law.w).sum(-1, keepdim=True)) ** 3).sum(-1)).mean())
    assert skew == pytest.approx(float(((s - s.mean(0)) ** 3).mean(0).mean()), rel=0.05)
    assert torch.allclose(add_normal(stats.law, b.mean[0], b.var[0]).x, law.x)


def test_sum_law_with_a_constant_is_the_law_shifted(data):
    """x + b with b constant (a zero-initialised BatchNorm's branch beside a pooled stream): the sum's
    atoms stay in order (an interval of the quantile grid without mass keeps its atom inside it), and
    ReLU(x + b)'s variance and lag-1 covariance are Monte Carlo's."""
    stats, truth = data
    full = torch.ones((1, H, H), dtype=torch.float64)
    law = sum_law(Field(-0.5 * full, 0 * full, stats.corr), stats)
    assert bool((law.x.diff(dim=-1) >= 0).all())
    s = truth - 0.5
    assert float((law.w * (law.x > 0)).sum(-1).mean()) == pytest.approx(
        float((s > 0).double().mean()), abs=0.01
    )
    new = ReLU().forward(replace(stats, mean=stats.mean - 0.5, law=law, regime=None))
    mc = measure_field(s.clamp_min(0))
    assert float(new.var.mean()) == pytest.approx(float(mc.var.mean()), rel=0.03)
    c = H - 1
    assert float(new.lag_sums()[0, c, c + 1]) == pytest.approx(float(mc.lag_sums()[0, c, c + 1]), rel=0.05)


def test_measure_input_carries_a_law_where_the_input_is_sparse():
    """By default the law is measured where the background holds ≥ 90% of the values, never for noise."""
    g = torch.Generator().manual_seed(0)
    assert measure_input(torch.randn(64, 1, 8, 8, generator=g)).law is None
    sparse = torch.zeros(64, 1, 8, 8)
    sparse[:, :, 3, 3:5] = torch.rand(64, 1, 2, generator=g) + 0.5  # 2 of 64 pixels: strokes
    f = measure_input(sparse)
    assert f.law is not None and f.law.x.shape == (1, 8, 8, 64)
    assert float(f.law.x[0, 0, 0].abs().max()) == 0.0  # the background: a spike at 0
    assert measure_input(sparse, law=False).law is None


def test_a_zero_initialised_branch_beside_a_max_pools_law():
    """A ResNet stem (conv, BatchNorm, ReLU, max pool 3 × 3 / 2 whose law the walk carries), then two
    blocks whose last BatchNorm is zero-initialised (timm's ``zero_init_last``): at init each block's branch
    has variance 0 and its add is the pool's law shifted. Every row predicted finite, and the blocks'
    ReLUs within 10% of the measurement."""
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, c: int = 8):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.relu = nn.ReLU()
            nn.init.zeros_(self.bn2.weight)

        def forward(self, x):  # (B, C, H, W)
            return self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + x)

    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                        Block(), Block(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))  # fmt: skip
    report = measure(net, torch.randn(16, 3, 32, 32), correlated=True, prediction=False, samples=0)
    rows = {r.name: r for r in report.rows.values()}
    assert all(math.isfinite(r.predicted.var) and math.isfinite(r.predicted.grad_e2) for r in rows.values())
    for name in ("4", "5"):  # the blocks' outputs: ReLU(0-variance branch + the stream)
        assert rows[name].predicted.var == pytest.approx(rows[name].forward.var, rel=0.1)
