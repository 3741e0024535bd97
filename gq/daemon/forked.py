"""What a child the daemon forks (a forecast, a big listing, a file opened as its owner)
must not keep: the lock on daemon.pid and the listening socket.

A forked child shares the daemon's open files until it exits, and such a child runs no
exec that would close them. One that outlived a killed daemon (a forecast at nice 10 on a
busy node takes seconds) stood in for it: its copy of the lock said the daemon still ran,
so that none could start, and clients queued on its copy of the socket until it ended. In
each child those descriptors are pointed at /dev/null as it starts, so that they keep their
numbers (the child's copies of the daemon's file objects stay valid) and hold nothing.
"""

from __future__ import annotations

import os

_kept: set[int] = set()


def keep_from_children(fd: int) -> None:
    """Let no child forked from now on hold ``fd``."""
    _kept.add(fd)


def let_go(fd: int) -> None:
    """``fd`` is about to be closed: its number may be reused for anything."""
    _kept.discard(fd)


def _in_child() -> None:
    if not _kept:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in _kept:
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_in_child)
