"""The generated 60×60 sets: recipe, determinism, the cache's SHA-256 checks, loading by name."""

import hashlib
import json

import numpy as np
import pytest
import torch

import gatepool.data
from gatepool.data import (
    GENERATED,
    CanvasRecipe,
    DataError,
    dataset_names,
    generate,
    generate_split,
    info,
    load,
    split_size,
)
from gatepool.data import load_dataset as load_idx

# SHA-256 of generate_split(recipe, first 64 MNIST test digits, "test"): a changed recipe or generator
# changes every result measured on the set, so it must show up here (then bump CanvasRecipe.version).
PINNED = {
    "translated-mnist": "46d52697e19851db9d8f66658152fe9957c577c2189190ffa815a82a557427de",
    "cluttered-mnist": "ceeaed15cb30c3b16e87f7e3d688907831df41c5b3ebb769dd837d61ecdd50be",
    "distractor-mnist": "601684b316236271532f26dc8ee7d08c464837295ab5ba407fdd5107c7c45404",
}


@pytest.fixture(scope="module")
def digits():
    ds = load_idx("mnist", "test")
    return ds.images.numpy()[:64], ds.labels.numpy()[:64]


@pytest.mark.parametrize("name", list(GENERATED))
def test_pinned_and_deterministic(name, digits):
    a = generate_split(GENERATED[name], digits[0], "test")
    assert a.shape == (64, 60, 60) and a.dtype == np.uint8
    assert hashlib.sha256(a.tobytes()).hexdigest() == PINNED[name]
    np.testing.assert_array_equal(a, generate_split(GENERATED[name], digits[0], "test"))
    other_seed = CanvasRecipe(**{**GENERATED[name].__dict__, "seed": 1})
    assert not np.array_equal(a, generate_split(other_seed, digits[0], "test"))
    assert not np.array_equal(a, generate_split(GENERATED[name], digits[0], "train"))  # own stream


def _digit_positions(recipe, digits):
    """The digit alone (the same draws, nothing pasted): where its ink lands."""
    alone = CanvasRecipe(recipe.name, "translated", recipe.seed, recipe.canvas, dim=recipe.dim)
    return generate_split(alone, digits, "test")


def test_translated_holds_the_whole_digit(digits):
    a = generate_split(GENERATED["translated-mnist"], digits[0], "test")
    assert np.array_equal(a.reshape(64, -1).sum(1), digits[0].reshape(64, -1).sum(1))  # nothing cut off
    b = generate_split(GENERATED["translated-mnist"], np.tile(digits[0][:1], (64, 1, 1)), "test")
    corners = {tuple(np.argwhere(img)[0]) for img in b}
    assert len(corners) > 32  # the same digit lands in many places


def test_cluttered_adds_fragments_over_the_digit(digits):
    recipe = GENERATED["cluttered-mnist"]
    a = generate_split(recipe, digits[0], "test")
    alone = _digit_positions(recipe, digits[0])
    assert np.all(a >= alone)  # pasted by max: the digit's ink is all there
    extra = (a > alone).reshape(64, -1).sum(1)
    assert np.mean(extra > 0) > 0.9  # clutter in nearly every image (a fragment may be blank)
    assert extra.max() <= recipe.fragments * recipe.fragment_size**2


def test_distractor_dims_the_digit_and_adds_bright_bars(digits):
    recipe = GENERATED["distractor-mnist"]
    a = generate_split(recipe, digits[0], "test")
    alone = _digit_positions(recipe, digits[0])
    assert alone.max() == round(255 * recipe.dim)
    assert np.all(a.reshape(64, -1).max(1) == 255)  # every canvas has a bar
    assert np.all((a == alone) | (a == 255))  # bars are 255, everything else is the dimmed digit


# ----------------------------------------------------------------------------- the cache


@pytest.fixture
def small_source(small_canvas):
    """Generation from 40/20 MNIST digits into a temporary cache (the real one has 70,000)."""
    return small_canvas(40, 20)


def test_generated_on_first_use_with_manifest(small_source):
    ds = load("cluttered-mnist", "test")  # by name, as the trainer loads
    where = small_source / "cluttered-mnist"
    assert ds.source == where and ds.images.shape == (20, 60, 60) and ds.labels.dtype == torch.int64
    manifest = json.loads((where / "manifest.json").read_text())
    for file, digest in manifest["sha256"].items():
        assert hashlib.sha256((where / file).read_bytes()).hexdigest() == digest
    train = load("cluttered-mnist", "train")
    x = train.images.double() / 255
    assert (ds.mean, ds.std) == pytest.approx((x.mean().item(), x.std(correction=0).item()))
    assert torch.equal(train.labels, load("mnist", "train").labels[:40])
    rows = [r for r in info() if r["dataset"] == "cluttered-mnist"]
    assert len(rows) == 4 and all(r["verified"] for r in rows)


def test_corrupt_file_names_it_and_the_fix(small_source):
    load("translated-mnist", "train")
    path = small_source / "translated-mnist" / "train-images-idx3-ubyte"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: SHA-256.*delete .*translated-mnist.*"
                       r"gatepool data generate translated-mnist --force"):
        load("translated-mnist", "train")
    row = next(r for r in info() if r["file"] == "train-images-idx3-ubyte"
               and r["dataset"] == "translated-mnist")
    assert not row["verified"] and "SHA-256 mismatch" in row["error"]
    generate("translated-mnist", force=True)
    assert len(load("translated-mnist", "train")) == 40


def test_interrupted_or_other_recipe_is_made_again(small_source, monkeypatch):
    first = load("distractor-mnist", "test").images.clone()
    where = small_source / "distractor-mnist"
    (where / "manifest.json").unlink()  # as if killed before the manifest was written
    (where / "t10k-images-idx3-ubyte").write_bytes(b"torn")
    assert torch.equal(load("distractor-mnist", "test").images, first)
    changed = CanvasRecipe(**{**GENERATED["distractor-mnist"].__dict__, "bars": 2})
    monkeypatch.setitem(GENERATED, "distractor-mnist", changed)
    assert not torch.equal(load("distractor-mnist", "test").images, first)
    assert json.loads((where / "manifest.json").read_text())["recipe"]["bars"] == 2


def test_trainer_and_names(small_source):
    from gatepool.train import TrainConfig, load_data

    assert {"translated-mnist", "cluttered-mnist", "distractor-mnist"} <= set(dataset_names())
    assert split_size("cluttered-mnist", "test") == 10000  # the real split's size
    assert split_size("mnist", "test") == 10000
    assert len(load("mnist", "test")) == 10000  # the IDX sets by the same name lookup
    d = load_data(TrainConfig(data="translated-mnist", train_size=16, test_size=8))
    assert d.train_x.shape == (16, 1, 60, 60) and d.test_x.shape == (8, 1, 60, 60)
    with pytest.raises(ValueError, match="translated-mnist"):
        load("bogus-mnist")
    with pytest.raises(ValueError, match="split"):
        load("translated-mnist", "valid")


def test_load_serves_every_name_info_lists(small_source):
    names = dataset_names()
    assert list(dict.fromkeys(r["dataset"] for r in info())) == names  # `gatepool data info`'s sets
    assert gatepool.data.load("cluttered-mnist").images.shape == (40, 60, 60)
    for name in names:
        try:
            ds = gatepool.data.load(name, "test")
        except DataError as e:  # an IDX set not installed here (fashion-mnist): the error says the fix
            assert name in GENERATED or f"gatepool data fetch {name}" in str(e), e
            continue
        side = 60 if name in GENERATED else 28
        assert ds.name == name and ds.images.shape[1:] == (side, side) and len(ds) == len(ds.labels)
        assert len(ds) == (20 if name in GENERATED else split_size(name, "test"))


def test_unknown_name_lists_the_known_ones():
    for call in (lambda: gatepool.data.load("bogus-mnist"), lambda: split_size("bogus-mnist", "test")):
        with pytest.raises(ValueError, match="bogus-mnist") as e:
            call()
        assert all(repr(name) in str(e.value) for name in dataset_names())
