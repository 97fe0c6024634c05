"""MNIST and Fashion-MNIST as in-memory tensors, read from IDX files and verified by SHA-256.

An IDX file is a 4-byte magic ``0x00 0x00 <dtype code> <ndim>``, ``ndim`` big-endian uint32 sizes, then
the values, big-endian. Each file may be gzip-compressed or raw. Every load is checked against the
SHA-256 of the *decompressed* bytes, so any gzip of the right content passes and anything else fails
with an error naming the file and saying how to get a good copy; nothing half-read is ever returned.

Where a data set is loaded from (:func:`locate`; ``gatepool data info`` shows it):
  * explicit: ``data_dir=`` (the CLI's ``--data-dir``) or else the ``GATEPOOL_DATA`` environment variable
    names a folder DIR, and the files are read from ``DIR/<name>/`` or, if that holds none of them, from
    DIR itself. Nothing else is tried: a missing or corrupt file there is an error naming it.
  * otherwise the first of these whose ``<name>/`` holds all four files (else the first holding some):
    1. repository: its own ``data/`` (full MNIST ships there, so a fresh clone works offline),
    2. cache: ``~/.cache/gatepool`` (where ``gatepool data fetch`` puts files),
    3. Debian package: ``/usr/share/datasets`` (``dataset-fashion-mnist`` installs ``fashion-mnist/``).
Each file is ``<file>.gz`` or the raw ``<file>``.
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

from gatepool.utils.checks import check_int
from gatepool.utils.environment import cache_dir
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


def _how_to_get(name: str, explicit: tuple[str, Path] | None = None) -> str:
    if explicit is not None:
        label, root = explicit
        return (
            f"put good copies in {root / name} or {root} (`gatepool data fetch {name} --dest {root / name}`"
            f" downloads them), or leave out {label} to use the search order"
        )
    hint = f"run `gatepool data fetch {name}`"
    if name == "fashion-mnist":
        hint += " or `apt-get install dataset-fashion-mnist`"
    if name == "mnist":
        hint += " or restore the repository's data/mnist/ (`git checkout data/mnist`)"
    return hint


def _whose(file: str, digest: str) -> str:
    """`` (it is fashion-mnist's file)`` when the content belongs to another data set, else ``""``."""
    for other in DATASETS.values():
        if other.sha256.get(file) == digest:
            return f" (it is {other.name}'s {file})"
    return ""


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


def read_idx(
    path: str | os.PathLike, sha256: str | None = None, *, dataset: str | None = None, hint: str | None = None
) -> np.ndarray:
    """Read one IDX file (gz or raw); with ``sha256`` the decompressed content must match it.

    Errors end with ``hint`` (default: how to get ``dataset``'s files, when given).
    """
    hint = f"; {hint}" if hint else (f"; {_how_to_get(dataset)}" if dataset else "")
    try:
        raw = read_bytes(path)
    except DataError as e:
        raise DataError(f"{e}{hint}") from e
    if sha256 is not None:
        got = hashlib.sha256(raw).hexdigest()
        if got != sha256:
            name = Path(path).name.removesuffix(".gz")
            raise DataError(
                f"{path}: SHA-256 of the content is {got}, expected {sha256}{_whose(name, got)}{hint}"
            )
    try:
        return parse_idx(raw, source=str(path))
    except DataError as e:
        raise DataError(f"{e}{hint}") from e


# ----------------------------------------------------------------------------- search order


def repo_data_dir() -> Path:
    """The repository's ``data/`` (src/gatepool/data/idx.py -> ../../../../data)."""
    return Path(__file__).resolve().parents[3] / "data"


DEBIAN_DATA = Path("/usr/share/datasets")  # apt-get install dataset-fashion-mnist


def search_roots(data_dir: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """The (rule, root) pairs tried, in order: the explicit folder alone, or the three shared places."""
    explicit = _explicit(data_dir)
    if explicit is not None:
        return [(f"explicit ({explicit[0]})", explicit[1])]
    return [
        ("repository", repo_data_dir()),
        ("cache", cache_dir()),
        ("Debian package", DEBIAN_DATA),
    ]


def _explicit(data_dir: str | os.PathLike | None) -> tuple[str, Path] | None:
    """(how it was given, folder) for ``data_dir`` or ``GATEPOOL_DATA``; None when neither is set."""
    if data_dir is not None:
        return "--data-dir", Path(data_dir)
    if os.environ.get("GATEPOOL_DATA"):
        return "GATEPOOL_DATA", Path(os.environ["GATEPOOL_DATA"])
    return None


def _find(folder: Path, file: str) -> Path | None:
    """``folder/file.gz`` or ``folder/file``, whichever exists first."""
    for path in (folder / f"{file}.gz", folder / file):
        if path.is_file():
            return path
    return None


def _count(folder: Path, spec: DatasetSpec) -> int:
    return sum(_find(folder, file) is not None for file in spec.sha256)


def locate(name: str, data_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(folder, rule): where data set ``name`` is read from, and why (see the module docstring).

    An explicit folder holding none of the files is a :class:`DataError` naming both places it looked
    in and the files; there is no falling back to another copy.
    """
    spec = _spec(name)
    explicit = _explicit(data_dir)
    if explicit is not None:
        label, root = explicit
        for folder in (root / name, root):
            if _count(folder, spec):
                return folder, f"explicit ({label})"
        files = ", ".join(spec.sha256)
        missing = "" if root.is_dir() else f" ({root} does not exist)"
        raise DataError(
            f"{label} {root}: no {name} files in {root / name} or {root}{missing}; looked for {files}"
            f" (each raw or .gz); {_how_to_get(name, explicit)}"
        )
    roots = search_roots()
    for rule, root in roots:  # a complete copy first, then any (the load names what is missing)
        if _count(root / name, spec) == len(spec.sha256):
            return root / name, rule
    for rule, root in roots:
        if _count(root / name, spec):
            return root / name, rule
    where = ", ".join(str(root / name) for _, root in roots)
    raise DataError(f"{name}: not found in {where}; {_how_to_get(name)}")


def find_file(name: str, file: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The copy of ``file`` of data set ``name`` that a load would read, else None."""
    try:
        folder, _ = locate(name, data_dir)
    except DataError:
        return None
    return _find(folder, file)


def split_size(name: str, split: str, data_dir: str | os.PathLike | None = None) -> int:
    """Number of examples in a split, from its labels file's header (cheap; :func:`load_dataset` verifies)."""
    spec = _spec(name)
    if split not in spec.files:
        raise ValueError(f"split={split!r} is unknown; choose 'train' or 'test'")
    folder, rule = locate(name, data_dir)
    file = spec.files[split][1]
    path = _find(folder, file)
    if path is None:
        raise DataError(f"{name}: {file}(.gz) is missing from {folder} ({rule}); {_hint(name, data_dir)}")
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            head = (gzip.GzipFile(fileobj=raw) if gz else raw).read(8)
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: unreadable ({e}); {_hint(name, data_dir)}") from e
    if len(head) < 8 or head[:4] != b"\x00\x00\x08\x01":
        raise DataError(f"{path}: not an IDX labels file (header {head.hex()}); {_hint(name, data_dir)}")
    return struct.unpack(">I", head[4:8])[0]


def _hint(name: str, data_dir: str | os.PathLike | None) -> str:
    return _how_to_get(name, _explicit(data_dir))


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
    folder, rule = locate(name, data_dir)
    hint = _hint(name, data_dir)
    paths = []
    for file in spec.files[split]:
        path = _find(folder, file)
        if path is None:
            raise DataError(f"{name}: {file}(.gz) is missing from {folder} ({rule}); {hint}")
        paths.append(path)
    stamp = tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in paths)  # a changed file is re-read
    return _load(name, split, *paths, stamp, hint)



def mnist_batch(n: int = 512, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` MNIST digits of ``split``, normalized: ((n, 1, 28, 28) float32, (n,) int64)."""
    check_int(n, "n")
    ds = load_dataset("mnist", split)
    if n > len(ds):
        raise ValueError(f"n={n} is more than the {len(ds)} {split} digits")
    return ds.normalized()[:n], ds.labels[:n]

@functools.lru_cache(maxsize=4)
def _load(name: str, split: str, img_file: Path, label_file: Path, _stamp: tuple, hint: str) -> Dataset:
    spec = DATASETS[name]
    arrays = []
    for path, file in zip((img_file, label_file), spec.files[split]):
        arrays.append((path, read_idx(path, spec.sha256[file], hint=hint)))
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
    """For every data set and file: the copy a load would read, the rule that chose it, and its check."""
    rows = []
    for name, spec in DATASETS.items():
        try:
            folder, rule = locate(name, data_dir)
            error = None
        except DataError as e:
            folder, rule, error = None, None, str(e)
        for file, digest in spec.sha256.items():
            path = _find(folder, file) if folder is not None else None
            row = {
                "dataset": name,
                "file": file,
                "rule": rule,
                "folder": str(folder) if folder is not None else None,
                "path": str(path) if path else None,
                "verified": False,
                "error": error,
            }
            if folder is not None and path is None:
                row["error"] = f"missing from {folder}; {_hint(name, data_dir)}"
            elif path is not None:
                try:
                    got = hashlib.sha256(read_bytes(path)).hexdigest()
                    row["verified"] = got == digest
                    if not row["verified"]:
                        row["error"] = f"SHA-256 mismatch{_whose(file, got)}"
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
