"""`gatepool probe --data NAME`: every data set gatepool.data loads, the chosen images normalized as the
set's own (no file needed for the name check; the MNIST check needs the repository's digits)."""

from __future__ import annotations

import pytest
import torch

from gatepool.cli import main
from gatepool.cli.probe import DATA_SETS, _load_inputs
from gatepool.data import DataError, dataset_names, load


def test_probe_offers_every_data_set():
    assert list(DATA_SETS) == dataset_names()  # spelled out in the CLI: gatepool.data imports torch


def test_probe_loads_the_chosen_images_normalized():
    try:
        ds = load("mnist", "train")
    except DataError:
        pytest.skip("no MNIST files here")
    x, y = _load_inputs("mnist", 16, 3)
    idx = torch.randperm(len(ds.labels), generator=torch.Generator().manual_seed(3))[:16]
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(x, ds.normalized()[idx]) and torch.equal(y, ds.labels[idx])


@pytest.mark.slow
def test_probe_check_on_a_data_set(monkeypatch, capsys):
    try:
        load("mnist", "train")
    except DataError:
        pytest.skip("no MNIST files here")
    import gatepool.models as models

    full = models.create_model
    monkeypatch.setattr(models, "create_model", lambda name: full(name, width=8, groups=2))  # narrow: fast
    assert main(["probe-check", "--data", "mnist", "--models", "residual_cnn", "--batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "--data mnist --batch 16 --seed 0" in out and "mnist training images" in out
    assert "fwd within 15%" in out
    line = next(row for row in out.splitlines() if row.startswith("| residual_cnn |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[1] == "28" and int(cells[2]) == int(cells[3]) > 20  # every row predicted
    assert main(["probe-check", "--models", "residual_cnn"]) == 2  # gatepool's own: only with --data
    assert "--data" in capsys.readouterr().err
