"""One writer per run folder: a second holder is refused (or waits); a killed holder's lock is taken over."""

import json
import os
import signal
import socket

import pytest

from gatepool.utils.lock import LOCK_NAME, LockHeld, RunLock


def test_second_holder_is_refused_naming_the_first(tmp_path, lock_holder):
    holder = lock_holder(tmp_path, 60)
    with pytest.raises(LockHeld) as info:
        RunLock(tmp_path).acquire()
    msg = str(info.value)
    assert f"pid {holder.pid} on {socket.gethostname()} since " in msg and "(holder-test)" in msg
    assert "--wait" in msg and "\n" not in msg
    assert info.value.holder["pid"] == holder.pid


def test_killed_holder_is_taken_over_with_a_warning(tmp_path, capsys, lock_holder):
    holder = lock_holder(tmp_path, 60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.pid  # the text outlives it
    with RunLock(tmp_path, command="me"):
        err = capsys.readouterr().err
        assert "warning" in err and "taking over" in err and f"pid {holder.pid}" in err
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert (tmp_path / LOCK_NAME).read_text() == ""  # released cleanly: the next owner has nothing to say
    with RunLock(tmp_path):
        assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_wait_blocks_until_the_holder_releases(tmp_path, capsys, lock_holder):
    holder = lock_holder(tmp_path, 1.0)
    with RunLock(tmp_path, wait=True):
        assert (tmp_path / "released").exists()  # we got it only after the holder let go
        assert f"waiting for {tmp_path}: in use by pid {holder.pid}" in capsys.readouterr().err
    holder.wait()


def test_same_process_twice_is_an_error_not_a_deadlock(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RuntimeError, match="this process already holds"):
            RunLock(tmp_path, wait=True).acquire()


def test_lock_creates_the_folder(tmp_path):
    with RunLock(tmp_path / "a" / "b") as lock:
        assert lock.path.is_file()
