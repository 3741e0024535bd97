"""Files the daemon opens on a user's behalf (a job's output for an operator's ``gq logs``),
opened with the job owner's rights, never root's. (Snapshots are the daemon's own files.)

A root daemon forks a short-lived child that takes the owner's groups, gid and uid, opens
the path with ``O_NOFOLLOW | O_NOCTTY | O_NONBLOCK`` (no link is followed at its last
component, no terminal becomes the daemon's, no FIFO makes it wait), checks that it is a
regular file, and passes the descriptor back over a socket pair; the daemon waits for it a
bounded time. So a planted link, a FIFO, a terminal or a directory closed to the owner
gives the caller nothing the owner could not have, and cannot stall or capture the daemon.
A daemon that runs as the owner (personal mode) opens the file itself, the same way.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import time
from dataclasses import dataclass

from gq import defaults, wakeup

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    groups: tuple[int, ...]


class NotRegular(OSError):
    """The path names something other than a regular file."""


def open_as(path: str, owner: Owner, timeout: float = defaults.OPEN_AS_OWNER_TIMEOUT) -> int:
    """A read-only descriptor of the regular file at ``path`` as ``owner`` may open it.
    Raises OSError (FileNotFoundError, PermissionError, NotRegular, TimeoutError, ...)."""
    if (owner.uid, owner.gid) == (os.geteuid(), os.getegid()):
        return _open_regular(path)
    if os.geteuid() != 0:
        raise PermissionError(errno.EPERM, "the daemon cannot take another user's rights")
    parent_end, child_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: no logging, no locks, nothing but system calls, then _exit
        code = 0
        try:
            wakeup.detach_in_child()
            parent_end.close()
            # The owner's rights for the open (the file system checks the effective ids),
            # but root stays its real and saved uid: the owner cannot signal it, so cannot
            # stop it to hold the daemon up, nor kill it with the daemon's own handlers.
            os.setgroups(list(owner.groups))
            os.setresgid(-1, owner.gid, -1)
            os.setresuid(-1, owner.uid, -1)
            fd = _open_regular(path)
            socket.send_fds(child_end, [b"ok"], [fd])
        except NotRegular:
            child_end.send(b"not regular")
            code = 1
        except OSError as exc:
            child_end.send(f"{exc.errno or errno.EIO}".encode())
            code = 1
        finally:
            os._exit(code)
    child_end.close()
    try:
        return _receive(parent_end, path, timeout)
    finally:
        parent_end.close()
        _reap(pid)


def _open_regular(path: str) -> int:
    fd = os.open(path, _FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _receive(sock: socket.socket, path: str, timeout: float) -> int:
    sock.settimeout(timeout)
    try:
        data, fds, _, _ = socket.recv_fds(sock, 64, 1)
    except TimeoutError:
        raise TimeoutError(errno.ETIMEDOUT, f"opening took over {timeout:g} s", path) from None
    if data == b"ok" and fds:
        return fds[0]
    for fd in fds:
        os.close(fd)
    if data == b"not regular":
        raise NotRegular(errno.EINVAL, "not a regular file", path)
    number = int(data) if data.isdigit() else errno.EIO
    raise OSError(number, os.strerror(number), path)


_unreaped: list[int] = []  # children killed while stuck in the kernel: collected later


def _reap(pid: int) -> None:
    """Collect the child without ever blocking: one still stuck (in an open that hangs)
    is killed and collected by a later call."""
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
        time.sleep(0.001)
    else:
        os.kill(pid, signal.SIGKILL)
        _unreaped.append(pid)
    for stuck in list(_unreaped):
        try:
            if os.waitpid(stuck, os.WNOHANG)[0]:
                _unreaped.remove(stuck)
        except ChildProcessError:
            _unreaped.remove(stuck)
