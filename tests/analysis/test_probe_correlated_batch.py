"""BatchNorm in training with few values per channel (batch × H × W), against Monte Carlo.

Each Monte Carlo draw is a whole batch of B samples: R batches side by side as R·C channels of one
BatchNorm, so each batch is normalised by its own statistics, as in a model; the rule gets the batch
size and the exact Field of the Gaussian input (``gaussian_field``: known correlation).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from test_probe_correlated import DT, _ramp, gaussian_field

from gatepool.analysis.probe import correlated as cr
from gatepool.analysis.probe.correlated_predict import predict_correlated

R = 2000  # batches


def _batchnorm_grad(x, g, gamma, batch):
    """∂/∂x of Σ g · BN_train(x), every ``batch`` consecutive samples of x one batch: (R·B, C, H, W)."""
    n, C, H, W = x.shape
    xr = x.clone().requires_grad_(True)
    xb = xr.reshape(n // batch, batch, C, H, W).transpose(0, 1).reshape(batch, -1, H, W)
    y = F.batch_norm(xb, None, None, gamma.repeat(n // batch), None, training=True)
    (y.reshape(batch, n // batch, C, H, W).transpose(0, 1).reshape(n, C, H, W) * g).sum().backward()
    return xr.grad


def _ratio(batch, H, ell_x, ell_g, constant):
    """The rule's E[g_x²] over the Monte Carlo's, for the batch size given and for none (the old rule)."""
    mean = torch.stack([_ramp(1, H, H, -1.0, 1.0)[0], torch.full((H, H), 0.4, dtype=DT)])
    x, f = gaussian_field(H=H, W=H, mean=mean, ell=ell_x, batch=R * batch)
    g, gf = gaussian_field(H=H, W=H, ell=ell_g, seed=6, batch=R * batch)
    # a part of the gradient constant over the positions, as a global pool's gradient is
    g = g + constant * torch.randn(R * batch, 2, 1, 1, generator=torch.Generator().manual_seed(9), dtype=DT)
    gf = cr.Field(gf.mean, gf.var + constant**2, (gf.corr + constant**2) / (1 + constant**2))
    gamma = torch.tensor([1.5, 0.7], dtype=DT)
    mc = float(_batchnorm_grad(x, g, gamma, batch).pow(2).mean())
    out = []
    for b in (batch, None):
        rule = cr.BatchNorm(gamma, None, 1e-5, batch=b)
        rule.forward(f)
        out.append(float(rule.backward(gf).var.mean()) / mc)
    return out


def test_batchnorm_backward_takes_the_batch_mean_of_a_constant_gradient():
    # 8 images of 4×4: a gradient constant over the positions loses E[g²]/B to the batch mean
    with_b, without = _ratio(batch=8, H=4, ell_x=0.5, ell_g=1.2, constant=1.0)
    assert abs(with_b - 1) < 0.03, with_b
    assert without > 1.05, without  # the projection dropped: the prediction high


def test_batchnorm_backward_takes_the_fluctuating_divisor():
    # 4 images of 4×4 maps smooth over the map: σ_b² from few effective values, E[1/σ_b²] > 1/E[σ_b²]
    with_b, without = _ratio(batch=4, H=4, ell_x=2.0, ell_g=0.5, constant=0.0)
    assert abs(with_b - 1) < 0.04, with_b
    assert without < 0.85, without


def test_batchnorm_eval_and_unknown_batch_ignore_the_batch():
    x, f = gaussian_field(H=4, W=4, batch=1)
    g = cr.unit_noise(2)
    g = cr.Field(torch.zeros((2, 4, 4), dtype=DT), torch.ones((2, 4, 4), dtype=DT), f.corr)
    w, rm, rv = torch.tensor([1.5, 0.7]), torch.zeros(2), torch.full((2,), 2.0)
    for batch in (None, 4):
        rule = cr.BatchNorm(w, None, 0.0, rm, rv, batch=batch)
        rule.forward(f)
        assert torch.allclose(rule.backward(g).var, (w.double() ** 2 / 2.0)[:, None, None].expand(2, 4, 4))
    try:
        cr.BatchNorm(w, None, 1e-5, batch=0)
    except ValueError as e:
        assert "batch" in str(e)
    else:
        raise AssertionError("batch=0 accepted")


class _Block(nn.Module):
    """A residual block with BatchNorm on a 4×4 map, then the global pool and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(32)
        self.relu0 = nn.ReLU()
        self.conv = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        s = self.relu0(self.bn0(self.stem(x)))
        y = self.relu(s + self.bn(self.conv(s)))
        return self.fc(self.pool(y).flatten(1))


def test_walk_gives_the_batch_to_batchnorm_and_drops_yy_at_an_add():
    # 8 images, 4×4 maps: the backward through bn (under an add and a ReLU) within 6% of the measurement
    # (1.00–1.03); without the batch the stem and conv are 1.09 and 1.10 (bn's projection and divisor
    # left out), with the ReLU's yy of the sum (s + bn, not bn's output) taken through the add 0.93
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    names = ["stem", "conv", "bn"]
    grads = {}

    def hook(m, a, y, n):
        y.register_hook(lambda g: grads.__setitem__(n, g))

    for n in names:
        model.get_submodule(n).register_forward_hook(lambda m, a, y, n=n: hook(m, a, y, n))
    measured = {n: 0.0 for n in names}
    draws = 200  # the measurement averaged over the unit-noise seed at the logits
    gen = torch.Generator().manual_seed(2)
    for _ in range(draws):
        grads.clear()
        out = model(x)
        out.backward(torch.randn(out.shape, generator=gen))
        for n in names:
            measured[n] += float(grads[n].pow(2).mean()) / draws
    pred = predict_correlated(model, cr.measure_input(x), batch=len(x))
    for n in names:
        assert abs(pred[n].grad_e2 / measured[n] - 1) < 0.06, (n, pred[n].grad_e2 / measured[n])
