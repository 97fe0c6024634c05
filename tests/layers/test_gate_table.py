"""The gate table: the gate sets are its views, and a gate added as one row is seen everywhere.

A toy gate, "toy-min" (g = one-hot at the smallest value: ``out = min`` over the window), is added as one
row of :data:`gatepool.layers.gate_table.TABLE` and its one gate function (a ``GatedPoolNd`` method); the
test sees it through ``create_pool``, ``convert`` (a window pool and the head's global pool), the global
pool and ``gatepool convert-check --gates``. The row and the method are monkeypatched: gone after the test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gatepool.layers as layers
from gatepool.layers import (
    GATES,
    GatedPool2d,
    GatedPoolNd,
    GlobalGatedPool2d,
    create_pool,
    gate_table,
    list_pools,
)
from gatepool.layers.adaptive_pool import ADAPTIVE_GATES, AdaptiveGatedPool2d
from gatepool.layers.convert import convert
from gatepool.layers.dynamic_pools import SAME_FILL
from gatepool.layers.gate_parameters import GATES_WITH_TEMPERATURE, GATES_WITH_WEIGHTS
from gatepool.layers.gate_table import Gate
from gatepool.layers.global_pool import GLOBAL_GATES
from gatepool.layers.windows import unfold_windows

X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def test_the_gate_sets_are_views_of_the_table():
    assert GATES == ("max", "avg", "soft", "soft-learned", "attention", "conv") == gate_table.names()
    assert GATES_WITH_WEIGHTS == ("soft-learned", "attention", "conv")
    assert GATES_WITH_TEMPERATURE == ("soft", "soft-learned", "attention")
    assert GLOBAL_GATES == ADAPTIVE_GATES == ("max", "avg", "soft", "soft-learned", "attention")
    assert SAME_FILL == {"max": float("-inf"), "avg": 0.0}
    assert list_pools() == list(GATES)


@pytest.mark.parametrize("gate", GATES)
def test_create_pool_builds_the_rows_layer(gate):
    row = gate_table.row(gate)
    pool = create_pool(gate, 2, channels=3)
    wanted = row.torch_module(2) if row.torch else getattr(layers, f"{row.layer}2d")
    assert type(pool) is wanted
    assert pool(X).shape == (2, 3, 4, 4)


@pytest.mark.parametrize(
    "fields, why",
    [
        (dict(weights=True), "learned parts"),
        (dict(positional=True, weights=True), "no global or adaptive form"),
        (dict(adaptive_form=True), "adaptive_form needs"),
        (dict(same_fill=0.0, adaptive_form=False), "torch's pools compute"),
    ],
)
def test_a_row_that_contradicts_itself_is_refused(fields, why):
    with pytest.raises(ValueError, match=why):
        Gate("bad", "_bad", **fields)


def _toy_min(self, x, geo):
    """The toy gate's function: g one-hot at the smallest tap (padded taps +inf: never chosen)."""
    taps = unfold_windows(x, geo, fill=float("inf"))  # (N, C, *out, K)
    out = taps.amin(-1)
    weights = F.one_hot(taps.argmin(-1), geo.window_size).to(x.dtype) if self.return_weights else None
    return out, None, weights


@pytest.fixture
def toy_gate(monkeypatch):
    """ "toy-min" in the table (one row) and its gate function on GatedPoolNd, for this test only."""
    monkeypatch.setitem(gate_table.TABLE, "toy-min", Gate("toy-min", "_toy_min", adaptive_form=False))
    monkeypatch.setattr(GatedPoolNd, "_toy_min", _toy_min, raising=False)
    return "toy-min"


def _min_pool(x, k, s=None, p=0):
    return -F.max_pool2d(-x, k, s, p)


def test_a_gate_added_as_one_row_is_a_pool_everywhere(toy_gate):
    assert toy_gate in list_pools() and toy_gate in gate_table.names(global_form=True)
    pool = create_pool(toy_gate, 3, 2, 1)
    assert type(pool) is GatedPool2d and repr(pool) == (
        "GatedPool2d(gate='toy-min', kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))"
    )
    torch.testing.assert_close(pool(X), _min_pool(X, 3, 2, 1), rtol=0, atol=0)
    out, weights = create_pool(toy_gate, 2, return_weights=True)(X)
    torch.testing.assert_close((weights * F.unfold(X, 2, stride=2).view(2, 3, 4, 4, 4).permute(
        0, 1, 3, 4, 2)).sum(-1), out)  # fmt: skip
    head = GlobalGatedPool2d(toy_gate, flatten=True)
    torch.testing.assert_close(head(X), X.amin((2, 3)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="toy-min' has no adaptive form"):
        AdaptiveGatedPool2d(3, gate=toy_gate)


def test_convert_takes_a_gate_added_as_one_row(toy_gate):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    model = nn.Sequential(conv, nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    model, replaced = convert(model, toy_gate, global_pool=toy_gate)
    assert [(r.name, r.role, type(r.new).__name__) for r in replaced] == [
        ("1", "window", "GatedPool2d"), ("2", "head", "GlobalGatedPool2d"),
    ]  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(model(X), _min_pool(conv(X), 2).amin((2, 3)), rtol=0, atol=0)


def test_convert_check_offers_a_gate_added_as_one_row(toy_gate, monkeypatch, tmp_path, capsys):
    from gatepool.analysis import convert_zoo
    from gatepool.cli import main

    assert main(["convert-check", "--gates", "nope", "--models", "tv:none"]) == 2
    assert "'toy-min'" in capsys.readouterr().err  # named among the choices
    swept = []
    monkeypatch.setattr(convert_zoo, "sweep", lambda models, gates, **kw: swept.append(gates))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # convert-check's, not this process's
    out = ["--models", "tv:none", "--out", str(tmp_path / "zoo.md")]
    assert main(["convert-check", "--gates", toy_gate, *out]) == 0 and swept == [(toy_gate,)]
    main(["convert-check", *out])
    assert swept[-1] == (*GATES, toy_gate)  # every gate by default, the new one too
