"""Signals as events of a selector loop: a signal writes its number to a socket the loop
polls, so handlers never run loop code re-entrantly (the daemon and the hosts use it)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterable

_write_ends: list[socket.socket] = []  # signal.set_wakeup_fd needs them open for good


def signal_socket(signums: Iterable[signal.Signals]) -> socket.socket:
    """A socket that becomes readable when any of ``signums`` arrives; read it with
    :func:`received`."""
    read_end, write_end = socket.socketpair()
    read_end.setblocking(False)
    write_end.setblocking(False)
    signal.set_wakeup_fd(write_end.fileno(), warn_on_full_buffer=False)
    for signum in signums:
        signal.signal(signum, lambda *_: None)
    _write_ends.append(write_end)
    return read_end


def received(sock: socket.socket) -> set[int]:
    try:
        return set(sock.recv(4096))
    except BlockingIOError:
        return set()
