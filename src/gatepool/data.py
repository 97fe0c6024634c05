"""MNIST and Fashion-MNIST as in-memory tensors, read from IDX files and verified by SHA-256.

An IDX file is a 4-byte magic ``0x00 0x00 <dtype code> <ndim>``, ``ndim`` big-endian uint32 sizes, then
the values, big-endian. Each file may be gzip-compressed or raw. Every load is checked against the
SHA-256 of the *decompressed* bytes, so any gzip of the right content passes and anything else fails
with an error naming the file and saying how to get a good copy; nothing half-read is ever returned.

Where a data set is looked for, in order:
  1. ``data_dir=`` (the CLI's ``--data-dir``) or the ``GATEPOOL_DATA`` environment variable,
  2. the repository's own ``data/`` (full MNIST ships there, so a fresh clone works offline),
  3. the user cache ``~/.cache/gatepool`` (where ``gatepool data fetch`` puts files),
  4. ``/usr/share/datasets/<name>/`` (Debian's ``dataset-fashion-mnist`` layout).
Each root holds ``<name>/<file>.gz`` (or the raw file); root 4 is itself the ``<name>`` folder's parent.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import struct
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gatepool.utils.io import atomic_write_bytes

_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


@dataclass(frozen=True)
class DatasetSpec:
    """What a data set's four files must contain, and where to fetch them."""

    name: str
    files: dict[str, tuple[str, str]]  # split -> (images file, labels file)
    sha256: dict[str, str]  # file -> SHA-256 of the decompressed bytes
    mean: float  # of the training pixels, in [0, 1]
    std: float
    mirrors: tuple[str, ...]
    license: str


_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

DATASETS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec(
        name="mnist",
        files=_IDX_FILES,
        sha256={
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
        mean=0.1307,
        std=0.3081,
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        license="CC BY-SA 3.0 (Yann LeCun, Corinna Cortes, Christopher J.C. Burges)",
    ),
    # Hashes computed from Debian's dataset-fashion-mnist (0.0~git20200523.55506a9-1) files;
    # mean and std of its 60,000 training images: 0.28604 and 0.35302.
    "fashion-mnist": DatasetSpec(
        name="fashion-mnist",
        files=_IDX_FILES,
        sha256={
            "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
        mean=0.2860,
        std=0.3530,
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        license="MIT (Zalando Research)",
    ),
}


class DataError(RuntimeError):
    """A data file is missing, truncated, corrupt or not the expected content."""


def _how_to_get(name: str) -> str:
    hint = f"run `gatepool data fetch {name}`"
    if name == "fashion-mnist":
        hint += " or `apt-get install dataset-fashion-mnist`"
    if name == "mnist":
        hint += " or restore the repository's data/mnist/ (`git checkout data/mnist`)"
    return hint


# ----------------------------------------------------------------------------- IDX format


def parse_idx(raw: bytes, *, source: str = "<bytes>") -> np.ndarray:
    """Parse the decompressed bytes of an IDX file; the header is checked against the length."""
    if len(raw) < 4:
        raise DataError(f"{source}: {len(raw)} bytes is too short for an IDX header")
    zero, code, ndim = raw[0:2], raw[2], raw[3]
    if zero != b"\x00\x00" or code not in _DTYPES or ndim == 0:
        raise DataError(f"{source}: bad IDX magic number {raw[:4].hex()} (want 0000 <dtype> <ndim>)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{source}: truncated IDX header ({len(raw)} bytes, need {header})")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_DTYPES[code])
    want = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != want:
        raise DataError(
            f"{source}: IDX header says shape {shape} ({want} bytes) but the file has {len(raw)} bytes"
            + (" (truncated)" if len(raw) < want else " (trailing data)")
        )
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def read_bytes(path: str | os.PathLike) -> bytes:
    """Return a file's decompressed bytes (gzip detected by its magic, not its name)."""
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise DataError(f"{path}: corrupt or truncated gzip ({e})") from e
    return data


def read_idx(path: str | os.PathLike, sha256: str | None = None, *, dataset: str | None = None) -> np.ndarray:
    """Read one IDX file (gz or raw); with ``sha256`` the decompressed content must match it."""
    hint = f"; {_how_to_get(dataset)}" if dataset else ""
    try:
        raw = read_bytes(path)
    except DataError as e:
        raise DataError(f"{e}{hint}") from e
    if sha256 is not None:
        got = hashlib.sha256(raw).hexdigest()
        if got != sha256:
            raise DataError(f"{path}: SHA-256 of the content is {got}, expected {sha256}{hint}")
    try:
        return parse_idx(raw, source=str(path))
    except DataError as e:
        raise DataError(f"{e}{hint}") from e


# ----------------------------------------------------------------------------- search order


def repo_data_dir() -> Path:
    """The repository's ``data/`` (src/gatepool/data.py -> ../../../data)."""
    return Path(__file__).resolve().parents[2] / "data"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gatepool"


def search_roots(data_dir: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """The (label, root) pairs searched, in order; each root holds ``<name>/<file>``."""
    roots: list[tuple[str, Path]] = []
    if data_dir is not None:
        roots.append(("--data-dir", Path(data_dir)))
    elif os.environ.get("GATEPOOL_DATA"):
        roots.append(("GATEPOOL_DATA", Path(os.environ["GATEPOOL_DATA"])))
    roots += [("repo", repo_data_dir()), ("cache", cache_dir()), ("system", Path("/usr/share/datasets"))]
    return roots


def _candidates(folder: Path, file: str) -> list[Path]:
    return [folder / f"{file}.gz", folder / file]


def find_file(name: str, file: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """First existing copy of ``file`` of data set ``name`` along the search order, else None."""
    for _, root in search_roots(data_dir):
        for path in _candidates(root / name, file):
            if path.is_file():
                return path
    return None


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"dataset={name!r} is unknown; choose one of {sorted(DATASETS)}")
    return DATASETS[name]


# ----------------------------------------------------------------------------- data sets


@dataclass(frozen=True)
class Dataset:
    """One split in memory: ``images`` (N, H, W) uint8, ``labels`` (N,) int64."""

    name: str
    split: str
    images: torch.Tensor
    labels: torch.Tensor
    mean: float
    std: float
    source: Path

    def __len__(self) -> int:
        return self.labels.numel()

    def normalized(self) -> torch.Tensor:
        """(N, 1, H, W) float32: ``(x/255 − mean) / std``."""
        x = self.images.unsqueeze(1).to(torch.float32).div_(255.0)
        return x.sub_(self.mean).div_(self.std)


def load_dataset(
    name: str = "mnist", split: str = "train", data_dir: str | os.PathLike | None = None
) -> Dataset:
    """Load and verify one split of ``name`` ("mnist" or "fashion-mnist"), ``split`` "train" or "test".

    A process keeps the last few loads (the same files are verified once); treat the tensors as read-only.
    """
    spec = _spec(name)
    if split not in spec.files:
        raise ValueError(f"split={split!r} is unknown; choose 'train' or 'test'")
    paths = []
    for file in spec.files[split]:
        path = find_file(name, file, data_dir)
        if path is None:
            where = ", ".join(str(r / name) for _, r in search_roots(data_dir))
            raise DataError(f"{name}: {file}(.gz) not found in {where}; {_how_to_get(name)}")
        paths.append(path)
    stamp = tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in paths)  # a changed file is re-read
    return _load(name, split, *paths, stamp)



def mnist_batch(n: int = 512, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` MNIST digits of ``split``, normalized: ((n, 1, 28, 28) float32, (n,) int64)."""
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    ds = load_dataset("mnist", split)
    if n > len(ds):
        raise ValueError(f"n={n} is more than the {len(ds)} {split} digits")
    return ds.normalized()[:n], ds.labels[:n]

@functools.lru_cache(maxsize=4)
def _load(name: str, split: str, img_file: Path, label_file: Path, _stamp: tuple) -> Dataset:
    spec = DATASETS[name]
    arrays = []
    for path, file in zip((img_file, label_file), spec.files[split]):
        arrays.append((path, read_idx(path, spec.sha256[file], dataset=name)))
    (img_path, images), (_, labels) = arrays
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{img_path}: images {images.shape} and labels {labels.shape} do not pair up")
    return Dataset(
        name=name,
        split=split,
        images=torch.from_numpy(images),
        labels=torch.from_numpy(labels.astype(np.int64)),
        mean=spec.mean,
        std=spec.std,
        source=img_path.parent,
    )


# ----------------------------------------------------------------------------- info and fetch


def info(data_dir: str | os.PathLike | None = None) -> list[dict]:
    """For every data set and file: where it was found (if anywhere) and whether it verifies."""
    rows = []
    for name, spec in DATASETS.items():
        for file, digest in spec.sha256.items():
            path = find_file(name, file, data_dir)
            row = {
                "dataset": name,
                "file": file,
                "path": str(path) if path else None,
                "verified": False,
                "error": None,
            }
            if path is None:
                row["error"] = f"not found; {_how_to_get(name)}"
            else:
                try:
                    raw = read_bytes(path)
                    row["verified"] = hashlib.sha256(raw).hexdigest() == digest
                    if not row["verified"]:
                        row["error"] = "SHA-256 mismatch"
                except DataError as e:
                    row["error"] = str(e)
            rows.append(row)
    return rows


def fetch(name: str, dest: str | os.PathLike | None = None, *, timeout: float = 30.0) -> Path:
    """Download ``name``'s four files from its public mirrors into the cache, verifying each."""
    spec = _spec(name)
    folder = Path(dest) if dest is not None else cache_dir() / name
    for file, digest in spec.sha256.items():
        target = folder / f"{file}.gz"
        if target.is_file():
            try:
                read_idx(target, digest)
                continue
            except DataError:
                pass  # a bad copy: fetch it again
        errors = []
        for mirror in spec.mirrors:
            url = f"{mirror}{file}.gz"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r:
                    blob = r.read()
            except (urllib.error.URLError, OSError) as e:
                errors.append(f"{url}: {e}")
                continue
            try:
                got = hashlib.sha256(gzip.decompress(blob)).hexdigest()
            except (OSError, EOFError) as e:
                errors.append(f"{url}: not a valid gzip ({e})")
                continue
            if got != digest:
                errors.append(f"{url}: SHA-256 {got} != {digest}")
                continue
            atomic_write_bytes(target, blob)
            break
        else:
            raise DataError(
                f"could not download {file}.gz for {name} (offline?). Tried:\n  "
                + "\n  ".join(errors)
                + f"\nCopy the four files into {folder} by hand, or set GATEPOOL_DATA to a folder holding"
                f" {name}/."
            )
    return folder
