"""The correlated probe's fast paths give the numbers of the paths they replace: the pointwise rule's
coefficients interpolated on the (m/s, log s) lattice against each position's own integral, the whole
rule with and without the lattice, the series cut where its tail, or ρ's power, is under ``_TAIL`` against
all its terms, and the rows' dedup against ``torch.unique``."""

from __future__ import annotations

import pytest
import torch
from test_probe_correlated import DT

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated import pointwise as pw
from gatepool.analysis.probe.correlated.field import xcorr

SMOOTH = ("gelu", "silu", "sigmoid", "tanh")


def _field(C=16, H=32, W=32, seed=0) -> cr.Field:
    """A field of many distinct positions (m, s) clustered as a layer's are (means near 0, s near 0.6):
    the lattice needs far fewer nodes than there are positions, so the rule interpolates."""
    g = torch.Generator().manual_seed(seed)
    mean = 0.15 * torch.randn(C, 1, 1, generator=g, dtype=DT)
    mean = mean + 0.02 * torch.randn(C, H, W, generator=g, dtype=DT)
    sd = 0.6 * torch.exp(0.03 * torch.randn(C, H, W, generator=g, dtype=DT))
    lag = torch.stack(torch.meshgrid(torch.arange(1 - H, H), torch.arange(1 - W, W), indexing="ij")).to(DT)
    corr = torch.exp(-(lag**2).sum(0) / 6.0).expand(C, -1, -1).clone()
    return cr.Field(mean, sd**2, corr)


@pytest.fixture
def interpolated(monkeypatch):
    """Counts the positions the lattice interpolated (so a test knows the fast path ran)."""
    seen = []
    real = pw._interpolate

    def spy(table, rows, w, order):
        seen.append(rows.shape[1])
        return real(table, rows, w, order)

    monkeypatch.setattr(pw, "_interpolate", spy)
    return seen


@pytest.mark.parametrize("name", SMOOTH)
def test_the_lattice_gives_each_positions_own_integral(name, interpolated):
    """Every coefficient within 1e-7 of h's standard deviation, every variance within 1e-6 of itself."""
    f, _ = pw.ACTIVATIONS[name]
    x = _field()
    s = x.var.sqrt()
    h = pw.hermite_coefficients(f, (), x.mean, s)
    assert interpolated == [x.mean.numel()]
    flat = pw._integrate(f, (), torch.stack([x.mean.flatten(), s.flatten()], 1), pw._ORDER)
    hw = 3 * (pw._ORDER + 2)
    exact = flat[:, :hw].unflatten(1, (3, pw._ORDER + 2))  # (P, 3, N + 2): f, f', u
    powers = flat[:, hw:].unflatten(1, (6, pw._POWERS))  # (P, 6, 5): f² … f'²f² at He_0 … He_4
    got_powers = h["powers"].flatten(2).movedim(-1, 0)  # (P, 6, 5)
    scale = powers.abs().amax(2, keepdim=True)  # each power's size at each position
    assert float(((got_powers - powers).abs() / scale).max()) < 1e-6
    for i, key in enumerate(("f", "df", "u")):
        mean, e2, coef = h[key]
        var = exact[:, i, -1] - exact[:, i, 0] ** 2
        sd = var.clamp_min(1e-30).sqrt()
        assert float(((mean.flatten() - exact[:, i, 0]).abs() / sd).max()) < 1e-7
        got = torch.stack([c.flatten() for c in coef], 1)
        assert float(((got - exact[:, i, 1:-1]).abs() / sd[:, None]).max()) < 1e-7
        assert float(((e2.flatten() - mean.flatten() ** 2 - var).abs() / var).max()) < 1e-6


@pytest.mark.parametrize("name", ("gelu", "silu"))
def test_the_rule_with_the_lattice_gives_the_exact_rules_numbers(name, interpolated, monkeypatch):
    """Forward and backward of the whole rule: variances within 1e-6 relative, correlations within 1e-7,
    means within 1e-7 of the output's standard deviation."""
    x, g = _field(), _field(seed=1)
    g = cr.Field(torch.zeros_like(g.mean), g.var, g.corr)
    fast = cr.Pointwise(name)
    y, gx = fast.forward(x), fast.backward(g)
    assert interpolated == [x.mean.numel()]
    monkeypatch.setattr(pw, "_lattice", lambda ms, step=pw._GRID: None)  # every position its own integral
    slow = cr.Pointwise(name)
    y0, gx0 = slow.forward(x), slow.backward(g)
    assert interpolated == [x.mean.numel()]
    assert float(((y.mean - y0.mean).abs() / y0.var.sqrt()).max()) < 1e-7
    for a, b in ((y.var, y0.var), (gx.var, gx0.var), (gx.yy, gx0.yy)):
        assert float(((a - b).abs() / b.abs()).max()) < 1e-6
    for a, b in ((y.corr, y0.corr), (gx.corr, gx0.corr)):
        assert float((a - b).abs().max()) < 1e-7


def test_kinks_and_few_positions_are_integrated_each(interpolated):
    """ReLU6 (kinks) and a small field never use the lattice: their numbers are the integrals'."""
    x = _field()
    cr.Pointwise("relu6").forward(x)
    small = _field(C=2, H=4, W=4)
    cr.Pointwise("gelu").forward(small)
    assert interpolated == []


@pytest.mark.parametrize("scale, most", [(1.0, 24), (0.02, 4)])
def test_the_cut_series_gives_all_its_terms(scale, most):
    """Cut where the terms left hold under ``_TAIL`` of the variance, or where the largest |ρ| off lag 0
    to the power N + 1 is under it, the lag sums are the whole series' (all 24 terms, then the
    remainder) within 2·_TAIL·Σ_p √(v_p v_{p+e}) at every lag e; at |ρ| ≤ 0.02 (a transformer's
    tokens) the cut keeps at most 4 terms."""
    x = _field(C=4, H=12, W=12)
    corr = x.corr * scale
    corr[:, 11, 11] = 1.0
    s = x.var.sqrt()
    for name in ("gelu", "tanh", "relu6"):
        f, kinks = pw.ACTIVATIONS[name]
        mean, e2, coef = pw.hermite_coefficients(f, kinks, x.mean, s)["f"]
        var = (e2 - mean * mean).clamp_min(0)
        rest = (var - sum(c * c for c in coef)).clamp_min(0).sqrt()
        full = sum(corr ** (n + 1) * xcorr(c, c) for n, c in enumerate(coef))
        full = full + corr ** (len(coef) + 1) * xcorr(rest, rest)
        cut = pw.series_lag_sums(corr, mean, e2, coef)
        sd = var.sqrt()
        assert bool(((cut - full).abs() <= 2 * pw._TAIL * xcorr(sd, sd) + 1e-13).all()), name
        assert len(pw._terms(var, coef, corr)) <= most


def test_the_rule_keeps_no_view_of_its_table():
    """What the rule's output and its backward keep are tensors of their own: a view of one row of the
    coefficients' (width, positions) table keeps the whole table alive through the walk (a ViT-B's
    twelve GELUs held 6 GB that way)."""
    x = _field(C=4, H=12, W=12)
    for skewed in (False, True):
        if skewed:
            shape = 0.3 * torch.ones_like(x.var)
            x = cr.Field(x.mean, x.var, x.corr, skew=shape, kurt=shape)
        step = pw.Pointwise("gelu")
        out = step.forward(x)
        kept = [out.mean, out.var, out.corr, out.skew, out.kurt, *step.mom.values(), step.h["powers"]]
        kept += [t for key in ("df", "u") for t in (*step.h[key][:2], *step.h[key][2])]
        assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in kept)


def test_unique_rows_is_torch_unique():
    g = torch.Generator().manual_seed(0)
    ms = torch.randint(0, 5, (400, 2), generator=g).to(DT) / 4
    rows, where = pw._unique_rows(ms)
    ref, ref_where = torch.unique(ms, dim=0, return_inverse=True)
    assert torch.equal(rows, ref) and torch.equal(where, ref_where)


def test_positions_of_no_variance_beside_the_lattice_are_integrated_each(interpolated):
    """A row of constant positions (s = 0) takes its own integral exactly; the others are interpolated."""
    x = _field()
    s = x.var.sqrt()
    s[:, 0, :] = 0
    f, _ = pw.ACTIVATIONS["gelu"]
    mean, e2, _ = pw.hermite_coefficients(f, (), x.mean, s)["f"]
    assert interpolated == [x.mean.numel() - x.mean[:, 0].numel()]
    exact = pw._integrate(f, (), torch.stack([x.mean.flatten(), s.flatten()], 1), pw._ORDER)
    exact = exact[:, : 3 * (pw._ORDER + 2)].reshape(*x.shape, 3, -1)  # f, f', u's columns
    assert torch.allclose(mean[:, 0], exact[:, 0, :, 0, 0], rtol=1e-13, atol=0)
    assert torch.allclose(e2[:, 0], exact[:, 0, :, 0, -1], rtol=1e-13, atol=0)
    assert float((mean - exact[..., 0, 0]).abs().max()) < 1e-8
