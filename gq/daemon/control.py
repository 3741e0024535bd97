"""The daemon's pidfile lock: "is a daemon running here?" never trusts a stale pid.

The daemon holds an exclusive ``flock`` on ``daemon.pid`` for its whole life; anyone who can
read the file (everyone in system mode, its owner in personal mode) can test the lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import IO

from gq.errors import AlreadyRunning
from gq.home import Home


def acquire_pidfile(home: Home) -> IO[str]:
    """Lock and fill the pidfile; keep the returned file open for the daemon's lifetime."""
    handle = open(home.daemon_pidfile, "a+")
    os.chmod(home.daemon_pidfile, 0o644 if home.system else 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        handle.close()
        raise AlreadyRunning(running_pid(home)) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def running_pid(home: Home) -> int | None:
    """The live daemon's pid; None when no daemon holds the lock (or it has not yet written
    its pid: a locked, empty pidfile names no process to signal)."""
    try:
        handle = open(home.daemon_pidfile)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = handle.read().strip()
            return int(text) if text.isdigit() and int(text) > 0 else None
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None
