"""The regime per position that the channels share (:mod:`regime`), against Monte Carlo on a synthetic
sparse field: a smooth Gaussian field thresholded to strokes on an empty background (P(stroke) 0.12),
through two 3×3 convs with biases (the second over 16 channels × 9 taps: a scale mixture, background
or strokes for all channels at once, far from normal). The regime's propagation is exact; a ReLU of
the mixture gets P(x > 0) and the variance where the normal of the same moments is far off."""

import functools

import torch
import torch.nn.functional as F

from gatepool.analysis.probe.correlated import Conv, Field, ReLU, measure_field
from gatepool.analysis.probe.correlated import regime as rg
from gatepool.analysis.probe.correlated_predict import _regime_through

H, B = 16, 1200


def _input(seed: int = 0) -> torch.Tensor:
    """(B, 1, H, H): 0 (the background) where a smooth Gaussian field is below its 0.88 quantile, else
    1 + the field (strokes)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.exp(-0.5 * (torch.arange(-3, 4, dtype=torch.float64) / 1.5) ** 2)
    noise = torch.randn(B, 1, H + 6, H + 6, generator=g, dtype=torch.float64)
    z = F.conv2d(noise, (k[:, None] * k[None, :])[None, None])
    z = z / z.std()
    return torch.where(z > 1.175, 1 + z, torch.zeros_like(z))


def _net(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    W1 = torch.randn(16, 1, 3, 3, generator=g, dtype=torch.float64) / 3
    b1 = torch.randn(16, generator=g, dtype=torch.float64) * 0.3
    W2 = torch.randn(8, 16, 3, 3, generator=g, dtype=torch.float64) * (2 / 144) ** 0.5
    b2 = torch.randn(8, generator=g, dtype=torch.float64) * 0.5
    return (W1, b1), (W2, b2)


@functools.lru_cache(maxsize=1)
def _sample():
    """The input, the net's output on it and its regime; the output's measured field."""
    x = _input()
    y, r = _through(x, rg.of_input(x))
    return x, y, r, measure_field(y)


def _through(x, r):
    """The two convs (a ReLU between) on the batch, and the regime moved alike."""
    (W1, b1), (W2, b2) = _net()
    y = F.conv2d(F.relu(F.conv2d(x, W1, b1, padding=1)), W2, b2, padding=1)
    r = rg.conv(r, W1, b1, (1, 1), (1, 1))
    r = rg.conv(rg.relu(r), W2, b2, (1, 1), (1, 1))
    return y, r


def test_regime_moves_exactly():
    """Where a sample's mask is off, the net's output there is bg, to rounding; the masks are the input's
    strokes grown by the two 3×3 windows (a smaller window would leave outputs off bg)."""
    x, y, r, _ = _sample()
    off = ~r.masks[:, None].expand_as(y)
    bg = r.bg[None].expand_as(y)
    assert off.any() and (~off).any()
    assert (y[off] - bg[off]).abs().max() < 1e-9
    assert 0.3 < float(r.share.mean()) < 0.7
    # the add: either term's masks, the backgrounds summed
    s = rg.add(r, r)
    assert torch.equal(s.masks, r.masks) and torch.allclose(s.bg, 2 * r.bg)
    # a max pool: the window's max of both
    p = rg.max_pool(r, (2, 2), (2, 2), (0, 0))
    yp = F.max_pool2d(y, 2)
    offp = ~p.masks[:, None].expand_as(yp)
    assert (yp[offp] - p.bg[None].expand_as(yp)[offp]).abs().max() < 1e-9


def _relu_of(f: Field) -> tuple[ReLU, Field]:
    step = ReLU()
    return step, step.forward(f)


def test_relu_of_mixture_against_monte_carlo():
    """P(x > 0) pooled within 0.02 and the output's variance within 5% of Monte Carlo (the normal of the
    same mean and variance per position: more than 0.05 and 10% off); back, E[1[x > 0] g²] with g
    independent unit noise is P(x > 0): within 0.02."""
    x, y, r, f = _sample()
    mc_pos = float((y > 0).double().mean())
    mc_var = float(F.relu(y).var(0, unbiased=False).mean())

    step, out = _relu_of(Field(f.mean, f.var, f.corr, regime=r))
    assert abs(float(step.pos.mean()) - mc_pos) < 0.02
    assert abs(float(out.var.mean()) / mc_var - 1) < 0.05
    C = y.shape[1]
    g = Field(torch.zeros(C, H, H, dtype=torch.float64), torch.ones(C, H, H, dtype=torch.float64),
              measure_field(torch.randn(64, C, H, H, dtype=torch.float64)).corr)  # fmt: skip
    assert abs(float(step.backward(g).var.mean()) - mc_pos) < 0.02

    normal, nout = _relu_of(f)  # no regime: the normal per position
    assert abs(float(normal.pos.mean()) - mc_pos) > 0.05
    assert abs(float(nout.var.mean()) / mc_var - 1) > 0.10
    assert out.regime is not None and torch.equal(out.regime.bg, r.bg.clamp_min(0))


def test_conv_step_regime_matches_module():
    """The walk's dispatch (``correlated_predict._regime_through``) for a conv: its bg is the conv of bg."""
    x = _input()[:8]
    (W1, b1), _ = _net()
    step = Conv(W1, b1, (1, 1), (1, 1))
    f = measure_field(x)
    f.regime = rg.of_input(x)
    out = step.forward(f)
    r = _regime_through(step, f, out)
    assert torch.allclose(r.bg, F.conv2d(torch.zeros(1, 1, H, H, dtype=torch.float64), W1, b1, padding=1)[0])


def test_mixture_law_of_a_residual_sum():
    """s = y + conv(ReLU(y)) (a stream and its branch, both background where the input is): the law
    (1 − π) δ_bg + π N(m_s, v_s) (:func:`regime.mixture_law`) keeps the mean and variance per position,
    and its P(s > 0) pooled is within 0.02 of Monte Carlo, where the normal of the same moments is more
    than 0.03 off."""
    x, y, r, _ = _sample()
    g = torch.Generator().manual_seed(2)
    W3 = torch.randn(8, 8, 3, 3, generator=g, dtype=torch.float64) * (2 / 72) ** 0.5
    s = y + F.conv2d(F.relu(y), W3, padding=1)
    rs = rg.add(r, rg.conv(rg.relu(r), W3, None, (1, 1), (1, 1)))
    f = measure_field(s)
    law = rg.mixture_law(f.mean, f.var, rs)
    m = (law.w * law.x).sum(-1)
    v = (law.w * (law.x - m[..., None]) ** 2).sum(-1)
    assert torch.allclose(m, f.mean, atol=1e-6) and float((v / f.var - 1).abs().max()) < 0.05
    mc = float((s > 0).double().mean())
    assert abs(float((law.w * (law.x > 0)).sum(-1).mean()) - mc) < 0.02
    normal = float(torch.special.ndtr(f.mean / f.var.sqrt()).mean())
    assert abs(normal - mc) > 0.03


def _inked(seed: int = 0, n: int = 600) -> torch.Tensor:
    """(n, 1, H, H): as :func:`_input`, but each sample with its own ink (a factor 0.2–3.2) and its own
    threshold (the stroke share from about 0.01 to 0.5): the deviation's scale varies from sample to
    sample and from the strokes' core to their edge, which two regimes cannot carry."""
    g = torch.Generator().manual_seed(seed)
    k = torch.exp(-0.5 * (torch.arange(-3, 4, dtype=torch.float64) / 1.5) ** 2)
    noise = torch.randn(n, 1, H + 6, H + 6, generator=g, dtype=torch.float64)
    z = F.conv2d(noise, (k[:, None] * k[None, :])[None, None])
    z = z / z.std()
    ink = torch.rand(n, 1, 1, 1, generator=g, dtype=torch.float64) * 3 + 0.2
    t = 1.175 + 0.8 * torch.randn(n, 1, 1, 1, generator=g, dtype=torch.float64).clamp(-1.2, 1.2)
    return torch.where(z > t, ink * (1 + z - t), torch.zeros_like(z))


@functools.lru_cache(maxsize=1)
def _inked_sample():
    """The inked input through conv (1 → 16), ReLU, conv (16 → 16), each tensor with its regime moved
    by :mod:`regime` (the energy levelled to each tensor's measured moments, as the walk does to its
    predicted ones) and the measured per-sample energy, the channels' mean of (x − bg)²."""
    x = _inked()
    g = torch.Generator().manual_seed(1)
    W1 = torch.randn(16, 1, 3, 3, generator=g, dtype=torch.float64) / 3
    b1 = torch.randn(16, generator=g, dtype=torch.float64) * 0.3
    W2 = torch.randn(16, 16, 3, 3, generator=g, dtype=torch.float64) * (2 / 144) ** 0.5
    b2 = torch.randn(16, generator=g, dtype=torch.float64) * 0.5
    W3 = torch.randn(16, 16, 3, 3, generator=g, dtype=torch.float64) * (2 / 144) ** 0.5
    y1 = F.conv2d(x, W1, b1, padding=1)
    f1 = measure_field(y1)
    r1 = rg.level(rg.conv(rg.of_input(x), W1, b1, (1, 1), (1, 1)), f1.mean, f1.var)
    r1r = rg.relu(r1, f1.mean, f1.var)
    y2 = F.conv2d(F.relu(y1), W2, b2, padding=1)
    f2 = measure_field(y2)
    r2 = rg.level(rg.conv(r1r, W2, b2, (1, 1), (1, 1)), f2.mean, f2.var)
    s = y2 + F.conv2d(F.relu(y2), W3, padding=1)  # a residual sum: a stream and its branch
    fs = measure_field(s)
    rb = rg.conv(rg.relu(r2, f2.mean, f2.var), W3, None, (1, 1), (1, 1))
    rs = rg.level(rg.add(r2, rg.level(rb, *_moments(s - y2))), fs.mean, fs.var)
    return (y1, r1), (y2, f2, r2), (s, fs, rs)


def _moments(t):
    f = measure_field(t)
    return f.mean, f.var


def _measured_energy(t, r):
    return ((t - r.bg[None]) ** 2).mean(1)


def _corr(a, b):
    return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])


def test_energy_moves_with_the_samples():
    """The energy moved through a conv, a ReLU, a conv, a max pool and an affine map follows the measured
    per-sample energy (correlation over samples and positions above 0.85); the masks' two values (a
    stroke component of one scale) follow it far less (below 0.6)."""
    (y1, r1), (y2, f2, r2), _ = _inked_sample()
    for t, r in ((y1, r1), (y2, r2)):
        assert _corr(r.energy, _measured_energy(t, r)) > 0.85
        assert _corr(r.masks.double(), _measured_energy(t, r)) < 0.6
    p = rg.affine(rg.max_pool(r2, (2, 2), (2, 2), (0, 0)), 2 * torch.ones(16, 1, 1, dtype=torch.float64), 0.5)
    yp = 2 * F.max_pool2d(y2, 2) + 0.5
    assert _corr(p.energy, _measured_energy(yp, p)) > 0.85


def test_relu_of_scale_mixture_against_monte_carlo():
    """A ReLU of the mixture over the samples' scales: P(x > 0) pooled within 0.01 of Monte Carlo and the
    output's variance within 5%, where the mixture of one stroke scale (the masks only) is 8% off
    in the variance; back, E[1[x > 0] g²] with g independent unit noise within 0.01."""
    _, (y2, f2, r2), _ = _inked_sample()
    mc_pos = float((y2 > 0).double().mean())
    mc_var = float(F.relu(y2).var(0, unbiased=False).mean())
    step, out = _relu_of(Field(f2.mean, f2.var, f2.corr, regime=r2))
    assert abs(float(step.pos.mean()) - mc_pos) < 0.01
    assert abs(float(out.var.mean()) / mc_var - 1) < 0.05
    g = Field(torch.zeros(16, H, H, dtype=torch.float64), torch.ones(16, H, H, dtype=torch.float64),
              measure_field(torch.randn(64, 16, H, H, dtype=torch.float64)).corr)  # fmt: skip
    assert abs(float(step.backward(g).var.mean()) - mc_pos) < 0.01
    _, one = _relu_of(Field(f2.mean, f2.var, f2.corr, regime=rg.Regime(r2.masks, r2.bg)))
    assert abs(float(one.var.mean()) / mc_var - 1) > 0.08


def test_scale_mixture_law_of_a_residual_sum():
    """The law of the residual sum from the scale mixture keeps the mean and the variance (within 5%)
    per position; P(s > 0) and the tail P(s > bg + sd) pooled within 0.01 of Monte Carlo, where the law
    of one stroke scale is more than 0.02 off in both."""
    _, _, (s, fs, rs) = _inked_sample()
    thr = rs.bg + fs.var.sqrt()
    mc = float((s > 0).double().mean()), float((s > thr[None]).double().mean())

    def pooled(r):
        law = rg.mixture_law(fs.mean, fs.var, r)
        above = [float((law.w * (law.x > t)).sum(-1).mean()) for t in (0, thr[..., None])]
        return law, above

    law, got = pooled(rs)
    m = (law.w * law.x).sum(-1)
    v = (law.w * (law.x - m[..., None]) ** 2).sum(-1)
    assert torch.allclose(m, fs.mean, atol=1e-6) and float((v / fs.var - 1).abs().max()) < 0.05
    assert all(abs(a - b) < 0.01 for a, b in zip(got, mc))
    _, one = pooled(rg.Regime(rs.masks, rs.bg))
    assert all(abs(a - b) > 0.02 for a, b in zip(one, mc))
