"""One writer per run folder: ``FOLDER/.gatepool.lock``, held with ``fcntl.flock`` while a run writes there.

    with RunLock("runs/reproduce-quick"):     # a second holder gets LockHeld (or waits: wait=True)
        ...                                   # checkpoints, results, report

Why ``flock`` and not a file made with ``O_CREAT | O_EXCL``: the kernel drops a flock when its process
ends, however it ends (``kill -9``, the OOM killer), so a dead owner never blocks the next run. An
O_EXCL file outlives a killed owner, and deciding that it is stale means asking whether its pid still
runs, which pid reuse makes wrong and another host makes impossible. Here the file's content only says
who holds the lock, one JSON line ``{"pid", "host", "since", "command"}``, written once the lock is
taken and emptied on release. A new owner that finds content there knows its writer died holding the
lock: it takes over, deletes the temporary files of that writer's unfinished writes (no reader opens
them; see :mod:`gatepool.utils.io`) and warns, naming it.

The file is never deleted: unlinking a locked file lets two processes each lock a different inode.
flock needs POSIX (Linux, macOS; NFS on Linux maps it to a POSIX byte-range lock). Where ``fcntl`` is
missing (Windows) no lock is taken, and the first attempt warns that runs are not protected.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_NAME = ".gatepool.lock"
_warned_no_fcntl = False


class LockHeld(RuntimeError):
    """Another process holds the folder's lock; ``holder`` is what it wrote (None: not yet readable)."""

    def __init__(self, folder: str | os.PathLike, holder: dict[str, Any] | None) -> None:
        self.folder = Path(folder)
        self.holder = holder
        super().__init__(f"{self.folder} is in use by {describe(holder)}; wait for it to end, or pass --wait")


def describe(holder: dict[str, Any] | None) -> str:
    """``pid 123 on host h since 2025-01-01T12:00:00+00:00 (gatepool reproduce)``."""
    if not holder:
        return "another process (its details are being written)"
    text = f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
    return text + (f" ({holder['command']})" if holder.get("command") else "")


class RunLock:
    """Exclusive lock on ``folder`` (created if missing) for one writer; a context manager.

    Args:
        folder: the run folder; the lock is ``folder/.gatepool.lock``.
        wait: block until the holder ends instead of raising :class:`LockHeld`.
        command: what the holder runs, shown to whoever is refused (default: this process's argv).
    """

    def __init__(self, folder: str | os.PathLike, *, wait: bool = False, command: str | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.wait = wait
        self.command = command if command is not None else _argv()
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        if fcntl is None:
            _warn_no_fcntl()
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
        try:
            if not _try_lock(fd):
                holder = _read_holder(fd)
                if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                    raise RuntimeError(f"{self.folder}: this process already holds its lock")
                if not self.wait:
                    raise LockHeld(self.folder, holder)
                print(f"waiting for {self.folder}: in use by {describe(holder)}", file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            previous = _read(fd)
            if previous.strip():  # its writer died holding the lock: the kernel released it, the text stayed
                # lazy: io imports torch, and the CLI's --help must not
                from gatepool.utils.io import remove_temp_files

                removed = remove_temp_files(self.folder)
                left = f"; removed {len(removed)} temp file(s) of its unfinished writes" if removed else ""
                print(
                    f"warning: {self.folder}: taking over the lock of {describe(_parse(previous))}, "
                    f"which ended without releasing it{left}",
                    file=sys.stderr,
                    flush=True,
                )
            mine = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": datetime.now().astimezone().isoformat(timespec="seconds"),
                "command": self.command,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
        except BaseException:
            os.close(fd)  # closing drops the flock, if taken
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # empty: released cleanly
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", "replace")


def _parse(text: str) -> dict[str, Any] | None:
    try:
        holder = json.loads(text)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _read_holder(fd: int) -> dict[str, Any] | None:
    """The holder's line; it writes it just after locking, so give it a moment to appear."""
    for _ in range(20):
        holder = _parse(_read(fd))
        if holder:
            return holder
        time.sleep(0.01)
    return None


def _argv() -> str:
    return shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]]) if sys.argv else ""


def _warn_no_fcntl() -> None:
    global _warned_no_fcntl
    if not _warned_no_fcntl:
        print("warning: no fcntl: run folders are not locked; run one command per folder", file=sys.stderr)
        _warned_no_fcntl = True
