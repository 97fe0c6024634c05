"""Every argument check that calls :mod:`gatepool.utils.checks`: a bad value is refused with the
helper's message, naming the argument and the range (a site that falls back to a hand-written check, or
lets a bool or a float through, fails here)."""

import argparse
import re

import pytest
import torch
import torch.nn as nn

from gatepool.analysis.attention_maps import attention_cost
from gatepool.analysis.probe import measure
from gatepool.analysis.probe.theory import max_of_normals, max_of_rectified_normals, padding_variance_map
from gatepool.cli.args import float_in, int_at_least
from gatepool.data import mnist_batch
from gatepool.lab.common.attention_nets import first_test_digit
from gatepool.lab.common.receptive_field import layers_to_see
from gatepool.lab.experiments.max_normals import max_moments
from gatepool.lab.harness import run_experiment
from gatepool.lab.report.dials import sqrt_d_dial, tau_dial
from gatepool.lab.stats import bonferroni, welch_difference
from gatepool.layers import create_pool
from gatepool.layers.attention_pool import AttentionPoolLatent
from gatepool.layers.blocks import MLP, Decoder, Encoder
from gatepool.layers.global_pool import GlobalGatedPool2d
from gatepool.layers.positional import (
    LearnedPositionalEmbedding1d,
    LearnedPositionalEmbedding2d,
    sinusoidal_encoding,
)
from gatepool.models import ResidualCNN
from gatepool.models.conv_attention import ConvAttentionNet
from gatepool.models.resnet_gate import ResNetGate
from gatepool.models.seq import make_task_batch
from gatepool.models.vit import ViT
from gatepool.utils.threads import check_threads

SITES = {
    "threads": (lambda: check_threads(0), "threads must be an integer >= 1 or None, got 0"),
    "create_pool": (lambda: create_pool("conv", 2, channels=True),
                    "channels must be an integer >= 1 or None, got True"),
    "global_pool": (lambda: GlobalGatedPool2d("soft", channels=2.5),
                    "channels must be an integer >= 1 or None, got 2.5"),
    "sinusoidal": (lambda: sinusoidal_encoding(0, 8), "length must be an integer >= 1, got 0"),
    "positional-1d": (lambda: LearnedPositionalEmbedding1d(True, 8),
                      "num_positions must be an integer >= 1, got True"),
    "positional-2d": (lambda: LearnedPositionalEmbedding2d(4, 4, 0), "dim must be an integer >= 1, got 0"),
    "attention_pool": (lambda: AttentionPoolLatent(8, num_queries=0),
                       "num_queries must be an integer >= 1, got 0"),
    "mlp_ratio": (lambda: MLP(8, mlp_ratio=float("nan")), "mlp_ratio must be a finite number > 0, got nan"),
    "hidden_dim": (lambda: MLP(8, hidden_dim=0), "hidden_dim must be an integer >= 1, got 0"),
    "encoder": (lambda: Encoder(8, -1, 1), "depth must be an integer >= 0, got -1"),
    "decoder": (lambda: Decoder(8, True, 1), "depth must be an integer >= 0, got True"),
    "welch": (lambda: welch_difference([1.0, 2.0], [1.0, 3.0], True),
              "confidence must be a finite number in (0, 1), got True"),
    "bonferroni": (lambda: bonferroni(0.95, 2.0), "comparisons must be an integer >= 1, got 2.0"),
    "bonferroni-confidence": (lambda: bonferroni(1.5, 2),
                              "confidence must be a finite number in (0, 1), got 1.5"),
    "tau_dial": (lambda: tau_dial([1.0, 2.0], 0), "tau must be a finite number > 0, got 0"),
    "sqrt_d_dial": (lambda: sqrt_d_dial(4, queries=1), "queries must be an integer >= 2, got 1"),
    "mnist_batch": (lambda: mnist_batch(0), "n must be an integer >= 1, got 0"),
    "attention_cost": (lambda: attention_cost(100, heads=True), "heads must be an integer >= 1, got True"),
    "max_of_normals": (lambda: max_of_normals(0), "n must be an integer >= 1, got 0"),
    "max_of_rectified": (lambda: max_of_rectified_normals(True), "n must be an integer >= 1, got True"),
    "padding_map-height": (lambda: padding_variance_map(0, 5, 3, 1), "height must be an integer >= 1, got 0"),
    "padding_map-kernel": (lambda: padding_variance_map(5, 5, (3, True), 1),
                           "kernel_size must be an integer >= 1, got True"),
    "padding_map-padding": (lambda: padding_variance_map(5, 5, 3, -1),
                            "padding must be an integer >= 0, got -1"),
    "measure": (lambda: measure(nn.Identity(), torch.zeros(2, 3), samples=-1),
                "samples must be an integer >= 0, got -1"),
    "task_batch": (lambda: make_task_batch("copy", 0, 4), "batch_size must be an integer >= 1, got 0"),
    "resnet_gate-widths": (lambda: ResNetGate(widths=(16, 0), depths=(1, 1)),
                           "widths[1] must be an integer >= 1, got 0"),
    "resnet_gate-depths": (lambda: ResNetGate(depths=(1, 0, 1, 1)),
                           "depths[1] must be an integer >= 1, got 0"),
    "resnet_gate-groups": (lambda: ResNetGate(groups=0), "groups must be an integer >= 1, got 0"),
    "vit": (lambda: ViT(image_size=28, patch_size=0, in_channels=1, dim=8, depth=1, num_heads=1,
                        num_classes=10),
            "patch_size must be an integer >= 1, got 0"),
    "residual_cnn-width": (lambda: ResidualCNN(width=0), "width must be an integer >= 1, got 0"),
    "residual_cnn-blocks": (lambda: ResidualCNN(blocks=(1, -1)), "blocks[1] must be an integer >= 0, got -1"),
    "conv_attention": (lambda: ConvAttentionNet(d=True), "d must be an integer >= 1, got True"),
    "layers_to_see": (lambda: layers_to_see(10, 1), "rf_kernel must be an integer >= 2, got 1"),
    "first_test_digit": (lambda: first_test_digit(10), "--set digit must be an integer in [0, 9], got 10"),
    "max_moments": (lambda: max_moments(0), "n must be an integer >= 1, got 0"),
}


@pytest.mark.parametrize("site", list(SITES))
def test_a_bad_argument_gets_the_helpers_message(site):
    build, message = SITES[site]
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build()


# An experiment's --set checks: the run stops before any work, and its record carries the message.
EXPERIMENTS = {
    "pool-forward": ({"window": "0"}, "--set window must be an integer in [1, "),
    "conv-unrolled": ({"padding": "-1"}, "--set padding must be an integer >= 0, got -1"),
    "temperature-dial": ({"temperatures": "1,0"}, "--set temperatures (each τ) must be a finite number > 0"),
    "conv-forward": ({"channels": "0"}, "--set channels must be an integer >= 1, got 0"),
    "flashcards": ({"threads": "0"}, "--set threads must be an integer >= 1, got 0"),
    "sqrt-d": ({"tokens": "1"}, "--set tokens must be an integer >= 2, got 1"),
    "max-normals": ({"samples": "50"}, "--set samples must be an integer >= 100, got 50"),
    "weight-uses": ({"kernel": "-1"}, "--set kernel must be an integer >= 1, got -1"),
    "attention-cost": ({"max_tokens": "100"}, "--set max_tokens must be an integer in [576, 16384], got 100"),
    "vit-mnist": ({"sizes": "0", "budget_s": "5"},
                  "--set sizes (each) must be an integer in [1, 60000], got 0"),
}


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_an_experiments_bad_setting_gets_the_helpers_message(name, tmp_path):
    overrides, message = EXPERIMENTS[name]
    rec = run_experiment(name, overrides=overrides, out=tmp_path, progress=False)
    assert message in (rec.get("error") or ""), rec.get("error")


def test_argparse_types_call_the_helper():
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be an integer >= 1, got 'two'$"):
        int_at_least(1)("two")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be an integer >= 0, got -1$"):
        int_at_least(0)("-1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a finite number in \(0, inf\), got nan$"):
        float_in(0, low_open=True)("nan")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be a finite number in \[0, 1\), got 1\.0$"):
        float_in(0, 1)("1")
    assert int_at_least(1)("3") == 3 and float_in(0, 1)("0.5") == 0.5
