"""gatepool.analysis.probe.measure: the lecture's Monte Carlo checks, exactness against a direct computation,
and the promise to leave the model as found.

Tolerances are sized for the samples drawn here, with fixed seeds:
- conv forward, 14×14 maps, 64 images: per-channel E[y²] carries a term (E[p]·Σw)² that depends on the
  drawn weights (sd ≈ 8% of the total over 32 output channels), so the conv has 256 output channels
  (8 independent C = 32 draws side by side; 32 → 256 keeps fan_in = 288): sd ≈ 3%, tolerance 10%.
- conv backward: fan_out = 32·9 weights per input channel, Σw² over them has sd ≈ 1.5% averaged over
  32 channels; the noise adds < 0.5%: tolerance 5%.
- pools on 64·32·14·14 N(0, 1) inputs, 100k windows: sd of the mean and of the variance ≈ 0.002-0.003,
  tolerance 0.01 (max) and 0.005 (average, sd 0.001). Backward shares and ratios are exact.
"""

from __future__ import annotations

import copy
import importlib
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gatepool.analysis.probe import max_of_normals, measure, padding_variance_map, predict
from gatepool.layers import GatedPool2d


def he_conv(c_in: int, c_out: int, seed: int) -> nn.Conv2d:
    torch.manual_seed(seed)
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    nn.init.normal_(conv.weight, 0.0, math.sqrt(2 / (c_in * 9)))
    return conv


def normal(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def border_means(m: torch.Tensor) -> tuple[float, float, float]:
    """(middle, corner, edge) means of an (H, W) map."""
    corner = m[[0, 0, -1, -1], [0, -1, 0, -1]].mean()
    edge = torch.cat([m[0, 1:-1], m[-1, 1:-1], m[1:-1, 0], m[1:-1, -1]]).mean()
    return float(m[1:-1, 1:-1].mean()), float(corner), float(edge)


def test_conv_forward_padding_map_vs_theory():
    model = nn.Sequential(nn.ReLU(), he_conv(32, 256, seed=0))  # p̂ = ReLU(N(0, 1)), then the 3×3 conv
    x = normal(64, 32, 14, 14)
    report = measure(model, x, backward=None, maps=True, samples=0)
    y = model(x).detach().double()  # the Monte Carlo, computed here
    var_map = y.var(dim=(0, 1), unbiased=False)  # (14, 14) over batch and channels
    assert torch.allclose(report["1"].maps["var"], var_map, rtol=1e-4, atol=1e-6)

    ideal = predict(model, x.shape)["1"].var  # 288 · E[w²] · ½, ≈ 1
    assert ideal == pytest.approx(1.0, rel=0.02)
    middle, corner, edge = border_means(var_map)
    theory = padding_variance_map(14, 14, 3, 1) * ideal
    t_middle, t_corner, t_edge = border_means(theory)
    print(f"conv forward MC: middle {middle:.3f} corner {corner:.3f} edge {edge:.3f}")
    assert middle == pytest.approx(t_middle, rel=0.10) and t_middle == pytest.approx(1.0, rel=0.02)
    assert corner == pytest.approx(t_corner, rel=0.10) and t_corner == pytest.approx(4 / 9, rel=0.02)
    assert edge == pytest.approx(t_edge, rel=0.10) and t_edge == pytest.approx(6 / 9, rel=0.02)
    # over the whole map: the border="average" prediction
    whole = predict(model, x.shape, border="average")["1"].var
    assert float(var_map.mean()) == pytest.approx(whole, rel=0.10)
    # the padding map's mean, but for the input mean's path (E[p̂] = 1/√(2π)), which goes through the
    # conv's actual weights summed over the real taps rather than through E[w²]: 0.2% apart here
    assert whole == pytest.approx(float(theory.mean()), rel=0.01)


def test_conv_then_relu_backward_vs_theory():
    model = nn.Sequential(nn.ReLU(), he_conv(32, 32, seed=1))
    x = normal(64, 32, 14, 14, seed=1)
    report = measure(model, x, backward="unit-noise", maps=True, samples=0)
    ideal = predict(model, x.shape)
    at_relu_out = report["0"].maps["grad_e2"][1:-1, 1:-1].mean()  # through the conv: 288 · (2/288) · 1
    at_input = report["(input)"].maps["grad_e2"][1:-1, 1:-1].mean()  # then through the ReLU: ½ of it
    print(f"conv backward MC: after conv {float(at_relu_out):.3f}, after ReLU {float(at_input):.3f}")
    assert float(at_relu_out) == pytest.approx(2.0, rel=0.05)
    assert float(at_input) == pytest.approx(1.0, rel=0.05)
    assert ideal["0"].grad_e2 == pytest.approx(float(at_relu_out), rel=0.05)
    assert ideal["(input)"].grad_e2 == pytest.approx(float(at_input), rel=0.05)
    assert report["(output)"].backward.e2 == pytest.approx(1.0, rel=0.02)  # the unit-noise seed
    # over the whole map, borders included: fewer outputs reach a border input (2 · 0.907 at 14×14)
    whole = predict(model, x.shape, border="average")["0"].grad_e2
    assert report["0"].backward.e2 == pytest.approx(whole, rel=0.05)
    # the ReLU zeroes the gradient wherever x ≤ 0: half of them
    assert report["(input)"].backward.zero_share == pytest.approx(float((x <= 0).double().mean()), abs=1e-9)

    # the same Monte Carlo with our own noise, autograd only
    xl = x.clone().requires_grad_(True)
    out = model(xl)
    out.backward(normal(*out.shape, seed=7))
    assert float(xl.grad[..., 1:-1, 1:-1].pow(2).mean()) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("make", [lambda: nn.AvgPool2d(2), lambda: GatedPool2d(2, gate="avg")],
                         ids=["torch", "gated"])
def test_avg_pool_forward_and_backward(make):
    pool = make()
    x = normal(64, 32, 14, 14, seed=2)
    report = measure(pool, x, backward="unit-noise", samples=0)
    out, inp = report["(output)"], report["(input)"]
    print(f"avg pool MC: Var {out.forward.var:.4f}")
    assert out.forward.var == pytest.approx(0.25, abs=0.005)
    assert predict(pool, x.shape)["(output)"].var == 0.25
    # every input gets g/4: E[g_in²] = E[g²]/16 exactly, no zeros
    assert inp.backward.e2 == pytest.approx(out.backward.e2 / 16, rel=1e-5)
    assert inp.backward.zero_share == 0.0
    assert predict(pool, x.shape)["(input)"].grad_e2 == pytest.approx(1 / 16)


@pytest.mark.parametrize("make", [lambda: nn.MaxPool2d(2), lambda: GatedPool2d(2, gate="max")],
                         ids=["torch", "gated"])
def test_max_pool_forward_and_backward(make):
    pool = make()
    x = normal(64, 32, 14, 14, seed=3)
    report = measure(pool, x, backward="unit-noise", samples=0)
    out, inp = report["(output)"], report["(input)"]
    print(f"max pool MC: mean {out.forward.mean:.4f} Var {out.forward.var:.4f}; "
          f"backward ratio {inp.backward.e2 / out.backward.e2:.4f}, zeros {inp.backward.zero_share:.4f}")
    assert out.forward.mean == pytest.approx(1.03, abs=0.01)
    assert out.forward.var == pytest.approx(0.49, abs=0.01)
    mean, var = max_of_normals(4)
    assert out.forward.mean == pytest.approx(mean, abs=0.01)
    assert out.forward.var == pytest.approx(var, abs=0.01)
    # only the winner gets g: E[g_in²] = E[g²]/4 exactly, and exactly 75% zeros
    assert inp.backward.e2 == pytest.approx(out.backward.e2 / 4, rel=1e-5)
    assert inp.backward.zero_share == pytest.approx(0.75, abs=1e-12)
    ideal = predict(pool, x.shape)
    assert ideal["(input)"].grad_e2 == pytest.approx(0.25) and ideal["(input)"].grad_zero_share == 0.75
    assert inp.backward.e2 == pytest.approx(ideal["(input)"].grad_e2, abs=0.01)


def _cnn() -> nn.Sequential:
    torch.manual_seed(4)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 5),
    )


def test_measure_matches_direct_computation():
    model = _cnn().eval()
    x, y = normal(6, 3, 8, 8, seed=5), torch.tensor([0, 1, 2, 3, 4, 0])
    report = measure(model, x, y, backward="loss", per_channel=True, maps=True, module_inputs=True)
    assert report.complete and report.backward == "loss" and report.loss_reduction == "sum"

    # the same computation by hand, keeping every intermediate and its gradient
    xl = x.clone().requires_grad_(True)
    acts, h = [], xl
    for m in model:
        h = m(h)
        h.retain_grad()
        acts.append(h)
    loss = F.cross_entropy(h, y, reduction="sum")
    loss.backward()
    assert report.loss == pytest.approx(float(loss.detach()), rel=1e-6)
    for i, a in enumerate(acts):
        r, a, g = report[str(i)], a.detach().double(), a.grad.double()
        assert r.shape == tuple(a.shape)
        assert r.forward.mean == pytest.approx(float(a.mean()), rel=1e-5, abs=1e-7)
        assert r.forward.var == pytest.approx(float(a.var(unbiased=False)), rel=1e-5, abs=1e-7)
        assert r.forward.e2 == pytest.approx(float(a.pow(2).mean()), rel=1e-5, abs=1e-7)
        assert r.forward.zero_share == pytest.approx(float((a == 0).double().mean()), abs=1e-12)
        assert r.forward.var_batch == pytest.approx(float(a.var(dim=0).mean()), rel=1e-5, abs=1e-7)
        assert r.backward.e2 == pytest.approx(float(g.pow(2).mean()), rel=1e-5, abs=1e-12)
        assert r.backward.zero_share == pytest.approx(float((g == 0).double().mean()), abs=1e-12)
        if a.dim() == 4:
            assert torch.allclose(r.per_channel["e2"], a.pow(2).mean((0, 2, 3)), rtol=1e-5)
            assert torch.allclose(r.per_channel["grad_e2"], g.pow(2).mean((0, 2, 3)), rtol=1e-5, atol=1e-12)
            assert torch.allclose(r.maps["var"], a.var(dim=(0, 1), unbiased=False), rtol=1e-4, atol=1e-7)
            assert torch.allclose(r.maps["grad_e2"], g.pow(2).mean((0, 1)), rtol=1e-5, atol=1e-12)
    # the pool's input (module_inputs): 75% of its gradient exact zeros
    assert report["4:in"].backward.zero_share == pytest.approx(float((acts[3].grad == 0).double().mean()))
    assert report["(input)"].backward.e2 == pytest.approx(float(xl.grad.double().pow(2).mean()), rel=1e-5)
    for p in report.params:
        w = dict(model.named_parameters())[p.name]
        assert p.grad_norm == pytest.approx(float(w.grad.double().norm()), rel=1e-5)
        assert p.norm == pytest.approx(float(w.detach().double().norm()), rel=1e-6)
        assert p.grad_rms == pytest.approx(float(w.grad.double().pow(2).mean().sqrt()), rel=1e-5)
        assert p.ratio == pytest.approx(p.grad_norm / p.norm) if p.norm else math.isnan(p.ratio)


def _no_hooks(model: nn.Module) -> bool:
    return all(
        not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)
        for m in model.modules()
    )


@pytest.mark.parametrize("train", [True, False])
def test_measure_leaves_the_model_unchanged(train):
    model = _cnn().train(train)
    x, y = normal(6, 3, 8, 8, seed=6), torch.tensor([0, 1, 2, 3, 4, 0])
    model[6].weight.grad = torch.full_like(model[6].weight, 0.5)  # a gradient the user had
    reference = copy.deepcopy(model)
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    before_flags = [m.training for m in model.modules()]
    torch.manual_seed(123)
    rng = torch.get_rng_state()

    report = measure(model, x, y, backward="loss")
    assert report.complete

    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG untouched (Dropout drew from a fork)
    assert [m.training for m in model.modules()] == before_flags
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in before_state.items())  # BatchNorm stats restored
    assert torch.equal(model[6].weight.grad, torch.full_like(model[6].weight, 0.5))
    assert all(p.grad is None for n, p in model.named_parameters() if n != "6.weight")
    torch.set_rng_state(rng)
    out_after = model(x)
    torch.set_rng_state(rng)
    assert torch.equal(out_after, reference(x))
    assert _no_hooks(model)


class Mixer(nn.Module):
    """A module the probe has never seen: functional ops, its own parameter, a child."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.full((8,), 2.0))

    def forward(self, x):
        return torch.tanh(self.proj(x)) * self.scale + x.roll(1, dims=-1)


def test_custom_module():
    model = Mixer()
    x = normal(32, 8, seed=8)
    report = measure(model, x)  # unit noise: no target
    assert report.complete and report.backward == "unit-noise"
    direct = model(x).detach().double()
    assert report["(output)"].forward.var == pytest.approx(float(direct.var(unbiased=False)), rel=1e-5)
    proj = model.proj(x).detach().double()
    assert report["proj"].forward.e2 == pytest.approx(float(proj.pow(2).mean()), rel=1e-5)
    assert report["proj"].backward is not None and report["(input)"].backward is not None
    assert {p.name for p in report.params} == {"scale", "proj.weight", "proj.bias"}
    assert report["(output)"].ideal.var is None and "no rule for Mixer" in report["(output)"].ideal.note
    # traced by torch.fx: the Linear inside is predicted, the output (roll has no rule) is not
    assert report["proj"].ideal.var is not None and "roll" in report["(output)"].ideal.note
    assert _no_hooks(model)
    report.table()


class Split(nn.Module):
    def forward(self, x):
        return x.relu(), -x


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.split = Split()

    def forward(self, x):
        a, b = self.split(self.lin(x))
        return a + b.abs(), b


def test_tuple_outputs():
    torch.manual_seed(9)
    model = TwoHeads()
    x = normal(40, 6, seed=9)
    report = measure(model, x)
    h = model.lin(x).detach()
    assert report["split[0]"].forward.zero_share == pytest.approx(float((h <= 0).double().mean()))
    assert report["split[1]"].forward.mean == pytest.approx(float(-h.mean()), rel=1e-5)
    assert "(output)[0]" in report and "(output)[1]" in report
    assert report["(output)[0]"].backward.e2 == pytest.approx(1.0, rel=0.3)  # the seed, 240 draws
    assert report.complete and _no_hooks(model)


def test_model_that_fails_keeps_what_was_measured():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(5, 2))  # 8 → 5: fails at "2"
    report = measure(model, normal(16, 4))
    assert not report.complete and "forward failed" in report.error and "RuntimeError" in report.error
    assert report["0"].forward is not None and report["1"].forward.zero_share > 0
    assert "2" not in report
    assert "INCOMPLETE" in report.table()
    assert '"complete": false' in report.to_json()
    assert _no_hooks(model)


def test_unknown_module_name():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    with pytest.raises(ValueError, match=r"'nope'.*valid names include: 0, 1"):
        measure(model, normal(16, 4), modules=["0", "nope"])
    report = measure(model, normal(16, 4), modules=["1"])
    assert list(report.rows) == ["(input)", "1", "(output)"]


def test_bad_arguments():
    model = nn.Sequential(nn.Linear(4, 3))
    x = normal(5, 4)
    with pytest.raises(ValueError, match="target"):
        measure(model, x, backward="loss")
    with pytest.raises(ValueError, match="backward"):
        measure(model, x, backward="noise")
    with pytest.raises(ValueError, match="target must have shape"):
        measure(model, x, torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="inputs"):
        measure(model, [1, 2])


def test_batch_of_one():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    report = measure(model, normal(1, 3), torch.zeros(1, dtype=torch.long), backward="unit-noise")
    assert report.complete
    assert math.isnan(report["0"].forward.var_batch) and math.isfinite(report["0"].forward.var)
    assert any("batch of 1" in w for w in report.warnings)
    out = report["(output)"]  # a single value: no variance at all
    assert math.isnan(out.forward.var) and any("variance undefined" in n for n in out.notes)
    d = report.to_dict()
    assert d["modules"][-1]["forward"]["var"] is None  # NaN is written as null
    report.to_json()
    report.table()


class Log(nn.Module):
    def forward(self, x):
        return x.log()


def test_nan_activations_are_flagged():
    model = nn.Sequential(nn.Linear(4, 16), Log(), nn.Linear(16, 2))
    report = measure(model, normal(32, 4, seed=10))
    row = report["1"]
    assert row.forward.nonfinite > 0 and math.isfinite(row.forward.mean)
    assert row.forward.numel + row.forward.nonfinite == 32 * 16
    assert any(w.startswith("1:") and "NaN" in w for w in report.warnings)
    assert "warning" in report.table()


class Roll(nn.Module):
    """A block the correlated walk has no rule for."""

    def forward(self, x):
        return x.roll(1, dims=-1)


def test_measure_gives_the_correlated_prediction():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    x = normal(64, 3, 12, 12, seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = measure(model, x, correlated=True)
    assert report.complete and not report.warnings
    stem = report["0"]  # linear: the prediction is the measurement (up to the border's correlation)
    assert stem.predicted.var == pytest.approx(stem.forward.var, rel=1e-3)
    for name in ("3", "4", "7", "(input)"):  # a max pool, a conv after it, the logits, the input's E[g²]
        r = report[name]
        assert r.predicted.var == pytest.approx(r.forward.var, rel=0.15), name
        assert r.predicted.grad_e2 == pytest.approx(r.backward.e2, rel=0.2), name
    assert report["0"].measured_field.shape == (16, 12, 12) and report["7"].measured_field.shape == (10, 1, 1)
    assert "predicted" in report.table().splitlines()[0] and "predicted" in report.to_dict()["modules"][1]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # BatchNorm's stats too
    assert _no_hooks(model)
    plain = measure(model, x)  # the default: no correlated prediction
    assert plain["0"].predicted is None and plain["0"].measured_field is None
    lean = measure(model, x, correlated=True, measured_fields=False)  # the predicted column alone
    assert lean["0"].measured_field is None and lean["7"].predicted.var == report["7"].predicted.var


class Triple(nn.Module):
    """Writes its input in place."""

    def forward(self, x):
        return x.mul_(3)


def test_measure_predicts_after_the_run_from_the_input_before_it(monkeypatch):
    measure_module = importlib.import_module("gatepool.analysis.probe.measure")  # not the package's function
    model = nn.Sequential(Triple(), nn.Conv2d(2, 4, 3, padding=1))
    x = normal(8, 2, 6, 6)
    ran = []
    model[1].register_forward_hook(lambda *_: ran.append("run"))
    predict = measure_module.predict_correlated

    def predict_after(*args, **kwargs):
        ran.append("predict")
        return predict(*args, **kwargs)

    monkeypatch.setattr(measure_module, "predict_correlated", predict_after)
    report = measure(model, x, backward=None, prediction=False, correlated=True)
    assert ran[:2] == ["run", "predict"]  # the run's activations let go before the walk holds its fields
    assert not torch.equal(x, normal(8, 2, 6, 6))  # the model wrote its input ...
    assert report["(input)"].predicted.var == pytest.approx(1.0, rel=0.1)  # ... read before it did (not 9)


def test_measure_correlated_names_what_has_no_rule():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), Roll(), nn.ReLU())
    report = measure(model, normal(8, 1, 8, 8), correlated=True)
    assert report["0"].predicted.var is not None
    assert report["1"].predicted.var is None and "no correlated rule" in report["1"].predicted.note
    assert report["2"].predicted.var is None and "roll" in report["2"].predicted.note  # named, not guessed
    loss = measure(model[:1], normal(8, 1, 8, 8), torch.zeros(8, dtype=torch.long), correlated=True)
    assert any("unit-noise seed only" in w for w in loss.warnings)  # (B, 4, 8, 8) logits: no loss; warned


def test_measure_correlated_bad_arguments():
    model = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(TypeError, match="correlated"):
        measure(model, normal(5, 4), correlated="yes")
    with pytest.raises(TypeError, match="measured_fields"):
        measure(model, normal(5, 4), correlated=True, measured_fields=None)
    with pytest.raises(ValueError, match="correlated=True needs one input"):
        measure(model, normal(5, 2, 4), correlated=True)
