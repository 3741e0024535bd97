"""Wire protocol between daemon, execution hosts and workers.

Messages are single-line JSON objects with an ``op`` field, over Unix stream sockets.
A line longer than ``MAX_MESSAGE`` or one that is not a JSON object is a protocol error:
the reader drops it (and the connection, since framing is then lost) and logs it.

daemon → host   hello{} (answered by state), launch{job}, kill{job, why},
                update{job, priority, time_limit}, policy{name, fill}, ack{job, run},
                drain{}, shutdown{}
host → daemon   state{version, pid, policy, residents, exited}, started{job, run, pid},
                launch_failed{job, run, reason}, exited{job, run, code, signal, kill_why,
                end_time, progress...} (repeated in every state until acknowledged),
                progress{jobs: [...], switches: [per lane, since the host began]}
worker → host   ready{}, done{steps, mem_persistent, mem_peak}, total{steps}, progress{steps},
                finished{}
host → worker   go{empty_cache}

A host and a daemon of different ``HOST_VERSION`` still understand hello and state; the
daemon then drains the host (no new jobs; it exits after its last one) and starts a new one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

from gq import __version__

MAX_MESSAGE = 1 << 20
log = logging.getLogger(__name__)
# gq's version and that of the daemon-host protocol above (bump it on any change to it).
HOST_VERSION = f"{__version__}/1"


def host_paths(state_dir: str, device: str) -> tuple[str, str]:
    """The pidfile and socket of a device's execution host."""
    return os.path.join(state_dir, f"{device}.pid"), os.path.join(state_dir, f"{device}.sock")


class ProtocolError(Exception):
    pass


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {line[:80]!r}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError(f"not a message object: {line[:80]!r}")
    return message


class Channel:
    """A framed, buffered view of one connected stream socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict[str, Any]) -> bool:
        """Send a whole message; False when the peer has gone."""
        try:
            self.sock.sendall(encode(message))
            return True
        except OSError:
            self.closed = True
            return False

    def receive(self) -> Iterator[dict[str, Any]]:
        """After the socket polled readable: every whole message now buffered.

        Sets ``closed`` on end of file or a framing error (after yielding what was valid).
        """
        try:
            chunk = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
        self._buffer += chunk
        yield from self._drain()

    def _drain(self) -> Iterator[dict[str, Any]]:
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > MAX_MESSAGE:
                    log.warning("dropping connection: message over %d bytes", MAX_MESSAGE)
                    self._buffer.clear()
                    self.closed = True
                return
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            if len(line) > MAX_MESSAGE:
                log.warning("dropping oversized message (%d bytes)", len(line))
                continue
            try:
                yield decode(line)
            except ProtocolError as exc:
                log.warning("dropping malformed message: %s", exc)

    def receive_one(self) -> dict[str, Any]:
        """Block until one message arrives (worker side). Raises EOFError if the peer is gone."""
        while True:
            for message in self._drain():
                return message
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("execution host closed the connection")
            self._buffer += chunk

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
