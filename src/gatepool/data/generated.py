"""What every generated data set shares: its files, its manifest, and how a split is loaded and verified.

A generated set (``canvas``: the canvas sets; ``rotated``: rotated-mnist) is made from MNIST by a recipe
with a fixed seed and kept as four IDX files in its own folder, with ``manifest.json`` written last: the
recipe, the source, the SHA-256 of every file and the training split's mean and std. Loading a split
checks the manifest and every byte of its two files against it; anything missing or changed is a
:class:`~gatepool.data.idx.DataError` that names the file and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gatepool.data.idx import DataError, Dataset, _explicit, read_idx
from gatepool.utils.environment import cache_dir
from gatepool.utils.io import read_json

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MANIFEST = "manifest.json"


def where(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """``DIR/<name>`` for an explicit folder, else the cache's ``<name>/``."""
    explicit = _explicit(data_dir)
    return (explicit[1] if explicit is not None else cache_dir()) / name


def idx_bytes(arr: np.ndarray) -> bytes:
    """uint8 array -> IDX bytes (magic 0x0000 08 ndim, big-endian sizes, values)."""
    header = b"\x00\x00\x08" + bytes([arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + np.ascontiguousarray(arr, np.uint8).tobytes()


def fix_hint(name: str, folder: Path) -> str:
    return (f"delete {folder} (it is generated again on the next use) or run "
            f"`gatepool data generate {name} --force`")


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return read_json(folder / MANIFEST)
    except (OSError, ValueError):
        return None


def check_split(split: str) -> None:
    if split not in FILES:
        raise ValueError(f"split={split!r} is unknown; choose 'train' or 'test'")


def load_split(name: str, split: str, folder: Path) -> Dataset:
    """One split of the set made in ``folder``, verified against its manifest (cached while the files
    stay as they are)."""
    manifest = read_manifest(folder)
    if manifest is None:
        raise DataError(f"{folder / MANIFEST}: missing or unreadable; {fix_hint(name, folder)}")
    paths = [folder / f for f in FILES[split]]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: missing (the manifest lists it); {fix_hint(name, folder)}")
    stamp = tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    sha = manifest["sha256"]
    return _load(name, split, folder, stamp, sha[FILES[split][0]], sha[FILES[split][1]], manifest["mean"],
                 manifest["std"])


@functools.lru_cache(maxsize=2)
def _load(name: str, split: str, folder: Path, _stamp: tuple, img_sha: str, label_sha: str,
          mean: float, std: float) -> Dataset:
    hint = fix_hint(name, folder)
    img_file, label_file = FILES[split]
    images = read_idx(folder / img_file, img_sha, hint=hint)
    labels = read_idx(folder / label_file, label_sha, hint=hint)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{folder / img_file}: images {images.shape} and labels {labels.shape} do not pair"
                        f" up; {hint}")
    return Dataset(name=name, split=split, images=torch.from_numpy(images),
                   labels=torch.from_numpy(labels.astype(np.int64)), mean=mean, std=std, source=folder)


def file_rows(name: str, folder: Path, current: bool, recipe: str) -> list[dict[str, Any]]:
    """``gatepool data info``'s rows for one generated set: each file, where, and whether it verifies
    (``current``: the manifest is of today's recipe); nothing is generated."""
    manifest = read_manifest(folder)
    rows = []
    for file in (f for pair in FILES.values() for f in pair):
        row = {"dataset": name, "file": file, "rule": "generated", "folder": str(folder),
               "path": str(folder / file), "verified": False, "error": None, "recipe": recipe}
        if manifest is None:
            row["path"] = None
            row["error"] = f"not generated yet (made on first use, or `gatepool data generate {name}`)"
        elif not current:
            row["error"] = "made by another recipe: generated again on the next use"
        elif not (folder / file).is_file():
            row["error"] = f"missing; {fix_hint(name, folder)}"
        else:
            got = hashlib.sha256((folder / file).read_bytes()).hexdigest()
            row["verified"] = got == manifest["sha256"].get(file)
            if not row["verified"]:
                row["error"] = f"SHA-256 mismatch; {fix_hint(name, folder)}"
        rows.append(row)
    return rows
