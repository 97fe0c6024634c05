"""IDX parsing, verification errors and the search order, on small files the tests write."""

import gzip
import hashlib
import struct

import numpy as np
import pytest
import torch

from gatepool.data import DataError, DatasetSpec, load_dataset, parse_idx, read_idx
from gatepool.data import idx as data


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
    """A data set 'tiny' whose four files the test writes; returns a writer for a folder.

    The shared places are moved under tmp_path: repository ``repo/``, cache ``xdg/gatepool/``,
    Debian package ``debian/``.
    """
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
    monkeypatch.setattr(data, "DEBIAN_DATA", tmp_path / "debian")

    def write(folder, corrupt=(), skip=()):
        """Write the files into ``folder`` (corrupting or leaving out the named ones); returns it."""
        folder.mkdir(parents=True, exist_ok=True)
        for k, v in contents.items():
            if k not in skip:
                (folder / f"{k}.gz").write_bytes(gzip.compress(v[:-1] + b"\x07" if k in corrupt else v))
        return folder

    return write


def test_search_order_without_an_explicit_folder(tiny_spec, tmp_path):
    debian = tiny_spec(tmp_path / "debian" / "tiny")
    assert load_dataset("tiny", "train").source == debian
    cache = tiny_spec(tmp_path / "xdg" / "gatepool" / "tiny")
    assert load_dataset("tiny", "train").source == cache
    tiny_spec(tmp_path / "repo" / "tiny", skip=["t10k-labels-idx1-ubyte"])  # incomplete: passed over
    assert data.locate("tiny") == (cache, "cache")
    repo = tiny_spec(tmp_path / "repo" / "tiny")
    assert data.locate("tiny") == (repo, "repository")
    assert load_dataset("tiny", "train").source == repo


@pytest.mark.parametrize("given", ["argument", "environment"])
@pytest.mark.parametrize("layout", ["DIR/tiny", "DIR"])
def test_explicit_folder_is_used_as_given(tiny_spec, tmp_path, monkeypatch, given, layout):
    tiny_spec(tmp_path / "repo" / "tiny")  # a good copy elsewhere must not matter
    root = tmp_path / "explicit"
    folder = tiny_spec(root / "tiny" if layout == "DIR/tiny" else root)
    if given == "environment":
        monkeypatch.setenv("GATEPOOL_DATA", str(root))
    ds = load_dataset("tiny", "test", data_dir=root if given == "argument" else None)
    assert ds.source == folder and ds.images.shape == (2, 3, 3) and ds.labels.dtype == torch.int64
    rule = "explicit (--data-dir)" if given == "argument" else "explicit (GATEPOOL_DATA)"
    assert data.locate("tiny", root if given == "argument" else None) == (folder, rule)
    assert data.split_size("tiny", "train", root if given == "argument" else None) == 6


def test_explicit_subfolder_wins_over_files_in_the_folder(tiny_spec, tmp_path):
    root = tiny_spec(tmp_path / "explicit")
    sub = tiny_spec(root / "tiny")
    assert load_dataset("tiny", "train", data_dir=root).source == sub


def test_explicit_folder_without_the_files_is_an_error_not_a_fallback(tiny_spec, tmp_path, monkeypatch):
    tiny_spec(tmp_path / "repo" / "tiny")
    tiny_spec(tmp_path / "xdg" / "gatepool" / "tiny")
    empty = tmp_path / "empty"
    empty.mkdir()
    for kwargs, label in [({"data_dir": empty}, "--data-dir"), ({}, "GATEPOOL_DATA")]:
        if label == "GATEPOOL_DATA":
            monkeypatch.setenv("GATEPOOL_DATA", str(empty))
        with pytest.raises(DataError) as info:
            load_dataset("tiny", "train", **kwargs)
        msg = str(info.value)
        assert msg.startswith(f"{label} {empty}: no tiny files in {empty / 'tiny'} or {empty};")
        assert "train-images-idx3-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg
        assert f"gatepool data fetch tiny --dest {empty / 'tiny'}" in msg and f"leave out {label}" in msg
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("tiny", "train", data_dir=tmp_path / "nowhere")


def test_explicit_folder_with_a_bad_or_missing_file_is_refused_naming_it(tiny_spec, tmp_path):
    tiny_spec(tmp_path / "repo" / "tiny")
    bad = tiny_spec(tmp_path / "bad", corrupt=["train-labels-idx1-ubyte"])
    with pytest.raises(DataError, match=r"bad/train-labels-idx1-ubyte\.gz: SHA-256.*leave out --data-dir"):
        load_dataset("tiny", "train", data_dir=bad)
    assert len(load_dataset("tiny", "test", data_dir=bad)) == 2  # the test split's files are good
    part = tiny_spec(tmp_path / "part", skip=["t10k-images-idx3-ubyte"])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\(\.gz\) is missing from .*part \(explicit"):
        load_dataset("tiny", "test", data_dir=part)


def test_another_data_sets_file_is_named(tmp_path, monkeypatch):
    """MNIST and Fashion-MNIST share file names: a mix-up says whose file it is."""
    monkeypatch.delenv("GATEPOOL_DATA", raising=False)
    fake = {**data.DATASETS["fashion-mnist"].sha256}
    raw = idx_bytes(np.zeros(3, np.uint8))
    fake["t10k-labels-idx1-ubyte"] = hashlib.sha256(raw).hexdigest()
    monkeypatch.setitem(data.DATASETS, "other", DatasetSpec("other", data._IDX_FILES, fake, 0, 1, (), ""))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(raw)
    with pytest.raises(DataError, match="it is other's t10k-labels-idx1-ubyte"):
        read_idx(tmp_path / "t10k-labels-idx1-ubyte", "0" * 64)


def test_wrong_content_fails_and_missing_says_how(tiny_spec, tmp_path):
    with pytest.raises(DataError, match="tiny: not found in .*repo/tiny.*gatepool data fetch tiny"):
        load_dataset("tiny", "train")
    with pytest.raises(ValueError, match="dataset="):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="split="):
        load_dataset("tiny", "valid")


def test_info_says_which_copy_and_why(tiny_spec, tmp_path, monkeypatch):
    def tiny_rows(data_dir=None):
        rows = [r for r in data.info(data_dir) if r["dataset"] == "tiny"]
        assert len(rows) == 4 and len({(r["folder"], r["rule"]) for r in rows}) == 1
        return rows

    assert tiny_rows()[0]["folder"] is None and "not found" in tiny_rows()[0]["error"]
    tiny_spec(tmp_path / "debian" / "tiny")
    assert tiny_rows()[0]["rule"] == "Debian package"
    tiny_spec(tmp_path / "xdg" / "gatepool" / "tiny")
    assert tiny_rows()[0]["rule"] == "cache"
    repo = tiny_spec(tmp_path / "repo" / "tiny")
    rows = tiny_rows()
    assert (
        rows[0]["rule"] == "repository"
        and rows[0]["folder"] == str(repo)
        and all(r["verified"] for r in rows)
    )
    bad = tiny_spec(tmp_path / "bad", corrupt=["t10k-images-idx3-ubyte"])
    rows = {r["file"]: r for r in tiny_rows(bad)}
    assert rows["t10k-images-idx3-ubyte"]["rule"] == "explicit (--data-dir)"
    assert not rows["t10k-images-idx3-ubyte"]["verified"] and rows["train-images-idx3-ubyte"]["verified"]
    rows = tiny_rows(tmp_path / "empty")
    assert rows[0]["folder"] is None and "--data-dir" in rows[0]["error"] and not rows[0]["verified"]


def test_normalized(tiny_spec, tmp_path):
    tiny_spec(tmp_path / "d" / "tiny")
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
