"""The shared helpers: JSON conversion, the thread-count block, atomic PNGs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gatepool.utils.io import atomic_write_json, json_copy, read_json, to_json
from gatepool.utils.plotting import pyplot, save_png
from gatepool.utils.threads import num_threads


@dataclasses.dataclass
class Point:
    x: float
    tags: tuple[str, ...]


def test_to_json_turns_every_kind_into_json_types():
    value = {
        "tensor": torch.tensor([[1.5, 2.0]]),
        "scalar": torch.tensor(3),
        "np": np.arange(3, dtype=np.int64),
        "np_scalar": np.float32(0.25),
        "np_bool": np.bool_(True),
        "path": Path("a/b"),
        "tuple": (1, (2.0, "x")),
        "point": Point(1.0, ("a", "b")),
        "none": None,
        7: "int key",
    }
    out = to_json(value)
    assert out == {"tensor": [[1.5, 2.0]], "scalar": 3, "np": [0, 1, 2], "np_scalar": 0.25, "np_bool": True,
                   "path": "a/b", "tuple": [1, [2.0, "x"]], "point": {"x": 1.0, "tags": ["a", "b"]},
                   "none": None, 7: "int key"}  # fmt: skip
    assert type(out["scalar"]) is int and type(out["np_scalar"]) is float and type(out["np_bool"]) is bool
    assert json_copy(value) == json.loads(json.dumps(out))  # keys as JSON writes them: 7 -> "7"
    assert "7" in json_copy(value)
    with pytest.raises(TypeError, match="set"):
        to_json({"s": {1, 2}})


def test_to_json_rounds_floats_to_significant_digits_only_when_asked():
    x = [1 / 3, 123456789.0, torch.tensor(2 / 3, dtype=torch.float64), math.inf, 5]
    assert to_json(x) == [1 / 3, 123456789.0, 2 / 3, math.inf, 5]
    assert to_json(x, digits=3) == [0.333, 123000000.0, 0.667, math.inf, 5]
    assert math.isnan(to_json(float("nan"), digits=3))


def test_atomic_write_json_writes_what_json_copy_gives(tmp_path):
    value = {"t": torch.arange(3) / 4, "p": Point(2.0, ()), 3: (1, 2)}
    atomic_write_json(tmp_path / "v.json", value)
    assert read_json(tmp_path / "v.json") == json_copy(value) == {"t": [0.0, 0.25, 0.5],
                                                                  "p": {"x": 2.0, "tags": []}, "3": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["v.json"]  # no temporary file left


def test_num_threads_sets_and_restores_even_after_an_error():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with num_threads(other) as n:
        assert n == other == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"), num_threads(other):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with num_threads(None) as n:
        assert n == before
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads"), num_threads(bad):
            pass
    assert torch.get_num_threads() == before


def test_save_png_writes_a_png_and_closes_the_figure(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    path = save_png(fig, tmp_path / "sub" / "f.png", dpi=50)
    assert path == tmp_path / "sub" / "f.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.png"]
    fig2, _ = plt.subplots(figsize=(2, 2))
    save_png(fig2, tmp_path / "g.png", close=False)
    assert plt.fignum_exists(fig2.number)
    plt.close(fig2)
