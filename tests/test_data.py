"""IDX parsing, verification errors and the search order, on small files the tests write."""

import gzip
import hashlib
import struct

import numpy as np
import pytest
import torch

from gatepool import data
from gatepool.data import DataError, DatasetSpec, load_dataset, parse_idx, read_idx


def idx_bytes(arr: np.ndarray) -> bytes:
    code = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}[arr.dtype]
    return bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def test_parse_idx_roundtrip_uint8_and_int32():
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(parse_idx(idx_bytes(a)), a)
    b = np.array([-5, 7, 1 << 20], dtype=">i4")
    np.testing.assert_array_equal(parse_idx(idx_bytes(b)), b.astype(np.int32))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda raw: b"\x01" + raw[1:], "magic"),
        (lambda raw: raw[:2] + b"\x42" + raw[3:], "magic"),
        (lambda raw: raw[:-1], "truncated"),
        (lambda raw: raw + b"\x00", "trailing"),
        (lambda raw: raw[:6], "header"),
    ],
)
def test_parse_idx_rejects_bad_files(mutate, message):
    raw = idx_bytes(np.zeros((3, 2, 2), np.uint8))
    with pytest.raises(DataError, match=message):
        parse_idx(mutate(raw), source="x.idx")


def test_read_idx_gz_and_raw_and_hash(tmp_path):
    a = np.random.default_rng(0).integers(0, 255, (5, 4, 4), dtype=np.uint8)
    raw = idx_bytes(a)
    (tmp_path / "a").write_bytes(raw)
    (tmp_path / "a.gz").write_bytes(gzip.compress(raw, compresslevel=1))
    digest = hashlib.sha256(raw).hexdigest()
    for name in ("a", "a.gz"):
        np.testing.assert_array_equal(read_idx(tmp_path / name, digest), a)
    with pytest.raises(DataError, match=r"a\.gz: SHA-256"):
        read_idx(tmp_path / "a.gz", "0" * 64, dataset="mnist")


def test_truncated_gzip_names_file_and_remedy(tmp_path):
    blob = gzip.compress(idx_bytes(np.zeros((50, 8, 8), np.uint8)))
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    bad.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz.*gatepool data fetch mnist"):
        read_idx(bad, dataset="mnist")


@pytest.fixture
def tiny_spec(monkeypatch, tmp_path):
    """A data set 'tiny' whose four files the test writes; returns a writer for a root folder."""
    rng = np.random.default_rng(1)
    contents = {
        "train-images-idx3-ubyte": idx_bytes(rng.integers(0, 255, (6, 3, 3), dtype=np.uint8)),
        "train-labels-idx1-ubyte": idx_bytes(rng.integers(0, 10, (6,), dtype=np.uint8)),
        "t10k-images-idx3-ubyte": idx_bytes(rng.integers(0, 255, (2, 3, 3), dtype=np.uint8)),
        "t10k-labels-idx1-ubyte": idx_bytes(rng.integers(0, 10, (2,), dtype=np.uint8)),
    }
    spec = DatasetSpec(
        name="tiny",
        files=data._IDX_FILES,
        sha256={k: hashlib.sha256(v).hexdigest() for k, v in contents.items()},
        mean=0.5,
        std=0.25,
        mirrors=(),
        license="test",
    )
    monkeypatch.setitem(data.DATASETS, "tiny", spec)
    monkeypatch.delenv("GATEPOOL_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(data, "repo_data_dir", lambda: tmp_path / "repo")

    def write(root, corrupt=False):
        folder = root / "tiny"
        folder.mkdir(parents=True, exist_ok=True)
        for k, v in contents.items():
            (folder / f"{k}.gz").write_bytes(gzip.compress(v[:-1] + b"\x07" if corrupt else v))
        return folder

    return write


def test_search_order(tiny_spec, tmp_path, monkeypatch):
    cache = tmp_path / "xdg" / "gatepool"
    tiny_spec(cache)
    assert load_dataset("tiny", "train").source == cache / "tiny"
    tiny_spec(tmp_path / "repo")
    assert load_dataset("tiny", "train").source == tmp_path / "repo" / "tiny"
    env = tiny_spec(tmp_path / "env")
    monkeypatch.setenv("GATEPOOL_DATA", str(tmp_path / "env"))
    assert load_dataset("tiny", "test").source == env
    explicit = tiny_spec(tmp_path / "explicit")
    ds = load_dataset("tiny", "test", data_dir=tmp_path / "explicit")
    assert ds.source == explicit and ds.images.shape == (2, 3, 3) and ds.labels.dtype == torch.int64


def test_wrong_content_fails_and_missing_says_how(tiny_spec, tmp_path):
    tiny_spec(tmp_path / "bad", corrupt=True)
    with pytest.raises(DataError, match="SHA-256"):
        load_dataset("tiny", "train", data_dir=tmp_path / "bad")
    with pytest.raises(DataError, match="not found.*gatepool data fetch tiny"):
        load_dataset("tiny", "train", data_dir=tmp_path / "nothing")
    with pytest.raises(ValueError, match="dataset="):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="split="):
        load_dataset("tiny", "valid")


def test_normalized(tiny_spec, tmp_path):
    tiny_spec(tmp_path / "d")
    ds = load_dataset("tiny", "train", data_dir=tmp_path / "d")
    x = ds.normalized()
    assert x.shape == (6, 1, 3, 3) and x.dtype == torch.float32
    torch.testing.assert_close(x[:, 0], (ds.images.float() / 255 - 0.5) / 0.25)


def test_shipped_mnist_verifies_and_matches_its_readme():
    """The repo's own copy: label counts and mean pixel from ../shared/data/mnist/README.md."""
    train = load_dataset("mnist", "train")
    assert train.images.shape == (60000, 28, 28)
    counts = torch.bincount(train.labels, minlength=10).tolist()
    assert counts == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert abs(train.images.double().mean().item() / 255 - 0.1307) < 1e-4
    test = load_dataset("mnist", "test")
    assert torch.bincount(test.labels, minlength=10).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]
