"""Disk full: a write that fails for lack of space leaves the previous file intact and says so plainly."""

import errno
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from gatepool.utils import io
from gatepool.utils.io import DiskFullError, atomic_torch_save, atomic_write, atomic_write_json

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("save", ["json", "torch"])
def test_enospc_keeps_the_previous_file_and_raises_disk_full(tmp_path, monkeypatch, save):
    target = tmp_path / "out" / ("result.json" if save == "json" else "checkpoint.pt")
    write = {"json": atomic_write_json, "torch": atomic_torch_save}[save]
    write(target, {"epoch": 1})
    before = target.read_bytes()
    monkeypatch.setattr(io.os, "fsync", _no_space)  # the data reached the page cache, not the disk
    with pytest.raises(DiskFullError) as info:
        write(target, {"epoch": 2})
    assert target.read_bytes() == before
    assert _leftovers(target.parent) == []
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename == str(target)
    assert str(target) in str(e) and "disk is full" in str(e) and "\n" not in str(e)


def test_enospc_wrapped_by_the_writer_is_still_disk_full(tmp_path):
    """torch.save turns a failed write into RuntimeError('unexpected pos ...'); the cause is in its chain."""

    def write(f):
        try:
            f.write(b"partial")
            _no_space()
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from None

    (tmp_path / "a").write_bytes(b"old")
    with pytest.raises(DiskFullError):
        atomic_write(tmp_path / "a", write)
    assert (tmp_path / "a").read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_other_errors_pass_through_and_clean_up(tmp_path, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    (tmp_path / "a").write_bytes(b"old")
    monkeypatch.setattr(io.os, "replace", denied)
    with pytest.raises(PermissionError) as info:
        io.atomic_write_bytes(tmp_path / "a", b"new")
    assert not isinstance(info.value, DiskFullError)
    assert (tmp_path / "a").read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_disk_full_error_pickles():
    import pickle

    e = DiskFullError(errno.ENOSPC, "No space left on device", "/x/result.json")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is DiskFullError and str(back) == str(e)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (needs root and mount permission; skipped otherwise)."""
    mnt = tmp_path / "tiny-disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_real_full_disk_keeps_the_previous_checkpoint(tiny_disk):
    target = tiny_disk / "checkpoint.pt"
    atomic_torch_save(target, {"w": torch.zeros(1000)})  # ~5 KB: fits
    before = target.read_bytes()
    with pytest.raises(DiskFullError, match="checkpoint.pt: the disk is full"):
        atomic_torch_save(target, {"w": torch.zeros(100_000)})  # ~400 KB: does not
    assert target.read_bytes() == before and _leftovers(tiny_disk) == []
    atomic_write_json(tiny_disk / "result.json", {"ok": True})  # the space came back
    assert json.loads((tiny_disk / "result.json").read_text()) == {"ok": True}


@pytest.mark.slow
def test_cli_train_on_a_full_disk_says_one_line_and_exits_2(tiny_disk):
    out = tiny_disk / "run"
    cmd = [sys.executable, "-m", "gatepool", "train", "--epochs", "1", "--train-size", "256", "--test-size",
           "256", "--batch-size", "64", "--threads", "1", "--quiet", "--out", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "checkpoint.pt" in lines[0] and "disk is full" in lines[0]
    assert _leftovers(out) == [] and not (out / "checkpoint.pt").exists()


def test_remove_temp_files_takes_only_atomic_writes_leftovers(tmp_path):
    from gatepool.utils.io import remove_temp_files

    (tmp_path / "run").mkdir()
    fd, left = tempfile.mkstemp(prefix=".checkpoint.pt.", suffix=".tmp", dir=tmp_path / "run")  # a kill's
    os.close(fd)
    keep = [tmp_path / ".someone-elses.tmp", tmp_path / "checkpoint.pt", tmp_path / "run" / "notes.tmp"]
    for path in keep:
        path.write_text("x")
    assert remove_temp_files(tmp_path) == [Path(left)]
    assert not Path(left).exists() and all(path.exists() for path in keep)
