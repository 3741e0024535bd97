"""The worker's end of its wire to its host, in the job's own process.

A job may run under any Python 3 (a user's venv) that finds gq alone on its path and none
of gq's dependencies (see gq.daemon.supervision.launch_specs.gq_only_path), so this end speaks the
framing with the standard library: what it says is a line ``{"kind": ..., fields...}`` of
:mod:`gq.exec.job.messages`, where each message is defined once and whence the host
decodes it (protocol.FROM_WORKER), every field checked; what it hears is the host's Go.
tests/test_wire.py checks that every line this end can write decodes there, and that this
end reads every Go the host can send.
"""

from __future__ import annotations

import socket
import threading
from typing import NamedTuple

from gq import defaults, jsonline


def line(kind: str, **fields: object) -> bytes:
    """One message of the worker's, as the host reads it."""
    return jsonline.line({"kind": kind, **fields})


READY = line("ready")


class Grant(NamedTuple):
    """The host's Go: the lane is the job's until its release."""

    empty_cache: bool = False  # give back cached device memory at its release
    mem_cap: int | None = None  # from now on: its probe's figure (a CUDA job's cap)
    lease: int = 0  # nonzero: the lane is its own across boundaries until asked back
    hand_over: bool = False  # at its release: the Done carries an event, sent at once
    after: str | None = None  # the previous holder's event (hex): its stream waits on it


class WorkerChannel:
    """The worker's socket to its host: it sends what workers send and receives its
    grants, blocking. Two of the job's threads may send (a Done the device held back goes
    from the thread that waited for it): each line goes whole."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._sending = threading.Lock()
        self._buffer = bytearray()

    def send(self, kind: str, **fields: object) -> bool:
        """Send one message; False when the host has gone."""
        try:
            self.send_line(line(kind, **fields))
            return True
        except OSError:
            return False

    def send_line(self, data: bytes) -> None:
        """A line encoded once, ahead (the worker's READY)."""
        with self._sending:
            self.sock.sendall(data)

    def receive_grant(self) -> Grant:
        """Block until the host's Go. EOFError if the host has gone, ConnectionError if
        what it sent is not a Go (the host sends nothing else)."""
        while (newline := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > defaults.MAX_FRAME:
                raise ConnectionError("gq: the execution host sent a line over the frame")
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the peer closed the connection")
            self._buffer += chunk
        text = self._buffer[:newline].decode("utf-8", "replace")
        del self._buffer[: newline + 1]
        try:
            go = jsonline.loads(text)
        except (ValueError, RecursionError):
            go = None
        if not isinstance(go, dict) or go.get("kind") != "go":
            kind = go.get("kind") if isinstance(go, dict) else text[:40]
            raise ConnectionError(f"gq: the execution host sent {kind!r}, not a grant")
        fields = {name: go[name] for name in Grant._fields if name in go}
        return Grant(**fields)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
