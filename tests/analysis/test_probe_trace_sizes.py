"""graph.trace on a forward with Python control flow on sizes: traced at the input's size, then walked.

torch.fx alone cannot trace ``SizeFlow`` (an ``if`` on the map's side, ``len(x)``, a ``range`` over its
channels); :func:`graph.trace` traces it again on an example of the input's size, and both walks (the
ideal's and the correlated one) predict it like any traced model. Tolerances as in test_probe_fx.py: 15%
for the ideal's Var (independent elements), 10% forward and 15% backward for the correlated prediction
(issue 25's bars), against the measurement on N(0, 1) images (64 × 3 × 16 × 16, seed 0).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import measure, predict
from gatepool.analysis.probe.graph import Untraceable, trace


class SizeFlow(nn.Module):
    """Control flow on sizes: pooled where the map is wider than 8, its channels taken one by one in a
    loop and put back, flattened by ``len(x)``; a dropout (the trace's example run draws no number)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.mix, self.drop = nn.Conv2d(16, 16, 1), nn.Dropout(0.1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        if x.shape[-1] > 8:
            x = F.avg_pool2d(x, 2)
        x = torch.cat([x[:, i : i + 1] for i in range(x.shape[1])], dim=1)
        return self.fc(self.drop(self.mix(x)).view(len(x), -1))


def _model_and_input():
    torch.manual_seed(0)
    return SizeFlow().train(), torch.randn(64, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def test_traced_at_the_input_size_and_the_model_untouched():
    model, x = _model_and_input()
    with pytest.raises(Untraceable, match="control flow"):
        trace(model)  # no size: torch.fx's own failure
    state, rng = {k: v.clone() for k, v in model.state_dict().items()}, torch.random.get_rng_state()
    gm, calls = trace(model, sample=tuple(x.shape[1:]))
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert [n for n, _ in calls] == ["stem", "bn", "mix", "drop", "fc"]
    assert all(m.training for m in model.modules())  # its mode kept
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # BatchNorm's buffers too
    with torch.no_grad():
        model.drop.eval()
        assert torch.allclose(gm(x[:1]), model(x[:1]))  # the graph at batch 1 (len(x) baked in) computes it
    model.eval()
    trace(model, sample=tuple(x.shape[1:]))
    assert not any(m.training for m in model.modules())


def test_control_flow_on_values_stays_untraceable():
    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(Untraceable, match="a tensor's values"):
        trace(Branchy(), sample=(8,))


def test_both_walks_predict_it():
    model, x = _model_and_input()
    ideal = predict(model, x.shape, border="average")
    report = measure(model, x, prediction=ideal, correlated=True, samples=0, backward="unit-noise")
    assert not report.warnings
    names = [n for n, _ in model.named_modules() if n] + ["(output)"]
    for n in names:
        assert report[n].ratio("var") == pytest.approx(1.0, abs=0.15), n
        p = report[n].predicted
        assert report[n].forward.var / p.var == pytest.approx(1.0, abs=0.1), n
        assert report[n].backward.e2 / p.grad_e2 == pytest.approx(1.0, abs=0.15), n
    assert report["(input)"].backward.e2 / report["(input)"].predicted.grad_e2 == pytest.approx(1.0, abs=0.15)


def test_a_batchnorm_over_one_value_a_device_and_a_buffer_by_a_size():
    class Head(nn.Module):
        """A BatchNorm over one value per channel at batch 1 before an ``if`` on its output's size
        (EfficientViT-M0's last stage at 64 × 64); a device's type asked (EfficientViT-B0's autocast); a
        buffer expanded by a traced size (ConViT's ``rel_indices.expand(B, -1, -1, -1)``)."""

        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm2d(4)
            self.register_buffer("gain", torch.ones(1, 4, 1, 1))

        def forward(self, x):
            x = x * self.gain.expand(x.shape[0], -1, -1, -1)
            with torch.autocast(device_type=x.device.type, enabled=False):
                x = self.bn(F.adaptive_avg_pool2d(x, 1))
            return x.flatten(1) if x.shape[-1] == 1 else x.mean((2, 3))

    model = Head().train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    gm, _ = trace(model, sample=(4, 8, 8))
    assert [n.target for n in gm.graph.nodes if n.op == "call_method"] == ["expand", "flatten"]
    assert model.training and model.bn.training
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
