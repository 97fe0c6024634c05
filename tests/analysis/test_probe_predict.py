"""gatepool.analysis.probe.predict: the rules walked through models, against Monte Carlo where the rules' own
assumption (independent elements, zero-mean random weights) holds, and "no prediction" elsewhere."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from gatepool import create_model
from gatepool.analysis.probe import measure, predict
from gatepool.analysis.probe.theory import max_of_normals, relu_moments
from gatepool.layers import GatedPool1d, GatedPool3d, create_pool


def test_residual_cnn_every_module_predicted():
    torch.manual_seed(0)
    model = create_model("residual_cnn", pool="max")
    ideal = predict(model, (8, 1, 28, 28))
    names = {n for n, _ in model.named_modules() if n} | {"(input)", "(output)"}
    assert set(ideal.rows) == names
    for r in ideal:
        assert r.var is not None and r.grad_e2 is not None, r
    # the walk, checked against the rules evaluated here on the model's own weights
    stem_var = 25 * float(model.stem.weight.detach().double().pow(2).mean())  # fan_in · E[w²] · E[x²]
    assert ideal["stem"].var == pytest.approx(stem_var)
    m4, v4 = max_of_normals(4)
    assert ideal["pool1"].mean == pytest.approx(m4 * math.sqrt(stem_var))
    assert ideal["pool1"].var == pytest.approx(v4 * stem_var)
    assert ideal["block1.relu1"].var == pytest.approx(0.5 - 1 / (2 * math.pi), rel=1e-4)  # eps of the norm
    assert ideal["block1"].var == pytest.approx(ideal["pool1"].var + ideal["block1.conv2"].var)
    assert ideal["head.norm"].var == pytest.approx(1.0, rel=1e-4) and ideal["head.norm"].mean == 0.0
    # backward: unit noise at the output; max pools leave 75% exact zeros on their inputs
    assert ideal["(output)"].grad_e2 == 1.0
    assert ideal["stem"].grad_zero_share == pytest.approx(0.75)
    assert ideal["block1"].grad_zero_share == pytest.approx(0.75)
    assert ideal["stem"].grad_e2 == pytest.approx(ideal["pool1"].grad_e2 / 4)
    assert ideal["(input)"].grad_zero_share == 0.0  # 0.75 ** (32·25) ≈ 1e-100 rounds to nothing
    # through a block: E[g²] of the stream plus E[g²] of the branch
    stream, branch = ideal["block2"].grad_e2, ideal["block2.gn1"].grad_e2 / (ideal["pool2"].var + 1e-5)
    assert ideal["pool2"].grad_e2 == pytest.approx(stream + branch)  # GroupNorm backward: ÷ Var(x)
    assert "—" not in ideal.table().split("\n", 2)[2]


def test_soft_gate_is_measured_only_and_a_norm_recovers():
    torch.manual_seed(1)
    pool = create_pool("soft", 2, channels=8)  # a gate without a closed form
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), pool, nn.GroupNorm(2, 8), nn.ReLU(),
                          nn.Conv2d(8, 8, 1))
    ideal = predict(model, (2, 4, 8, 8))
    assert ideal["1"].var is None and "measured only" in ideal["1"].note
    assert ideal["2"].var == pytest.approx(1.0)  # a norm's output does not depend on its input
    assert ideal["3"].var == pytest.approx(relu_moments()[1]) and ideal["4"].var is not None
    # backward: known down to the norm, which needs its input's variance: none above it
    assert ideal["3"].grad_e2 is not None and ideal["2"].grad_e2 is not None
    assert ideal["1"].grad_e2 is None and ideal["0"].grad_e2 is None and ideal["(input)"].grad_e2 is None


def test_unknown_module_gets_no_prediction():
    model = nn.Sequential(nn.Linear(4, 8), nn.Softplus(), nn.Linear(8, 2))
    ideal = predict(model, (3, 4))
    assert ideal["0"].var is not None
    assert ideal["1"].var is None and "no rule for Softplus" in ideal["1"].note
    assert ideal["2"].var is None and ideal["(output)"].var is None  # downstream of it: nothing
    assert ideal["2"].grad_e2 == 1.0 and ideal["1"].grad_e2 is not None  # the seed and one step back
    assert ideal["0"].grad_e2 is None


def _he_mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for _ in range(3):
        lin = nn.Linear(512, 512)
        nn.init.normal_(lin.weight, 0.0, math.sqrt(2 / 512))
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def test_mlp_prediction_vs_monte_carlo():
    # 512 units, 256 samples: the weight-dependent (E[p]·Σw)² term has sd ≈ 2% over 512 units,
    # sampling noise < 1%; tolerance 8%
    model = _he_mlp(2)
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(2))
    report = measure(model, x, backward="unit-noise", samples=0)
    for r in report:
        assert r.ratio("var") == pytest.approx(1.0, abs=0.08), r.name
        assert r.ratio("grad_e2") == pytest.approx(1.0, abs=0.08), r.name


def test_preact_block_prediction_vs_monte_carlo():
    # 64 channels, 32 images of 14×14; border="average" for a measurement over the whole map.
    # Over 4 weight seeds the output Var ratio stayed within 0.97-1.07 and the input E[g²] ratio
    # within 1.04-1.07 (the GN backward rule drops the 1 − 2/m projection and the correlations);
    # tolerance 10% at this fixed seed
    from gatepool.models.residual_cnn import PreActBlock

    torch.manual_seed(0)
    block = PreActBlock(64, groups=8)
    x = torch.randn(32, 64, 14, 14, generator=torch.Generator().manual_seed(0))
    ideal = predict(block, x.shape, border="average")
    report = measure(block, x, backward="unit-noise", prediction=ideal, samples=0)
    assert report["(output)"].ratio("var") == pytest.approx(1.0, abs=0.10)
    assert report["(input)"].ratio("grad_e2") == pytest.approx(1.0, abs=0.10)
    assert report["relu1"].ratio("var") == pytest.approx(1.0, abs=0.10)


def test_loss_seed_and_batchnorm_eval():
    torch.manual_seed(3)
    bn = nn.BatchNorm1d(6).eval()
    bn.running_mean.fill_(0.5)
    bn.running_var.fill_(4.0)
    model = nn.Sequential(nn.Linear(3, 6), bn, nn.Linear(6, 10))
    ideal = predict(model, (16, 3), backward="loss", loss_reduction="mean")
    assert ideal["(output)"].grad_e2 == pytest.approx((1 - 1 / 10) / 10 / 16**2)
    # eval BatchNorm is the affine (x − 0.5)/2: mean shifts by −0.25, Var divides by 4 (eps aside)
    assert ideal["1"].mean == pytest.approx((ideal["0"].mean - 0.5) / 2, rel=1e-4)
    assert ideal["1"].var == pytest.approx(ideal["0"].var / 4, rel=1e-4)
    assert bn.training is False


def test_prediction_leaves_model_as_found_and_survives_a_failing_model():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(5, 2)).train()
    ideal = predict(model, (3, 4))
    assert ideal.error and "RuntimeError" in ideal.error
    assert ideal["1"].var is not None  # the rules need no shape for these
    assert all(m.training for m in model.modules())
    assert all(not m._forward_hooks for m in model.modules())


def test_bad_arguments():
    model = nn.Sequential(nn.Linear(4, 2))
    with pytest.raises(ValueError, match="border"):
        predict(model, (2, 4), border="edge")
    with pytest.raises(ValueError, match="input_shape"):
        predict(model, (0, 4))
    with pytest.raises(ValueError, match="backward"):
        predict(model, (2, 4), backward="noise")
    with pytest.raises(ValueError, match="input_stats"):
        predict(model, (2, 4), input_stats=(0.0, -1.0))


@pytest.mark.parametrize("gate", ["soft", "attention"])
def test_residual_cnn_with_soft_gates(gate):
    torch.manual_seed(5)
    model = create_model("residual_cnn", pool=gate)
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    report = measure(model, x)
    assert report.complete
    for name in ("pool1", "pool2"):
        assert report[name].ideal.var is None and "measured only" in report[name].ideal.note
        assert report[name].forward.var > 0
    assert report["stem"].ideal.var is not None and report["head.norm"].ideal.var is not None
    assert report["stem"].backward.zero_share < 0.01  # a soft gate gives every input some gradient


@pytest.mark.parametrize("gate", ["max", "avg"])
@pytest.mark.parametrize("gated", [True, False], ids=["GatedPool1d", "torch"])
def test_1d_pools_have_the_rule(gate, gated):
    torch.manual_seed(6)
    pool = GatedPool1d(2, gate=gate) if gated else {"max": nn.MaxPool1d, "avg": nn.AvgPool1d}[gate](2)
    conv = nn.Conv1d(4, 8, 3, padding=1, bias=False)
    ideal = predict(nn.Sequential(conv, pool), (2, 4, 16))
    v = 12 * float(conv.weight.detach().double().pow(2).mean())  # fan_in · E[w²] · E[x²]
    if gate == "max":  # the larger of two N(0, v): mean √(v/π), Var v·(1 − 1/π)
        assert ideal["1"].mean == pytest.approx(math.sqrt(v / math.pi), rel=1e-6)
        assert ideal["1"].var == pytest.approx(v * (1 - 1 / math.pi), rel=1e-6)
        assert ideal["0"].grad_e2 == pytest.approx(0.5) and ideal["0"].grad_zero_share == pytest.approx(0.5)
    else:  # the mean of two: Var v/2; each input gets g/2
        assert ideal["1"].mean == 0.0 and ideal["1"].var == pytest.approx(v / 2)
        assert ideal["0"].grad_e2 == pytest.approx(0.25) and ideal["0"].grad_zero_share == 0.0
    assert ideal["1"].note == ""


def test_3d_gated_avg_pool_has_the_rule():
    ideal = predict(nn.Sequential(GatedPool3d(2, gate="avg")), (1, 2, 4, 4, 4), input_stats=(0.5, 2.0))
    assert ideal["0"].mean == 0.5 and ideal["0"].var == pytest.approx(2.0 / 8)
    assert ideal["(input)"].grad_e2 == pytest.approx(1 / 64)
