"""The daemon's pidfile lock: one holder, no stale pid left by a daemon that stopped, and no
lock on a file a stopping daemon has just removed."""

from __future__ import annotations

import fcntl
import os

import pytest

from gq.daemon import pidfiles
from gq.daemon.pidfiles import acquire_pidfile, release_pidfile, running_pid
from gq.errors import AlreadyRunning
from gq.home import Home


def test_one_holder_at_a_time_and_a_released_pidfile_is_gone(tmp_path):
    home = Home(tmp_path)
    held = acquire_pidfile(home)
    assert home.daemon_pidfile.read_text() == f"{os.getpid()}\n"
    assert running_pid(home) == os.getpid()
    with pytest.raises(AlreadyRunning):
        acquire_pidfile(home)
    release_pidfile(home, held)
    assert not home.daemon_pidfile.exists() and running_pid(home) is None
    again = acquire_pidfile(home)
    assert running_pid(home) == os.getpid()
    release_pidfile(home, again)


def test_a_pidfile_left_by_a_killed_daemon_names_no_daemon_and_is_taken_over(tmp_path):
    home = Home(tmp_path)
    home.daemon_pidfile.write_text("999999\n")  # a holder gone without releasing it
    assert running_pid(home) is None
    held = acquire_pidfile(home)
    assert home.daemon_pidfile.read_text() == f"{os.getpid()}\n"
    release_pidfile(home, held)


def test_a_daemon_starting_as_another_stops_locks_the_file_that_stays(tmp_path, monkeypatch):
    """The starting daemon opens the pidfile; the stopping one removes it and lets its lock
    go; only then does the starting one lock what it opened: a file no longer there, which
    a third daemon would not find locked. It must lock the pidfile that is there."""
    home = Home(tmp_path)
    stopping = acquire_pidfile(home)
    flock = fcntl.flock

    def lock_once_the_other_has_stopped(handle, operation):
        if not stopping.closed:
            release_pidfile(home, stopping)
        return flock(handle, operation)

    monkeypatch.setattr(pidfiles.fcntl, "flock", lock_once_the_other_has_stopped)
    started = acquire_pidfile(home)
    monkeypatch.undo()
    assert os.fstat(started.fileno()).st_ino == home.daemon_pidfile.stat().st_ino
    assert running_pid(home) == os.getpid()
    with pytest.raises(AlreadyRunning):
        acquire_pidfile(home)
    release_pidfile(home, started)


def test_a_child_the_daemon_forked_holds_neither_its_lock_nor_its_socket(tmp_path):
    """A daemon killed while a child it forked (a forecast, say) still runs: the child held
    the daemon's lock, so that 'gq daemon status' said it ran and no daemon could start, and
    its copy of the listening socket took connections no one would answer."""
    import signal
    import socket
    import time

    from gq.daemon.serving.server import listen

    home = Home(tmp_path)
    told_read, told_write = os.pipe()
    daemon = os.fork()
    if daemon == 0:  # the daemon: its lock and socket, then a child that stays, then wait
        code = 1
        try:
            os.close(told_read)
            held = (acquire_pidfile(home), listen(home))  # noqa: F841 - held until killed
            if os.fork() == 0:  # (os.fork has returned here: the child is as it stays)
                os.write(told_write, f"{os.getpid()}\n".encode())
                time.sleep(60)
                os._exit(0)
            time.sleep(60)
        finally:
            os._exit(code)
    os.close(told_write)
    with os.fdopen(told_read) as told:
        child = int(told.readline())
    try:
        assert running_pid(home) == daemon
        os.kill(daemon, signal.SIGKILL)
        os.waitpid(daemon, 0)
        assert running_pid(home) is None  # the child's copy of the lock held it before
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with client, pytest.raises(ConnectionRefusedError):
            client.connect(str(home.socket))  # queued on the child's copy before
    finally:
        os.kill(child, signal.SIGKILL)
