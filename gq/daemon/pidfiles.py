"""Pidfile locks: "is a daemon (or a device's execution host) running here?" never trusts a
stale pid.

The daemon holds an exclusive ``flock`` on ``daemon.pid`` for its whole life, and each host
on ``hosts/<device>.pid``; only their own user can open them (mode 0600), so only it can
test the locks, and nobody else can hold one to keep a daemon from starting. A daemon that
stops removes its pidfile while it still holds the lock, so no stale pid is left to read
(one killed leaves its file, which names no live holder: harmless).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import IO

from gq.daemon import forked
from gq.errors import AlreadyRunning
from gq.home import Home


def acquire_pidfile(home: Home) -> IO[str]:
    """Lock and fill the pidfile; keep the returned file open for the daemon's lifetime and
    give it back with :func:`release_pidfile`."""
    while True:
        # Only the daemon's own user may open it: anyone who can open a file can flock it,
        # and a lock held by someone else would keep the daemon from starting.
        fd = os.open(
            home.daemon_pidfile, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        os.fchmod(fd, 0o600)
        handle = os.fdopen(fd, "r+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise AlreadyRunning(running_pid(home)) from None
        if _still_named(handle, home.daemon_pidfile):
            break
        # A stopping daemon removed the file after this one was opened: its lock proves
        # nothing (a daemon starting now locks the new file), so take that one.
        handle.close()
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    forked.keep_from_children(handle.fileno())  # the lock dies with the daemon
    return handle


def release_pidfile(home: Home, handle: IO[str]) -> None:
    """Remove the pidfile, then drop its lock: a daemon that has stopped leaves no pid."""
    try:
        if _still_named(handle, home.daemon_pidfile):
            home.daemon_pidfile.unlink()
    except OSError:
        pass  # left in place: without its lock held it names no daemon
    finally:
        forked.let_go(handle.fileno())
        handle.close()


def _still_named(handle: IO[str], path: Path) -> bool:
    """Whether ``path`` still names the open file ``handle`` (not removed, nor replaced)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


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
