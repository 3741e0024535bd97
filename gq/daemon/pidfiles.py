"""Pidfile locks: "is a daemon (or a device's execution host) running here?" never trusts a
stale pid.

The daemon holds an exclusive ``flock`` on ``daemon.pid`` for its whole life, and each host
on ``hosts/<device>.pid``; only their own user can open them (mode 0600), so only it can
test the locks, and nobody else can hold one to keep a daemon from starting.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import IO

from gq.errors import AlreadyRunning
from gq.home import Home


def acquire_pidfile(home: Home) -> IO[str]:
    """Lock and fill the pidfile; keep the returned file open for the daemon's lifetime."""
    # Only the daemon's own user may open it: anyone who can open a file can flock it, and
    # a lock held by someone else would keep the daemon from starting.
    fd = os.open(home.daemon_pidfile, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    handle = os.fdopen(fd, "r+")
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


def _holder_says(path: Path) -> str | None:
    """What a pidfile says while a live process holds its lock; None when none does."""
    try:
        handle = open(path)
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return None
    with handle:  # closing it drops the shared lock taken to test
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return handle.read()
        return None


def _pid(text: str | None) -> int | None:
    """The pid a held pidfile starts with (a locked, empty one names no process to signal)."""
    first = (text or "").split()[:1]
    return int(first[0]) if first and first[0].isdigit() and int(first[0]) > 0 else None


def readable(home: Home) -> bool:
    """Whether the caller may test the daemon's lock (its own user may; others ask it)."""
    return os.access(home.daemon_pidfile, os.R_OK) or not home.daemon_pidfile.exists()


def running_pid(home: Home) -> int | None:
    """The live daemon's pid; None when no daemon holds the lock."""
    return _pid(_holder_says(home.daemon_pidfile))


def live_hosts(home: Home) -> list[int]:
    """The pids of the execution hosts that run (hold their pidfile), with or without a
    daemon."""
    pids = (_pid(_holder_says(path)) for path in sorted(home.hosts.glob("*.pid")))
    return [pid for pid in pids if pid is not None]
