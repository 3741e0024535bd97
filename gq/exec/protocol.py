"""The wire between the daemon, the execution hosts and the workers: how their messages
travel. Every message is a dataclass defined once, used by both ends, checked field by field
on decode (see :mod:`gq.codec`), framed as one line of JSON ``{"op": KIND, fields...}`` of at
most ``defaults.MAX_FRAME`` bytes, which both ends enforce. The messages themselves are in
:mod:`gq.exec.host_messages` (daemon ↔ host, host → client) and
:mod:`gq.exec.worker_messages` (worker ↔ host); this module holds the tables of what each
end receives, the framing and the channels, and where a host's sockets are.

daemon → host   Hello, Launch, Kill, Update, SetPolicy, Ack, Drain, Shutdown
host → daemon   State (answers Hello), Started, LaunchFailed, Exited (repeated in every
                State until acknowledged), Progress
worker → host   Ready, Done, Total, StepsTaken, OutOfMemory, Finished
host → worker   Go
host → client   TerminalHandedOver (an interactive job's terminal, its descriptor beside it)

A peer whose line fails to decode loses its channel and nothing else: a worker's job ends
FAILED naming the message, a daemon is dropped (the host runs on), a host is attached
again (its jobs run on). A host and a daemon of different ``HOST_VERSION`` still understand
Hello, State (a foreign one in full where it still fits this schema, else only for its
version, pid and draining flag) and Drain: the daemon then drains the host (no new jobs; it
exits after its last one), adopting its jobs where it could read them, and starts a new one
once it has gone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

from gq import codec, defaults
from gq.codec import MessageError
from gq.exec.host_messages import (
    HOST_VERSION,
    Ack,
    Cap,
    Drain,
    Exited,
    ForeignState,
    Hello,
    Kill,
    Launch,
    LaunchFailed,
    Progress,
    SetPolicy,
    Shutdown,
    SignalGroup,
    Started,
    State,
    Suspend,
    TerminalHandedOver,
    Update,
)
from gq.exec.worker_messages import Done, Finished, Go, OutOfMemory, Ready, StepsTaken, Total

log = logging.getLogger(__name__)


def host_paths(state_dir: str, device: str) -> tuple[str, str]:
    """The pidfile and socket of a device's execution host."""
    return os.path.join(state_dir, f"{device}.pid"), os.path.join(state_dir, f"{device}.sock")


def terminal_socket(directory: str, job: int) -> str:
    """Where an interactive job's host offers its terminal to the submitter's gq."""
    return os.path.join(directory, f"{job}.sock")


# ----- what each end receives ---------------------------------------------------------
def _table(*classes: type) -> dict[str, type]:
    return {cls.op: cls for cls in classes}


TO_HOST = _table(
    Hello, Launch, Kill, Update, Cap, Suspend, SignalGroup, SetPolicy, Ack, Drain, Shutdown
)
TO_DAEMON = _table(State, Started, LaunchFailed, Exited, Progress)
FROM_WORKER = _table(Ready, Done, Total, StepsTaken, OutOfMemory, Finished)
TO_WORKER = _table(Go)
TO_CLIENT = _table(TerminalHandedOver)


# ----- framing ------------------------------------------------------------------------
def encode(message: Any) -> bytes:
    """One line ``{"op": ..., fields...}``; FrameTooLarge past the frame limit."""
    data = {"op": message.op}
    data.update(codec.to_wire(message))
    return codec.dumps(data, defaults.MAX_FRAME)


def checked(message: Any) -> Any:
    """``message`` (or a record inside one) as its receiver will decode it, every field
    within its bounds; else MessageError. For messages built from what users gave (a
    launch) or from what a worker said (a report on its job): refused here, such a value
    costs its own job, not the receiver's trust in the whole channel."""
    return codec.build(
        type(message), codec.to_wire(message), getattr(message, "op", type(message).__name__)
    )


def decode(line: bytes, kinds: dict[str, type]) -> Any:
    """The message a line holds, every field checked; MessageError otherwise."""
    data = codec.loads(line)
    op = data.pop("op", None)
    if not isinstance(op, str) or op not in kinds:
        raise MessageError(f"unknown op {str(op)[:40]!r}")
    if kinds[op] is State and data.get("version") != HOST_VERSION:
        return _foreign_state(data)
    return codec.build(kinds[op], data, op)


def _foreign_state(data: dict[str, Any]) -> State | ForeignState:
    """The state of a host of another version: read in full where it still fits this
    version's schema (its jobs can then be adopted while it drains), else only for its
    version, pid and draining flag."""
    try:
        exited = [
            {k: v for k, v in item.items() if k != "op"} if isinstance(item, dict) else item
            for item in data.get("exited", [])
        ]
        return codec.build(State, {**data, "exited": exited}, "state")
    except (MessageError, TypeError, AttributeError):
        minimal = {key: data[key] for key in ("version", "pid", "draining") if key in data}
        return codec.build(ForeignState, minimal, "state")


class Channel:
    """A framed, typed view of one connected stream socket: it sends the messages of one
    side and receives ``kinds``. The first line that fails to decode ends the channel
    (``error`` says why): framing, and trust in the peer, are lost with it."""

    def __init__(self, sock: socket.socket, kinds: dict[str, type], chunk: int = 1 << 16):
        self.sock = sock
        self.kinds = kinds
        self.chunk = chunk  # bytes read each time the socket polls readable
        self._buffer = bytearray()
        self.closed = False
        self.error: str | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any) -> bool:
        """Send a whole message; False when the peer has gone. A message over the frame
        limit raises FrameTooLarge and sends nothing."""
        line = encode(message)
        try:
            self.sock.sendall(line)
            return True
        except OSError:
            self.closed = True
            return False

    def receive(self) -> Iterator[Any]:
        """After the socket polled readable: every whole message now buffered.

        Sets ``closed`` on end of file, and ``error`` too on a bad line (after yielding
        what came before it)."""
        try:
            chunk = self.sock.recv(self.chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
        self._buffer += chunk
        yield from self._drain()

    def _drain(self) -> Iterator[Any]:
        while not self.error:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > defaults.MAX_FRAME:
                    self._fail(f"a message over {defaults.MAX_FRAME} bytes")
                return
            if newline >= defaults.MAX_FRAME:
                self._fail(f"a message over {defaults.MAX_FRAME} bytes")
                return
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            try:
                message = decode(line, self.kinds)
            except MessageError as exc:
                self._fail(f"{exc} in {_quote(line)}")
                return
            yield message

    def _fail(self, why: str) -> None:
        self.error = why
        self.closed = True
        self._buffer.clear()

    def receive_one(self) -> Any:
        """Block until one message arrives. EOFError if the peer is gone, MessageError if
        what it sent is not a message."""
        while True:
            for received in self._drain():
                return received
            if self.error:
                raise MessageError(self.error)
            self.fill()

    def fill(self, flags: int = 0) -> None:
        """Read what the peer has sent (blocking unless ``flags`` say not to: then
        BlockingIOError if nothing came); EOFError if it is gone."""
        chunk = self._read(flags)
        if not chunk:
            raise EOFError("the peer closed the connection")
        self._buffer += chunk

    def _read(self, flags: int) -> bytes:
        return self.sock.recv(1 << 16, flags)

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


class WorkerChannel(Channel):
    """A worker's end of its socket to its host: it sends what workers send and receives
    its grants, blocking. Two of the job's threads may send (a Done the device held back
    goes from the thread that waited for it): each line goes whole."""

    def __init__(self, sock: socket.socket):
        super().__init__(sock, TO_WORKER)
        self._sending = threading.Lock()

    def send(self, message: Any) -> bool:
        with self._sending:
            return super().send(message)

    def send_line(self, line: bytes) -> None:
        """A line encoded once, ahead (the worker's READY)."""
        with self._sending:
            self.sock.sendall(line)


def _quote(line: bytes) -> str:
    """A bad line as a log or a job's reason may quote it: short, printable."""
    text = line[:120].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return repr(text + ("..." if len(line) > 120 else ""))
