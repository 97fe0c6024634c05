"""Experiments 1–7 (conv, padding, pools, the whole network), quick, on small inputs.

Besides the verdicts against the lecture's values, each test checks the measurement against the rules
computed here (He init: σ² = 2·E[p²] ... ), independently of the experiment's own code.
"""

import math

import pytest
import torch

from gatepool.lab.harness import run_experiment


def run(name, tmp_path, **overrides):
    rec = run_experiment(
        name,
        profile="quick",
        overrides={k: str(v) for k, v in overrides.items()},
        out=tmp_path,
        progress=False,
    )
    assert rec["status"] == "complete", rec["error"]
    return {c["id"]: c for c in rec["claims"]}, rec


def test_conv_forward(tmp_path):
    c, _ = run("conv-forward", tmp_path)
    assert all(x["verdict"] == "ok" for x in c.values()), c
    assert c["relu-mean"]["measured"] == pytest.approx(1 / math.sqrt(2 * math.pi), abs=0.01)
    assert c["relu-variance"]["measured"] == pytest.approx(0.5 - 1 / (2 * math.pi), abs=0.01)


def test_conv_forward_mnist_input_is_not_gaussian(tmp_path):
    """On block 1's real input the ReLU keeps more than ½ (the lecture's 0.64): the rule's verdict is off."""
    c, _ = run("conv-forward", tmp_path, input="mnist", batch=64)
    assert c["relu-e2"]["basis"] == "theory" and c["relu-e2"]["measured"] > 0.55
    assert c["relu-e2"]["verdict"] == "off"
    assert c["after-norm"]["verdict"] == "ok"


def test_padding_map_and_its_correction(tmp_path):
    c, rec = run("padding-map", tmp_path)
    assert all(x["verdict"] == "ok" for k, x in c.items() if k != "map-max"), c
    # the colour scale's 2.1 is not reached where each position's σ² averages the batch × 32 channels
    assert c["map-max"]["verdict"] == "off" and c["map-max"]["miss"] == "setup differs"
    assert c["corner"]["measured"] / c["middle"]["measured"] == pytest.approx(4 / 9, abs=0.06)
    assert (tmp_path / "padding-map" / "padding-map.png").is_file()
    assert c["corrected-corner"]["source"] == "ours"
    c5, _ = run("padding-map", tmp_path, kernel=5, batch=64)  # theory: corner 9/25 of the middle
    assert c5["corner"]["basis"] == "theory"
    assert c5["corner"]["expected"] / c5["middle"]["expected"] == pytest.approx(9 / 25, rel=1e-3)
    assert c5["corner"]["verdict"] == "ok" and c5["edge"]["verdict"] == "ok"


def test_conv_backward(tmp_path):
    c, _ = run("conv-backward", tmp_path)
    assert c["after-conv"]["verdict"] == "ok" and c["after-relu"]["verdict"] == "ok"
    assert c["after-relu"]["measured"] / c["after-conv"]["measured"] == pytest.approx(0.5, abs=0.03)


def test_pool_forward_and_backward(tmp_path):
    c, _ = run("pool-forward", tmp_path)
    assert all(x["verdict"] == "ok" for x in c.values()), c
    x = torch.randn(200000, 4, generator=torch.Generator().manual_seed(1))  # Monte Carlo in the test
    assert c["max-mean"]["measured"] == pytest.approx(x.max(1).values.mean().item(), abs=0.02)
    assert c["max-variance"]["measured"] == pytest.approx(x.max(1).values.var().item(), abs=0.02)
    c, _ = run("pool-backward", tmp_path)
    assert all(x["verdict"] == "ok" for x in c.values()), c
    c3, _ = run("pool-backward", tmp_path, window=3, size=12, batch=16)  # 9 inputs: ⅑ of E[g²], 8/9 zeros
    assert c3["max-grad"]["measured"] == pytest.approx(1 / 9, rel=0.05)
    assert c3["max-zeros"]["measured"] == pytest.approx(8 / 9, abs=0.002)
    c3, _ = run(
        "pool-backward", tmp_path, window=3, batch=16
    )  # 14 = 4·3 + 2: the last 2 rows/cols get nothing
    assert c3["max-grad"]["measured"] == pytest.approx((12 / 14) ** 2 / 9, rel=0.05)
    assert c3["avg-zeros"]["measured"] == pytest.approx(1 - (12 / 14) ** 2, abs=0.002)
    assert all(x["verdict"] == "ok" for x in c3.values()), c3


def test_network_forward_and_backward(tmp_path):
    c, _ = run("network-forward", tmp_path, seeds="0,1,2", batch=64)
    # the rules use each init's weights; their mean over three inits meets the lecture's arithmetic
    assert all(c[f"ideal-{s}"]["verdict"] == "ok" for s in ("pool1", "block1", "pool2", "block2", "block3"))
    assert c["after-norm"]["verdict"] == "ok" and c["relu-keeps"]["verdict"] == "ok"
    # the stream grows block by block: each residual block adds its branch's variance
    assert c["measured-block1"]["measured"] > c["measured-pool1"]["measured"]
    assert c["measured-block3"]["measured"] > c["measured-block2"]["measured"]
    c, _ = run("network-backward", tmp_path, seeds="0,1,2", batch=64)
    assert c["pool-zeros"]["measured"] == pytest.approx(0.75, abs=0.01)
    assert c["pool2-to-block1"]["measured"] == pytest.approx(0.25, abs=0.01)
    assert all(c[k]["verdict"] == "ok" for k in c if k.startswith("ideal"))


def test_border_rescale_scales_each_output_by_its_missing_taps():
    from gatepool.lab.experiments.padding_map import BorderRescale

    y = torch.ones(2, 3, 5, 5)
    out = BorderRescale(3, 1)(y)  # corner: 4 of 9 taps, edge: 6, inside: 9
    assert out[0, 0, 0, 0] == pytest.approx(1.5) and out[0, 0, 0, 2] == pytest.approx((9 / 6) ** 0.5)
    assert out[0, 0, 2, 2] == pytest.approx(1.0) and out.shape == y.shape
    # the variance of zero-padded convs' outputs (over many filters), rescaled, is flat over the map
    x = torch.randn(256, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    w = torch.randn(256, 1, 3, 3, generator=torch.Generator().manual_seed(1))
    y = torch.nn.functional.conv2d(x, w, padding=1)  # (256, 256, 6, 6)
    plain, fixed = y.var((0, 1)), BorderRescale(3, 1)(y).var((0, 1))  # (6, 6)
    assert plain[0, 0] / plain[2, 2] == pytest.approx(4 / 9, abs=0.06)
    assert fixed[0, 0] / fixed[2, 2] == pytest.approx(1.0, abs=0.12)
