"""rotated-mnist: the rotation, the recipe's determinism, the cache's SHA-256 checks, loading by name."""

import hashlib
import json
import math

import numpy as np
import pytest
import torch

import gatepool.data
from gatepool.data import DataError, Dataset, dataset_names, info, load, load_dataset, rotated, split_size

# SHA-256 of the test split's first 64 rotated digits as the recipe makes them: a changed recipe or
# generator changes every result measured on the set, so it must show up here (then bump the version).
PINNED = "bf4f5cab804d36af3e00d839de7b49f0e36d36e23938f1098278097bd977bb1d"


@pytest.fixture(scope="module")
def mnist_test():
    return load_dataset("mnist", "test")


def _first(ds: Dataset, n: int) -> Dataset:
    return Dataset(ds.name, ds.split, ds.images[:n], ds.labels[:n], ds.mean, ds.std, ds.source)


def test_rotate_by_zero_and_by_quarter_turns_is_exact(mnist_test):
    d = mnist_test.images[:16]
    assert torch.equal(rotated.rotate(d, torch.zeros(16, dtype=torch.float64)), d)
    quarter = rotated.rotate(d, torch.full((16,), math.pi / 2, dtype=torch.float64))
    assert torch.equal(quarter, torch.rot90(d, 1, dims=(-2, -1)))  # θ > 0 turns as torch.rot90 does
    half = rotated.rotate(d, torch.full((16,), math.pi, dtype=torch.float64))
    assert torch.equal(half, torch.rot90(d, 2, dims=(-2, -1)))


def test_rotate_keeps_the_ink_and_checks_shapes(mnist_test):
    d = mnist_test.images[:64]
    angles = torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2 * math.pi
    out = rotated.rotate(d, angles)
    ink, kept = d.double().sum((1, 2)), out.double().sum((1, 2))
    assert ((kept / ink - 1).abs() < 0.03).all()  # bilinear resampling keeps the ink within 3%
    assert not torch.equal(out, d)
    with pytest.raises(ValueError, match="angles"):
        rotated.rotate(d, angles[:3])


def test_split_is_pinned_deterministic_and_seeded(mnist_test):
    recipe = rotated.RotationRecipe("rotated-mnist", test_size=64)
    images, labels = rotated.generate_split(recipe, mnist_test, "test")
    assert images.shape == (64, 28, 28) and images.dtype == np.uint8
    assert np.array_equal(labels, mnist_test.labels[:64].numpy())  # the test split keeps MNIST's order
    assert hashlib.sha256(images.tobytes()).hexdigest() == PINNED
    again, _ = rotated.generate_split(recipe, mnist_test, "test")
    assert np.array_equal(images, again)
    seeded = rotated.RotationRecipe("rotated-mnist", seed=1, test_size=64)
    other, _ = rotated.generate_split(seeded, mnist_test, "test")
    assert not np.array_equal(images, other)


def test_angles_are_uniform_and_training_digits_drawn_without_replacement():
    recipe = rotated.ROTATED["rotated-mnist"]
    picks, angles = rotated.draws(recipe, "train", 60000)
    assert len(picks) == 12000 == len(np.unique(picks)) and picks.max() < 60000
    assert angles.min() >= 0 and angles.max() < 2 * math.pi
    counts, _ = np.histogram(angles, bins=8, range=(0, 2 * math.pi))
    assert np.all(np.abs(counts - 1500) < 5 * math.sqrt(1500))  # uniform: each octant ≈ 1/8
    _, test_angles = rotated.draws(recipe, "test", 10000)
    assert not np.allclose(angles[:100], test_angles[:100])  # each split its own stream
    with pytest.raises(ValueError, match="takes 12000 digits"):
        rotated.draws(recipe, "train", 100)


# ----------------------------------------------------------------------------- the cache


@pytest.fixture
def small(monkeypatch, tmp_path):
    """rotated-mnist made from 80/30 MNIST digits (40 and 20 of them drawn) in a temporary cache."""
    full = {s: load_dataset("mnist", s) for s in ("train", "test")}
    monkeypatch.setattr(rotated, "_source", lambda split, data_dir=None: _first(full[split], 80 if split ==
                                                                                   "train" else 30))
    monkeypatch.setitem(rotated.ROTATED, "rotated-mnist",
                        rotated.RotationRecipe("rotated-mnist", train_size=40, test_size=20))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GATEPOOL_DATA", raising=False)
    rotated._load.cache_clear()
    yield tmp_path / "cache" / "gatepool" / "rotated-mnist"
    rotated._load.cache_clear()


def test_generated_on_first_use_with_manifest(small):
    train = load("rotated-mnist", "train")  # by name, as the trainer loads
    test = load("rotated-mnist", "test")
    assert train.source == small and train.images.shape == (40, 28, 28) and len(test) == 20
    manifest = json.loads((small / "manifest.json").read_text())
    for file, digest in manifest["sha256"].items():
        assert hashlib.sha256((small / file).read_bytes()).hexdigest() == digest
    x = train.images.double() / 255
    assert (train.mean, train.std) == pytest.approx((x.mean().item(), x.std(correction=0).item()))
    picks, _ = rotated.draws(rotated.ROTATED["rotated-mnist"], "train", 80)
    assert torch.equal(train.labels, load_dataset("mnist", "train").labels[torch.from_numpy(picks)])
    rows = [r for r in info() if r["dataset"] == "rotated-mnist"]
    assert len(rows) == 4 and all(r["verified"] for r in rows)
    first = (small / "train-images-idx3-ubyte").read_bytes()
    rotated.generate("rotated-mnist", force=True)
    assert (small / "train-images-idx3-ubyte").read_bytes() == first  # the same bytes when made again


def test_corrupt_file_names_it_and_the_fix(small):
    load("rotated-mnist", "test")
    path = small / "t10k-images-idx3-ubyte"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: SHA-256.*delete .*rotated-mnist.*"
                       r"gatepool data generate rotated-mnist --force"):
        load("rotated-mnist", "test")
    row = next(r for r in info() if r["dataset"] == "rotated-mnist" and r["file"] == "t10k-images-idx3-ubyte")
    assert not row["verified"] and "SHA-256 mismatch" in row["error"]
    gatepool.data.generate("rotated-mnist", force=True)  # the fix the message names
    assert len(load("rotated-mnist", "test")) == 20


def test_missing_file_and_other_recipe(small, monkeypatch):
    first = load("rotated-mnist", "train").images.clone()
    (small / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte: missing.*--force"):
        load("rotated-mnist", "train")
    (small / "manifest.json").unlink()  # as if killed before the manifest was written: made again
    assert torch.equal(load("rotated-mnist", "train").images, first)
    monkeypatch.setitem(rotated.ROTATED, "rotated-mnist",
                        rotated.RotationRecipe("rotated-mnist", seed=3, train_size=40, test_size=20))
    assert not torch.equal(load("rotated-mnist", "train").images, first)
    assert json.loads((small / "manifest.json").read_text())["recipe"]["seed"] == 3


def test_names_sizes_and_the_trainer(small):
    from gatepool.train import TrainConfig, load_data

    assert "rotated-mnist" in dataset_names()
    assert (split_size("rotated-mnist", "train"), split_size("rotated-mnist", "test")) == (40, 20)
    d = load_data(TrainConfig(data="rotated-mnist", train_size=16, test_size=8))
    assert d.train_x.shape == (16, 1, 28, 28) and d.test_x.shape == (8, 1, 28, 28)
    with pytest.raises(ValueError, match="split"):
        load("rotated-mnist", "valid")
