"""How other processes find and wake the daemon: its pidfile lock and its poke socket.

The daemon holds an exclusive ``flock`` on ``daemon.pid`` for its whole life, so "is it
running?" never trusts a stale pid. Pokes are datagrams on ``daemon.sock``: fire and forget,
so a CLI never blocks on a busy or absent daemon (the daemon also polls the queue).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from typing import IO

from gq.home import Home


class AlreadyRunning(Exception):
    def __init__(self, pid: int | None):
        super().__init__(f"gq daemon is already running (pid {pid})")
        self.pid = pid


def acquire_pidfile(home: Home) -> IO[str]:
    """Lock and fill the pidfile; keep the returned file open for the daemon's lifetime."""
    handle = open(home.daemon_pidfile, "a+")
    os.chmod(home.daemon_pidfile, 0o600)
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
    """The live daemon's pid, or None when no daemon holds the lock."""
    try:
        handle = open(home.daemon_pidfile)
    except FileNotFoundError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = handle.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def bind_poke_socket(home: Home) -> socket.socket:
    path = home.daemon_socket
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    sock.setblocking(False)
    return sock


def poke(home: Home, what: bytes = b"wake") -> bool:
    """Best effort: tell the daemon the queue changed. False if no daemon listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.sendto(what, str(home.daemon_socket))
        return True
    except OSError:
        return False
    finally:
        sock.close()
