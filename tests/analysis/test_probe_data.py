"""`gatepool probe --data NAME`: every data set gatepool.data loads, the chosen images normalized as the
set's own (no file needed for the name check; the MNIST check needs the repository's digits)."""

from __future__ import annotations

import pytest
import torch

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
