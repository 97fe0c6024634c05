"""Rotated MNIST: every digit turned by its own angle, drawn uniformly in [0, 2π), from the shipped MNIST.

A network that must classify a digit at any orientation gains from having rotation built into its
weights (a G-CNN), and this set asks exactly that question. It follows MNIST-rot (Larochelle et al.,
ICML 2007: 12,000 training digits, rotated uniformly) but is our own draw, from one recipe and one seed:

    rotated-mnist   train: 12,000 digits drawn without replacement from MNIST's 60,000 training digits
                    test:  MNIST's 10,000 test digits (other writers than the training digits), in order

For split s, with the split's own ``numpy.random.Generator(SeedSequence([seed, s]))`` drawing, in order,
the training split's picks (``choice(60000, 12000, replace=False)``) and then one angle per digit:

    θ_n ~ U[0, 2π)
    A_n = [[cos θ_n, −sin θ_n, 0], [sin θ_n, cos θ_n, 0]]            the rotation about the image centre
    out_n = round(clamp(grid_sample(d_n, affine_grid(A_n)), 0, 255))   bilinear, zeros outside, float64

(``torch.nn.functional.affine_grid`` / ``grid_sample`` with ``align_corners=False``, on the CPU in
float64: deterministic, the same bytes on every run.) The label is the source digit's. MNIST's digits
sit in a 20×20 box at the centre of 28×28, so a turn loses at most a few faint corner pixels.

Files: ``<folder>/rotated-mnist/`` holds the four IDX files (raw) and a ``manifest.json`` written last,
atomically, with the recipe, the SHA-256 of every file and the training pixels' mean and std, as for
the canvas sets (:mod:`gatepool.data.canvas`). The first load generates the set (a few seconds); every
load verifies every file against the manifest, and a missing or damaged file is a
:class:`~gatepool.data.DataError` naming it and the fix (delete the folder, or ``gatepool data generate
rotated-mnist --force``). A manifest from another recipe is made again.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gatepool.data import generated
from gatepool.data import idx as idx_sets
from gatepool.data.canvas import SPLITS
from gatepool.data.generated import (
    FILES,
    MANIFEST,
    _load,  # noqa: F401 (its cache is cleared by the tests as rotated._load)
    check_split,
    file_rows,
    idx_bytes,
    load_split,
    read_manifest,
)
from gatepool.data.idx import Dataset
from gatepool.utils.io import atomic_write_bytes, atomic_write_json

CHUNK = 4096  # digits rotated at a time (bounds the sampling grid's memory)


@dataclass(frozen=True)
class RotationRecipe:
    """How a rotated set is made; stored in its manifest (a changed recipe makes the set again)."""

    name: str
    seed: int = 0
    train_size: int = 12000  # drawn from MNIST's 60,000 training digits
    test_size: int = 10000  # MNIST's first test digits (all 10,000)
    version: int = 1  # bump when the generator's code changes what it makes

    def describe(self) -> str:
        return (f"{self.train_size:,} training and {self.test_size:,} test MNIST digits, each rotated by an "
                f"angle drawn uniformly in [0, 2π) (seed {self.seed})")


ROTATED: dict[str, RotationRecipe] = {"rotated-mnist": RotationRecipe("rotated-mnist")}
SOURCE = "mnist"


def _recipe(name: str) -> RotationRecipe:
    if name not in ROTATED:
        raise ValueError(f"dataset={name!r} is not a rotated set; choose one of {sorted(ROTATED)}")
    return ROTATED[name]


# ----------------------------------------------------------------------------- generation


def rotate(digits: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """``digits`` (N, H, W) uint8 turned by ``angles`` (N,) radians about their centres: (N, H, W) uint8.

    Bilinear sampling in float64 with zeros outside the image, rounded to the nearest integer.
    """
    if digits.dim() != 3 or angles.shape != digits.shape[:1]:
        raise ValueError(f"digits must be (N, H, W) and angles (N,), got {tuple(digits.shape)} and "
                         f"{tuple(angles.shape)}")
    out = torch.empty_like(digits)
    for lo in range(0, len(digits), CHUNK):
        d = digits[lo:lo + CHUNK].to(torch.float64).unsqueeze(1)  # (n, 1, H, W)
        c, s = torch.cos(angles[lo:lo + CHUNK]), torch.sin(angles[lo:lo + CHUNK])  # (n,)
        zero = torch.zeros_like(c)
        theta = torch.stack([torch.stack([c, -s, zero], -1), torch.stack([s, c, zero], -1)], 1)  # (n, 2, 3)
        grid = F.affine_grid(theta, list(d.shape), align_corners=False)  # (n, H, W, 2)
        turned = F.grid_sample(d, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        out[lo:lo + CHUNK] = turned.squeeze(1).round().clamp(0, 255).to(torch.uint8)
    return out


def draws(recipe: RotationRecipe, split: str, available: int) -> tuple[np.ndarray, np.ndarray]:
    """(which source digits, their angles) for ``split``, from ``available`` source digits."""
    g = np.random.default_rng(np.random.SeedSequence([recipe.seed, SPLITS[split]]))
    n = recipe.train_size if split == "train" else recipe.test_size
    if n > available:
        raise ValueError(f"{recipe.name}: the {split} split takes {n} digits, its source has {available}")
    picks = g.choice(available, n, replace=False) if split == "train" else np.arange(n)
    return picks, g.uniform(0.0, 2 * math.pi, size=n)


def generate_split(recipe: RotationRecipe, source: Dataset, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The rotated images (N, 28, 28) uint8 and labels (N,) uint8 of ``split`` from its MNIST ``source``."""
    picks, angles = draws(recipe, split, len(source))
    idx = torch.from_numpy(picks)
    images = rotate(source.images.index_select(0, idx), torch.from_numpy(angles))
    return images.numpy(), source.labels.index_select(0, idx).numpy().astype(np.uint8)


# ----------------------------------------------------------------------------- the cache


def folder(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Where ``name`` is kept: ``DIR/<name>`` for an explicit folder, else the cache's ``<name>/``."""
    _recipe(name)
    return generated.where(name, data_dir)


def _source(split: str, data_dir: str | os.PathLike | None = None) -> Dataset:
    """The MNIST split the rotated digits come from (a seam for tests)."""
    return idx_sets.load_dataset(SOURCE, split, data_dir=data_dir)


def _current(manifest: dict[str, Any] | None, recipe: RotationRecipe) -> bool:
    return manifest is not None and manifest.get("recipe") == asdict(recipe)


def generate(name: str, data_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Make ``name``'s files (unless a manifest of the same recipe is there already); returns the folder.

    Each file is written atomically and the manifest last, so an interrupted generation is made again.
    """
    recipe = _recipe(name)
    where = folder(name, data_dir)
    if not force and _current(read_manifest(where), recipe):
        return where
    if force and where.is_dir():
        shutil.rmtree(where)
    digests: dict[str, str] = {}
    stats: dict[str, float] = {}
    for split, (img_file, label_file) in FILES.items():
        images, labels = generate_split(recipe, _source(split, data_dir), split)
        if split == "train":
            x = images.astype(np.float64) / 255.0
            stats = {"mean": float(x.mean()), "std": float(x.std())}
        for file, arr in ((img_file, images), (label_file, labels)):
            blob = idx_bytes(arr)
            digests[file] = hashlib.sha256(blob).hexdigest()
            atomic_write_bytes(where / file, blob)
    atomic_write_json(where / MANIFEST, {"recipe": asdict(recipe), "source": SOURCE, "sha256": digests,
                                         "torch": torch.__version__, **stats})
    return where


def split_size(name: str, split: str, data_dir: str | os.PathLike | None = None) -> int:
    """Examples in a split, made or not (the recipe's sizes; ``data_dir`` is accepted for symmetry)."""
    recipe = _recipe(name)
    if split not in FILES:
        raise ValueError(f"split={split!r} is unknown; choose 'train' or 'test'")
    return recipe.train_size if split == "train" else recipe.test_size


def load(name: str, split: str = "train", data_dir: str | os.PathLike | None = None) -> Dataset:
    """Load (generating on first use) and verify one split of rotated set ``name``."""
    _recipe(name)
    check_split(split)
    return load_split(name, split, generate(name, data_dir))


def info(data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """For every rotated set and file: where it is kept and whether it verifies (nothing is generated)."""
    rows = []
    for name, recipe in ROTATED.items():
        where = folder(name, data_dir)
        rows += file_rows(name, where, _current(read_manifest(where), recipe), recipe.describe())
    return rows
