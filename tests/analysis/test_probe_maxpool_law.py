"""A max pool's output is not normal (the max of rectified taps: a long right tail, a mass near 0), and a
norm and a ReLU after it see that shape: the pool hands on its draws' law (``Field.law``), a cat carries
it beside its other inputs' normals, and the ReLU reads it. DenseNet's stem pool feeds every layer of its
first block through a cat then a norm and a ReLU: as a normal of the same moments that ReLU's variance
was 0.87 of the measurement and the gradient 1.4–1.8 of it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.probe.correlated.law import levels, moments, normal_law

DT = torch.float64


def test_normal_law_has_the_normal_moments():
    """Atoms on :func:`levels`' bins of N(m, v): the mean exact, the variance but for the bins' spread."""
    law = normal_law(torch.tensor([[0.5, -2.0]], dtype=DT), torch.tensor([[4.0, 0.25]], dtype=DT))
    m, v = moments(law)
    assert torch.allclose(m, torch.tensor([[0.5, -2.0]], dtype=DT), atol=1e-12)
    assert torch.allclose(v, torch.tensor([[4.0, 0.25]], dtype=DT), rtol=0.005)
    assert torch.allclose(law.w[0, 0], levels(64).diff())


class _DenseStem(nn.Module):
    """DenseNet's stem and one dense layer: conv → BN → ReLU → max pool (3, 2, 1) = x0; a layer
    BN → ReLU → conv of x0; cat(x0, new) → BN → ReLU → a Linear over the flattened map."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.layer = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
        self.norm, self.relu = nn.BatchNorm2d(12), nn.ReLU()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(12 * 6 * 6, 10))

    def forward(self, x):
        x0 = self.pool(self.stem(x))
        return self.head(self.relu(self.norm(torch.cat([x0, self.layer(x0)], 1))))


def measured(model_class, *shape):
    """``measure(..., correlated=True)`` of ``model_class()`` (seed 0's init, float64) on N(0, 1) images
    of ``shape`` (B, C, H, W) from seed 1."""
    from gatepool.analysis.probe.measure import measure

    torch.manual_seed(0)
    model = model_class().double()
    x = torch.randn(*shape, dtype=DT, generator=torch.Generator().manual_seed(1))
    return measure(model, x, correlated=True, prediction=False, samples=0)


@pytest.fixture(scope="module")
def dense_stem_report():
    return measured(_DenseStem, 512, 3, 12, 12)


def test_relu_after_a_norm_of_a_max_pool_reads_the_pools_law(dense_stem_report):
    """512 N(0, 1) images of 3 × 12 × 12, seed 0's init: the ReLUs after the norms of the pool's output
    within 3% of the measured variance (1.008, 0.987; 0.864, 0.889 as normals of the pool's moments)."""
    for name in ("layer.1", "relu"):
        row = dense_stem_report.rows[name]
        ratio = row.predicted.var / row.forward.var
        assert abs(ratio - 1) < 0.03, (name, ratio)


def test_gradient_through_the_pools_law(dense_stem_report):
    """The gradient at the pool's output, the norm's after it and the stem's conv within 5% of the
    measurement (1.017, 1.005, 1.016; as normals 1.133, 1.214, 1.132: the ReLU's gate P(x > 0) of a
    skewed input, and the next norm's divisor from the under-predicted variance)."""
    for name in ("pool", "layer.0", "stem.0"):
        row = dense_stem_report.rows[name]
        ratio = row.predicted.grad_e2 / row.backward.e2
        assert abs(ratio - 1) < 0.05, (name, ratio)


def test_pool_of_a_pools_law():
    """GoogLeNet's pool branch: a 3 × 3 stride-1 max pool of a stride-2 pool's output draws its windows
    from that pool's law (the copula of :mod:`law`, the bins in closed form). Against 2000 draws of
    ReLU(conv) → pool(3, 2, 1) → pool(3, 1, 1), 4 channels of 8 × 8: the variance within 6% (1.03; as a
    normal of the first pool's moments 0.73), the mean within 8% (1.06: the copula's), the lag-1
    correlation within 0.03 (−0.019)."""
    import torch.nn.functional as F

    from gatepool.analysis.probe.correlated.maxpool import MaxPool
    from gatepool.analysis.probe.correlated.measure import measure_field

    g = torch.Generator().manual_seed(0)
    x = F.conv2d(torch.randn(2000, 8, 18, 18, generator=g), torch.randn(4, 8, 3, 3, generator=g) / 8)
    y = MaxPool((3, 3), (2, 2), (1, 1)).forward(measure_field(x.clamp_min(0)), pre=measure_field(x))
    assert y.law is not None
    z = MaxPool((3, 3), (1, 1), (1, 1)).forward(y)
    want = measure_field(F.max_pool2d(F.max_pool2d(x.clamp_min(0), 3, 2, 1), 3, 1, 1))
    assert abs(float(z.var.sum() / want.var.sum()) - 1) < 0.06
    assert abs(float(z.mean.sum() / want.mean.sum()) - 1) < 0.08
    assert abs(float(z.corr[:, 7, 8].mean() - want.corr[:, 7, 8].mean())) < 0.03


def test_copula_table_has_the_bins_masses():
    """The pairs' table of :class:`copula.Counter`: its margins are the bins' masses exactly (each window's
    ranks fill every bin), ties broken apart (draws of a law's atoms); of independent windows it is the
    product of its margins, of equal ones diagonal."""
    from gatepool.analysis.probe.correlated.copula import Counter

    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 512, generator=g)
    for b, kind in ((torch.randn(64, 512, generator=g), "independent"), (a.clone(), "equal"),
                    (torch.zeros(64, 512), "ties")):  # fmt: skip
        c = Counter(2, 32, 512)
        c.add(a[:32], b[:32])
        c.add(a[32:], b[32:])
        t = c.table()
        mass = c.u.diff()
        assert torch.allclose(t.sum(-1), mass.expand(2, -1), atol=1e-12), kind
        assert torch.allclose(t.sum(-2), mass.expand(2, -1), atol=1e-12), kind
        if kind == "equal":
            assert torch.allclose(t, torch.diag_embed(mass).expand(2, -1, -1), atol=1e-12)
        else:  # the body's cells (16 × 16 draws of 16384 expected each: ~25% of sampling error a cell)
            body = (t / (mass[:, None] * mass[None, :]))[:, 4:-4, 4:-4]
            assert (body - 1).abs().mean() < 0.3, (kind, float((body - 1).abs().mean()))


class _PoolNormRelu(nn.Module):
    """A stem, a 3 × 3 stride-2 max pool, a norm, a ReLU and a 2 × 2 avg pool (DenseNet's stem pool as its
    first block's norms, ReLUs and its transition's pool read it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.norm, self.relu, self.avg = nn.BatchNorm2d(8), nn.ReLU(), nn.AvgPool2d(2)

    def forward(self, x):
        return self.avg(self.relu(self.norm(self.pool(self.stem(x)))))


def test_relu_after_a_norm_of_a_max_pool_reads_the_windows_joint_law():
    """Neighbouring windows of a 3 × 3 stride-2 max pool share a row of taps: their maxima are dependent in
    the upper tail, which the Gaussian copula of the pool's law has not, and the ReLU after the norm reads
    the pairs' joint law (``Field.copula``) at the pool's neighbour lags. 512 N(0, 1) images of 3 × 12 × 12,
    seed 0's init, against the measurement: the ReLU's lag sums Σ_p Cov(y_p, y_{p+e}) at e = (0, 1), (1, 0)
    within 5% (0.965, 0.970; by the Gaussian copula 0.71, 0.69), the avg pool's variance within 7% (0.955;
    0.83)."""
    from gatepool.analysis.probe.correlated import measure_input
    from gatepool.analysis.probe.correlated.measure import measure_field
    from gatepool.analysis.probe.correlated_predict import predict_correlated

    torch.manual_seed(0)
    model = _PoolNormRelu().double()
    x = torch.randn(512, 3, 12, 12, dtype=DT, generator=torch.Generator().manual_seed(1))
    pred = predict_correlated(model, measure_input(x), batch=512)
    outs = {}
    for name in ("relu", "avg"):
        model.get_submodule(name).register_forward_hook(lambda m, i, o, n=name: outs.__setitem__(n, o))
    with torch.no_grad():
        model(x)
    assert pred["norm"].field.copula is not None
    got, want = pred["relu"].field.lag_sums(), measure_field(outs["relu"]).lag_sums()
    H, W = outs["relu"].shape[-2:]
    for dh, dw in ((0, 1), (1, 0)):
        ratio = float(got[:, H - 1 + dh, W - 1 + dw].sum() / want[:, H - 1 + dh, W - 1 + dw].sum())
        assert abs(ratio - 1) < 0.05, ((dh, dw), ratio)
    ratio = float(pred["avg"].field.var.sum() / measure_field(outs["avg"]).var.sum())
    assert abs(ratio - 1) < 0.07, ratio
