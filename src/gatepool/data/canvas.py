"""Harder questions for the gate: MNIST digits on a 60×60 canvas, generated from the shipped MNIST.

On MNIST every gate finds the digit's strokes, so the loudest value in a window *is* the relevant one and
the gate cannot matter. These three sets break that, each from one recipe and one seed:

    translated-mnist   the 28×28 digit at a uniformly random place on an empty 60×60 canvas
    cluttered-mnist    the same, plus K = 4 fragments of 8×8 pixels cut at random from *other* digits
                       of the split and pasted at random places (pixel-wise max): the cluttered
                       translated MNIST recipe of Mnih et al. 2014 (60×60, four 8×8 pieces of clutter),
                       the benchmark the spatial-transformer paper used
    distractor-mnist   the digit dimmed to ⅖ of its ink (peak ≈ 102 of 255) and B = 6 bright (255)
                       bars, 2 px thick and 8–20 px long, horizontal or vertical, centred within 6 px of
                       the digit's box: in most windows that hold ink, the loudest value is a bar

For image n of a split (source digit d_n, label y_n unchanged), with offsets drawn from the split's
own ``numpy.random.Generator(SeedSequence([seed, split_id]))``:

    canvas_n = 0                                                     (60, 60) uint8
    canvas_n[r:r+28, c:c+28] = d_n · a           a = 1 (translated, cluttered) or 0.4 (distractor)
    canvas_n[fragment or bar window] = max(canvas_n[...], piece)     K or B times

The train split is made from MNIST's 60,000 training digits, the test split from its 10,000 test
digits (clutter comes from the same split only, so no test ink leaks into training).

Files: ``<folder>/<name>/`` holds the four IDX files of :mod:`gatepool.data.idx` (raw, uncompressed) and a
``manifest.json`` written last, atomically, with the recipe, the SHA-256 of every file and the training
pixels' mean and std. ``<folder>`` is the cache (``~/.cache/gatepool``), or ``--data-dir``/``GATEPOOL_DATA``
when given. The first load generates the set (a few seconds); every load verifies every file against the
manifest, and a missing or damaged file is a :class:`~gatepool.data.DataError` naming it and the fix
(delete the folder, or ``gatepool data generate NAME --force``). A manifest from another recipe or seed
is made again. ``gatepool data info`` lists the sets and their state.

Every data set by name, these and the IDX sets: :func:`gatepool.data.load` (``TrainConfig(data=
"cluttered-mnist")`` loads through it), :func:`gatepool.data.split_size` and :func:`gatepool.data.info`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gatepool.data import generated
from gatepool.data import idx as idx_sets
from gatepool.data.generated import (
    FILES,
    MANIFEST,
    _load,  # noqa: F401 (its cache is cleared by the tests as canvas._load)
    check_split,
    file_rows,
    idx_bytes,
    load_split,
    read_manifest,
)
from gatepool.data.idx import Dataset
from gatepool.utils.io import atomic_write_bytes, atomic_write_json

CANVAS = 60  # canvas side, pixels
DIGIT = 28  # MNIST's side
SPLITS = {"train": 0, "test": 1}  # split -> its id in the SeedSequence
CHUNK = 8192  # images generated at a time (bounds the index arrays' memory)


@dataclass(frozen=True)
class CanvasRecipe:
    """How one generated set is made; stored in its manifest (a changed recipe makes the set again)."""

    name: str
    kind: str  # "translated" | "cluttered" | "distractor"
    seed: int = 0
    canvas: int = CANVAS
    fragments: int = 0  # clutter pieces (cluttered)
    fragment_size: int = 8
    dim: float = 1.0  # the digit's ink is multiplied by this (distractor: 0.4)
    bars: int = 0  # bright bars (distractor)
    bar_thickness: int = 2
    bar_length: tuple[int, int] = (8, 20)  # inclusive range
    bar_margin: int = 6  # bar centres lie within the digit's box grown by this many pixels
    version: int = 1  # bump when the generator's code changes what it makes

    def describe(self) -> str:
        if self.kind == "translated":
            return f"digit at a random place on a {self.canvas}×{self.canvas} canvas"
        if self.kind == "cluttered":
            return (f"digit at a random place on {self.canvas}×{self.canvas} with {self.fragments} "
                    f"{self.fragment_size}×{self.fragment_size} fragments of other digits")
        return (f"digit dimmed to {self.dim:g}× at a random place on {self.canvas}×{self.canvas} with "
                f"{self.bars} bright {self.bar_thickness}-px bars beside and across it")


GENERATED: dict[str, CanvasRecipe] = {
    "translated-mnist": CanvasRecipe("translated-mnist", "translated"),
    "cluttered-mnist": CanvasRecipe("cluttered-mnist", "cluttered", fragments=4),
    "distractor-mnist": CanvasRecipe("distractor-mnist", "distractor", dim=0.4, bars=6),
}
SOURCE = "mnist"  # every generated set is made from these digits
SPLIT_SIZES = {"train": 60000, "test": 10000}  # MNIST's, hence every generated set's


def _recipe(name: str) -> CanvasRecipe:
    if name not in GENERATED:
        raise ValueError(f"dataset={name!r} is not a generated set; choose one of {sorted(GENERATED)}")
    return GENERATED[name]


# ----------------------------------------------------------------------------- generation


def generate_split(
    recipe: CanvasRecipe, digits: np.ndarray, split: str, n: int | None = None
) -> np.ndarray:
    """The canvases of ``split`` (N, S, S) uint8 from its source ``digits`` (N, 28, 28) uint8.

    ``n``: only the first n images (tests); the first n are the same as in the full split only for the
    digits' placement, since each draw is made for the whole split at once (see :func:`_draws`).
    """
    digits = digits if n is None else digits[:n]
    draws = _draws(recipe, len(digits), split)
    out = np.empty((len(digits), recipe.canvas, recipe.canvas), np.uint8)
    for lo in range(0, len(digits), CHUNK):
        hi = min(lo + CHUNK, len(digits))
        out[lo:hi] = _compose(recipe, digits, lo, hi, draws)
    return out


def _draws(recipe: CanvasRecipe, n: int, split: str) -> dict[str, np.ndarray]:
    """Every random number of a split, drawn up front in a fixed order from the split's own Generator."""
    g = np.random.default_rng(np.random.SeedSequence([recipe.seed, SPLITS[split]]))
    room = recipe.canvas - DIGIT + 1
    draws = {"pos": g.integers(0, room, size=(n, 2))}  # the digit's top-left (row, col)
    k, f = recipe.fragments, recipe.fragment_size
    if k:
        draws["src"] = g.integers(0, n - 1, size=(n, k))  # another digit: index j ≠ n (shifted below)
        draws["src"] += draws["src"] >= np.arange(n)[:, None]
        draws["cut"] = g.integers(0, DIGIT - f + 1, size=(n, k, 2))  # the fragment's corner in that digit
        draws["at"] = g.integers(0, recipe.canvas - f + 1, size=(n, k, 2))  # its corner on the canvas
    if recipe.bars:
        b = recipe.bars
        draws["vertical"] = g.integers(0, 2, size=(n, b)).astype(bool)
        draws["length"] = g.integers(recipe.bar_length[0], recipe.bar_length[1] + 1, size=(n, b))
        m = recipe.bar_margin
        draws["centre"] = g.integers(-m, DIGIT + m, size=(n, b, 2))  # relative to the digit's corner
    return draws


def _paste_max(canvas: np.ndarray, piece: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
    """canvas[i, rows_i + a, cols_i + b] = max(that, piece[i, a, b]) for every i (no index repeats)."""
    n, h, w = piece.shape
    i = np.arange(n)[:, None, None]
    r = rows[:, None, None] + np.arange(h)[None, :, None]  # (n, h, 1)
    c = cols[:, None, None] + np.arange(w)[None, None, :]  # (n, 1, w)
    canvas[i, r, c] = np.maximum(canvas[i, r, c], piece)


def _compose(
    recipe: CanvasRecipe, digits: np.ndarray, lo: int, hi: int, draws: dict[str, np.ndarray]
) -> np.ndarray:
    n, s = hi - lo, recipe.canvas
    canvas = np.zeros((n, s, s), np.uint8)  # (n, S, S)
    digit = digits[lo:hi]
    if recipe.dim != 1.0:
        digit = np.rint(digit.astype(np.float32) * recipe.dim).astype(np.uint8)
    pos = draws["pos"][lo:hi]
    _paste_max(canvas, digit, pos[:, 0], pos[:, 1])
    f = recipe.fragment_size
    for j in range(recipe.fragments):
        src, cut, at = draws["src"][lo:hi, j], draws["cut"][lo:hi, j], draws["at"][lo:hi, j]
        rows = cut[:, 0, None, None] + np.arange(f)[None, :, None]
        cols = cut[:, 1, None, None] + np.arange(f)[None, None, :]
        piece = digits[src[:, None, None], rows, cols]  # (n, f, f): from the whole split, not the chunk
        _paste_max(canvas, piece, at[:, 0], at[:, 1])
    for j in range(recipe.bars):
        _bar(canvas, recipe, pos, draws["vertical"][lo:hi, j], draws["length"][lo:hi, j],
             draws["centre"][lo:hi, j])
    return canvas


def _bar(canvas: np.ndarray, recipe: CanvasRecipe, pos: np.ndarray, vertical: np.ndarray,
         length: np.ndarray, centre: np.ndarray) -> None:
    """One bright bar per image, clipped to the canvas: a boolean mask built by broadcasting."""
    s, t = recipe.canvas, recipe.bar_thickness
    cr, cc = pos[:, 0] + centre[:, 0], pos[:, 1] + centre[:, 1]  # (n,) centre on the canvas
    half_h = np.where(vertical, length, t) / 2  # (n,)
    half_w = np.where(vertical, t, length) / 2
    r = np.arange(s)[None, :, None]  # (1, S, 1)
    c = np.arange(s)[None, None, :]  # (1, 1, S)
    mask = ((r >= (cr - half_h)[:, None, None]) & (r < (cr + half_h)[:, None, None])
            & (c >= (cc - half_w)[:, None, None]) & (c < (cc + half_w)[:, None, None]))  # (n, S, S)
    canvas[mask] = 255


# ----------------------------------------------------------------------------- the cache


def folder(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Where ``name`` is kept: ``DIR/<name>`` for an explicit folder, else the cache's ``<name>/``."""
    _recipe(name)
    return generated.where(name, data_dir)


def generate(name: str, data_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Make ``name``'s files (unless a manifest of the same recipe is there already); returns the folder.

    Each file is written atomically and the manifest last, so an interrupted generation leaves no
    manifest and is simply made again.
    """
    recipe = _recipe(name)
    where = folder(name, data_dir)
    if not force and _manifest_matches(where, recipe):
        return where
    if force and where.is_dir():
        shutil.rmtree(where)
    digests: dict[str, str] = {}
    stats: dict[str, float] = {}
    for split, (img_file, label_file) in FILES.items():
        source = _source(split, data_dir)
        images = generate_split(recipe, source.images.numpy(), split)
        labels = source.labels.numpy().astype(np.uint8)
        if split == "train":
            x = images.astype(np.float64) / 255.0
            stats = {"mean": float(x.mean()), "std": float(x.std())}
            del x
        for file, arr in ((img_file, images), (label_file, labels)):
            blob = idx_bytes(arr)
            digests[file] = hashlib.sha256(blob).hexdigest()
            atomic_write_bytes(where / file, blob)
    atomic_write_json(where / MANIFEST, {"recipe": asdict(recipe), "source": SOURCE, "sha256": digests,
                                         **stats})
    return where


def _source(split: str, data_dir: str | os.PathLike | None = None) -> Dataset:
    """The MNIST split the canvases are made from (a seam for tests)."""
    return idx_sets.load_dataset(SOURCE, split, data_dir=data_dir)


def _manifest_matches(where: Path, recipe: CanvasRecipe) -> bool:
    m = read_manifest(where)
    return m is not None and m.get("recipe") == _jsonish(asdict(recipe))


def _jsonish(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def split_size(name: str, split: str, data_dir: str | os.PathLike | None = None) -> int:
    """Examples in a split, made or not: MNIST's sizes (``data_dir`` is accepted for symmetry)."""
    _recipe(name)
    if split not in SPLIT_SIZES:
        raise ValueError(f"split={split!r} is unknown; choose 'train' or 'test'")
    return SPLIT_SIZES[split]


def load(name: str, split: str = "train", data_dir: str | os.PathLike | None = None) -> Dataset:
    """Load (generating on first use) and verify one split of generated set ``name``."""
    _recipe(name)
    check_split(split)
    return load_split(name, split, generate(name, data_dir))


def info(data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """For every generated set and file: where it is kept and whether it verifies (nothing is generated)."""
    rows = []
    for name, recipe in GENERATED.items():
        where = folder(name, data_dir)
        rows += file_rows(name, where, _manifest_matches(where, recipe), recipe.describe())
    return rows


def digit_layer(name: str, split: str = "test", n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` canvases of a generated split as stored (each draw made for the whole split), and
    the digit's own ink alone on the same canvases (the same draws, nothing else pasted); (n, S, S) uint8."""
    recipe = _recipe(name)
    digits = _source(split).images.numpy()
    alone = CanvasRecipe(recipe.name, "translated", recipe.seed, recipe.canvas, dim=recipe.dim)
    return generate_split(recipe, digits, split)[:n], generate_split(alone, digits, split)[:n]


def loudest_not_digit(name: str, split: str = "test", n: int = 2000, window: int = 8) -> float:
    """Share of ``window``×``window`` tiles holding digit ink whose largest pixel is not the digit's.

    The digit's own ink is regenerated alone (the same draws, nothing else pasted), so a tile "holds ink"
    where that is > 0 and "the loudest is not the digit" where the canvas' maximum exceeds the digit's.
    """
    recipe = _recipe(name)
    digits = _source(split).images.numpy()
    n = min(n, len(digits))
    full = generate_split(recipe, digits, split, n)  # (n, S, S)
    alone = generate_split(CanvasRecipe(recipe.name, "translated", recipe.seed, recipe.canvas,
                                        dim=recipe.dim), digits, split, n)
    t = recipe.canvas // window
    crop = t * window

    def tiles(a: np.ndarray) -> np.ndarray:  # (n, t, t): max over each tile
        return a[:, :crop, :crop].reshape(n, t, window, t, window).max(axis=(2, 4))

    ink = tiles(alone) > 0
    return float((tiles(full) > tiles(alone))[ink].mean())
