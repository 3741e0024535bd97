"""Signals as events of a selector loop: a signal writes its number to a socket the loop
polls, so handlers never run loop code re-entrantly (the daemon and the hosts use it)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterable

_write_ends: list[socket.socket] = []  # signal.set_wakeup_fd needs them open for good
_handled: set[int] = set()  # the signals signal_socket took over


def signal_socket(signums: Iterable[signal.Signals]) -> socket.socket:
    """A socket that becomes readable when any of ``signums`` arrives; read it with
    :func:`received`."""
    read_end, write_end = socket.socketpair()
    read_end.setblocking(False)
    write_end.setblocking(False)
    signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)
    for signum in signums:
        signal.signal(signum, lambda *_: None)
        _handled.add(signum)
    _write_ends.append(write_end)
    return read_end


def detach_in_child() -> None:
    """In a forked child that a user may signal (it takes their identity): no signal it
    gets may reach the parent's loop, whose wakeup socket it shares, and every signal has
    its default action again (SIGHUP too, which the daemon and hosts ignore). Without
    this, a SIGTERM to the child would stop its parent."""
    signal.set_wakeup_fd(-1)
    for signum in (*_handled, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)


def received(sock: socket.socket) -> set[int]:
    try:
        return set(sock.recv(4096))
    except BlockingIOError:
        return set()
