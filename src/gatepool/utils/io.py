"""Atomic writes, and values as JSON: a file is either the old one or the complete new one.

Each writer puts the bytes in a temporary file in the same folder, flushes and fsyncs it, then
``os.replace``s it over the target (atomic on POSIX and Windows), so a run killed at any moment
(``kill -9`` included) leaves no torn checkpoint or result behind. With ``keep=PATH`` the target's
previous version moves to PATH just before the new one takes its place (a killed write leaves the
previous version there, never nothing). A write that fails for lack of space (ENOSPC, or EDQUOT: over
quota) removes its temporary file and raises :class:`DiskFullError`; the target keeps its previous content.

Checked files (checkpoints): ``checked_bytes(obj)`` is a header line ``gatepool-sha256 <hex digest>``
followed by ``torch.save(obj)``'s bytes; ``load_checked(path)`` verifies the digest before it unpickles
anything and raises :class:`CorruptFileError` naming the file when it does not match (a truncated or
bit-flipped file), so a damaged checkpoint is found, not loaded.

JSON: ``to_json(x)`` turns tensors, numpy values, dataclasses, paths and tuples into JSON's types
(lists, numbers, dicts, strings), optionally rounding floats to ``digits`` significant digits;
``json_copy(x)`` is ``x`` exactly as it reads back from a JSON file (tuples as lists, keys as strings).
Every JSON file and record of the package goes through these two.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
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


class CorruptFileError(ValueError):
    """A checked file whose content does not match its checksum (truncated, bit-flipped, not ours)."""


def atomic_write(
    path: str | os.PathLike, write: Callable[[BinaryIO], None], keep: str | os.PathLike | None = None
) -> Path:
    """Call ``write(fileobj)`` on a temporary file, then rename it to ``path``.

    ``keep``: where the previous ``path`` goes (renamed, once the new bytes are on disk).
    """
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
        if keep is not None and path.exists():
            os.replace(path, keep)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        full = _no_space(e)
        if full is not None:
            raise DiskFullError(full.errno, full.strerror or os.strerror(full.errno), str(path)) from e
        raise
    return path


_TEMP_NAME = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp")  # mkstemp(prefix=".NAME.", suffix=".tmp")


def remove_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files of writes that never finished (``.NAME.*.tmp``) anywhere under ``folder``.

    A write killed before its rename leaves one behind; no reader opens it. Call this only while no
    other process writes there (holding the folder's :class:`gatepool.utils.lock.RunLock`).
    """
    removed = []
    for path in Path(folder).rglob(".*.tmp"):
        if path.is_file() and _TEMP_NAME.fullmatch(path.name):  # atomic_write's names, nobody else's
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _no_space(e: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError in ``e``'s chain (a writer such as torch.save may wrap it), if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def atomic_write_bytes(path: str | os.PathLike, data: bytes, keep: str | os.PathLike | None = None) -> Path:
    return atomic_write(path, lambda f: f.write(data), keep)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(to_json(obj), indent=2, ensure_ascii=False) + "\n")


def atomic_torch_save(path: str | os.PathLike, obj: Any, keep: str | os.PathLike | None = None) -> Path:
    """``obj`` as a checked file (:func:`checked_bytes`; read it with :func:`load_checked`)."""
    # serialized first: the disk sees one plain write, whose errors are our own
    return atomic_write_bytes(path, checked_bytes(obj), keep)


_CHECKED = b"gatepool-sha256 "


def checked_bytes(obj: Any) -> bytes:
    """``torch.save(obj)``'s bytes behind a header line holding their SHA-256: see :func:`load_checked`."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    return _CHECKED + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def load_checked(path: str | os.PathLike) -> Any:
    """The object :func:`checked_bytes` wrote to ``path``, once its SHA-256 matches.

    A file without the header (a plain ``torch.save``, as checkpoints were written before) is loaded as
    it is. Raises :class:`CorruptFileError` naming the file when the digest does not match or the bytes
    do not unpickle.
    """
    data = Path(path).read_bytes()
    if data.startswith(_CHECKED):
        head, _, payload = data.partition(b"\n")
        if hashlib.sha256(payload).hexdigest().encode() != head[len(_CHECKED) :]:
            raise CorruptFileError(f"{path}: its SHA-256 does not match its header (truncated or damaged)")
        data = payload
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch names many ways a damaged archive fails to load
        raise CorruptFileError(f"{path}: cannot be loaded ({type(e).__name__}: {e})") from e


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def to_json(x: Any, *, digits: int | None = None) -> Any:
    """``x`` in JSON's types: tensors and numpy arrays as (nested) lists, numpy and 0-d values as numbers,
    dataclasses as dicts, paths as strings, tuples as lists; dict keys are kept (``json`` turns numbers into
    strings when it writes them). With ``digits``, floats are rounded to that many significant digits.
    Anything else is a TypeError naming its type.
    """
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)):
        x = x.tolist()  # a Python scalar for 0-d tensors and numpy scalars
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if digits is not None and math.isfinite(x) else x
    if x is None or isinstance(x, (str, int)):
        return x
    if isinstance(x, (list, tuple)):
        return [to_json(v, digits=digits) for v in x]
    if isinstance(x, dict):
        return {k: to_json(v, digits=digits) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_json(getattr(x, f.name), digits=digits) for f in dataclasses.fields(x)}
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    raise TypeError(f"cannot write a {type(x).__name__} as JSON (tensors, numpy values, dataclasses, paths, "
                    "lists, tuples, dicts, strings, numbers and None can be written)")


def json_copy(x: Any, *, digits: int | None = None) -> Any:
    """``x`` exactly as it reads back from a JSON file: :func:`to_json`, then through ``json``."""
    return json.loads(json.dumps(to_json(x, digits=digits)))
