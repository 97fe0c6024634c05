"""Atomic writes: a file is either the old one or the complete new one, never half written.

Each writer puts the bytes in a temporary file in the same folder, flushes and fsyncs it, then
``os.replace``s it over the target (atomic on POSIX and Windows), so a run killed at any moment
(``kill -9`` included) leaves no torn checkpoint or result behind. A write that fails for lack of
space (ENOSPC, or EDQUOT: over quota) removes its temporary file and raises :class:`DiskFullError`;
the target keeps its previous content.
"""

from __future__ import annotations

import errno
import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: mkstemp makes 0600 files, the result should get the usual 0644
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFullError(OSError):
    """A write failed for lack of space; the file it was to replace is unchanged.

    Built like an OSError, ``DiskFullError(errno, strerror, filename)``, so it pickles across processes.
    """

    def __str__(self) -> str:
        return (
            f"{self.filename}: the disk is full ({self.strerror}); the write was undone and the file is as it"
            " was before. Free some space and run the same command again: finished work is kept"
        )


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(fileobj)`` on a temporary file, then rename it to ``path``."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        full = _no_space(e)
        if full is not None:
            raise DiskFullError(full.errno, full.strerror or os.strerror(full.errno), str(path)) from e
        raise
    return path


def _no_space(e: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError in ``e``'s chain (a writer such as torch.save may wrap it), if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=_jsonable) + "\n")


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    buf = io.BytesIO()  # serialize first: the disk sees one plain write, whose errors are our own
    torch.save(obj, buf)
    return atomic_write_bytes(path, buf.getbuffer())


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _jsonable(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"cannot write {type(x).__name__} as JSON")
