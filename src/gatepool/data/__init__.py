"""Verified data sets, every one by name: MNIST and Fashion-MNIST from IDX files (:mod:`gatepool.data.idx`)
the 60×60 canvases generated from MNIST on first use (:mod:`gatepool.data.canvas`) and rotated MNIST
(:mod:`gatepool.data.rotated`), generated the same way.

    dataset_names()                      -> ['mnist', 'fashion-mnist', 'translated-mnist', ...]
    load("cluttered-mnist", "test")      -> Dataset: images (N, H, W) uint8, labels (N,) int64
    split_size("mnist", "train")         -> 60000, without loading the split
    info()                               -> where each file is, verified or not (``gatepool data info``)

A missing or corrupt file is a :class:`DataError` naming the file and the fix; an unknown name is a
``ValueError`` listing the known ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gatepool.data import canvas, idx, rotated
from gatepool.data.canvas import (
    GENERATED,
    CanvasRecipe,
    digit_layer,
    generate_split,
    loudest_not_digit,
)
from gatepool.data.idx import (
    DATASETS,
    DEBIAN_DATA,
    DataError,
    Dataset,
    DatasetSpec,
    fetch,
    find_file,
    load_dataset,
    locate,
    mnist_batch,
    parse_idx,
    read_bytes,
    read_idx,
    repo_data_dir,
    search_roots,
)
from gatepool.data.rotated import ROTATED, RotationRecipe

__all__ = [
    "DATASETS",
    "DEBIAN_DATA",
    "GENERATED",
    "ROTATED",
    "CanvasRecipe",
    "DataError",
    "Dataset",
    "DatasetSpec",
    "RotationRecipe",
    "dataset_names",
    "digit_layer",
    "fetch",
    "find_file",
    "generate",
    "generate_split",
    "info",
    "load",
    "load_dataset",
    "locate",
    "loudest_not_digit",
    "mnist_batch",
    "parse_idx",
    "read_bytes",
    "read_idx",
    "repo_data_dir",
    "search_roots",
    "split_size",
]


def dataset_names() -> list[str]:
    """Every name :func:`load` accepts: the IDX sets, then the generated ones."""
    return [*DATASETS, *GENERATED, *ROTATED]


def _known(name: str) -> None:
    if name not in dataset_names():
        raise ValueError(f"dataset={name!r} is unknown; choose one of {dataset_names()}")


def load(name: str, split: str = "train", data_dir: str | os.PathLike | None = None) -> Dataset:
    """One verified split (``"train"`` or ``"test"``) of any data set :func:`dataset_names` lists.

    ``data_dir`` (else ``GATEPOOL_DATA``): the folder to read from, or to keep a generated set in.
    """
    _known(name)
    if name in GENERATED:
        return canvas.load(name, split, data_dir)
    if name in ROTATED:
        return rotated.load(name, split, data_dir)
    return idx.load_dataset(name, split, data_dir)


def split_size(name: str, split: str, data_dir: str | os.PathLike | None = None) -> int:
    """Examples in a split without loading it (an IDX set's labels header; a generated set has MNIST's)."""
    _known(name)
    module = canvas if name in GENERATED else rotated if name in ROTATED else idx
    return module.split_size(name, split, data_dir)


def info(data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One row per data set and file: where a load reads it, by which rule, and whether it verifies.

    The IDX sets' rows, then the generated sets' (nothing is fetched or generated).
    """
    return idx.info(data_dir) + canvas.info(data_dir) + rotated.info(data_dir)


def generate(name: str, data_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Make generated set ``name`` now (else it is made on first use); returns its folder."""
    if name in ROTATED:
        return rotated.generate(name, data_dir, force=force)
    return canvas.generate(name, data_dir, force=force)
