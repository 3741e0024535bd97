"""The wire between the daemon, the execution hosts and the workers: how their messages
travel. Every message is a msgspec struct defined once, used by both ends, checked field by
field on decode (see :mod:`gq.codec`), framed as one line of JSON ``{"kind": KIND,
fields...}`` (the client wire's framing, without its version) of at most
``defaults.MAX_FRAME`` bytes, which both ends enforce. The messages themselves are in
:mod:`gq.exec.host.messages` (daemon ↔ host, host → client) and
:mod:`gq.exec.job.messages` (worker ↔ host); this module holds the tables of what each
end receives, the framing and the channels, and where a host's sockets are.

daemon → host   Hello, Launch, Kill, Update, Cap, Suspend, SignalGroup, SetPolicy, Shares,
                Ack, Drain, Shutdown
host → daemon   State (answers Hello), Started, LaunchFailed, Exited (repeated in every
                State until acknowledged), Progress
worker → host   Ready, Done, Drained, Total, StepsTaken, OutOfMemory, Finished
host → worker   Go
host → client   TerminalHandedOver (an interactive job's terminal, its descriptor beside it)

A peer whose line fails to decode loses its channel and nothing else: a worker's job ends
FAILED naming the message, a daemon is dropped (the host runs on), a host is attached
again (its jobs run on). A host and a daemon of different ``HOST_VERSION`` still understand
Hello, State (a foreign one in full where it still fits this schema, else only for its
version, pid and draining flag) and Drain: the daemon then drains the host (no new jobs; it
exits after its last one), adopting its jobs where it could read them, and starts a new one
once it has gone. A host from before this framing spells a kind "op": the daemon greets and
drains every host so, and speaks so to one whose State came so (Channel.as_before).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

from gq import codec, defaults, jsonline
from gq.codec import MessageError, Wire
from gq.exec.host.messages import (
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
    Shares,
    Shutdown,
    SignalGroup,
    Started,
    State,
    Suspend,
    TerminalHandedOver,
    Update,
)
from gq.exec.job.messages import Done, Drained, Finished, Go, OutOfMemory, Ready, StepsTaken, Total

log = logging.getLogger(__name__)


def host_paths(state_dir: str, device: str) -> tuple[str, str]:
    """The pidfile and socket of a device's execution host."""
    return os.path.join(state_dir, f"{device}.pid"), os.path.join(state_dir, f"{device}.sock")


def terminal_socket(directory: str, job: int) -> str:
    """Where an interactive job's host offers its terminal to the submitter's gq."""
    return os.path.join(directory, f"{job}.sock")


# ----- what each end receives ---------------------------------------------------------
TO_HOST = Wire(
    Hello, Launch, Kill, Update, Cap, Suspend, SignalGroup, SetPolicy, Shares, Ack, Drain, Shutdown
)
TO_DAEMON = Wire(State, Started, LaunchFailed, Exited, Progress)
FROM_WORKER = Wire(Ready, Done, Drained, Total, StepsTaken, OutOfMemory, Finished)
TO_WORKER = Wire(Go)
TO_CLIENT = Wire(TerminalHandedOver)
_FOREIGN_STATE = Wire(ForeignState)


# ----- framing ------------------------------------------------------------------------
# Hello and Drain as hosts of every version read them, the kind spelt "op" as the framing
# before this one did: a daemon greets and drains a host so, whatever its version, and a
# host of another version is then drained and replaced (its State read as far as it can).
_AS_EVERY_HOST_READS = {Hello: b'{"op":"hello"}\n', Drain: b'{"op":"drain"}\n'}
_FROM_ANY_DAEMON = {line.rstrip(): cls for cls, line in _AS_EVERY_HOST_READS.items()}


def encode(message: Any, as_before: bool = False) -> bytes:
    """One line ``{"kind": ..., fields...}``; FrameTooLarge past the frame limit.
    ``as_before``: for a host of the framing before this one, which reads ``{"op": ...}``
    (what a daemon sends a draining host keeps that host's schema: a kill, an ack)."""
    special = _AS_EVERY_HOST_READS.get(type(message))
    if special is not None:
        return special
    if not as_before:
        return codec.encode(message, defaults.MAX_FRAME)
    data = {"op": message.kind, **codec.fields_of(message)}
    return codec.frame(data, message.kind, defaults.MAX_FRAME)


def decode(line: bytes, wire: Wire) -> Any:
    """The message a line holds, every field checked; MessageError otherwise. A host's
    State of another version is read as far as this version can (see _from_another_host)."""
    return read(line, wire)[0]


def read(line: bytes, wire: Wire) -> tuple[Any, bool]:
    """:func:`decode`'s message, and whether its sender framed it as before this framing
    (then it reads that framing only: see :func:`encode`)."""
    if wire is TO_HOST and line in _FROM_ANY_DAEMON:
        return _FROM_ANY_DAEMON[line](), False
    try:
        return wire.decode(line), False
    except MessageError:
        foreign = _from_another_host(line) if wire is TO_DAEMON else None
        if foreign is None:
            raise
        return foreign


def _from_another_host(line: bytes) -> tuple[Any, bool] | None:
    """What a host of another version said, where it did not decode as this version's:
    anything it says, once its kind is spelt as this framing spells it (a host from before
    this framing spelt it "op"); its State read in full where it fits this schema (its jobs
    are then adopted while it drains), else only for its version, pid and draining flag.
    Also whether it spoke the framing before this one. None for anything else."""
    try:
        data = jsonline.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    as_before = "op" in data and "kind" not in data
    kind = data.get("op") if as_before else data.get("kind")
    if not isinstance(kind, str):
        return None
    if not as_before and (kind != "state" or data.get("version") == HOST_VERSION):
        return None  # this framing's: malformed
    said = _respelt(data, kind)
    if kind == "state" and isinstance(said.get("exited"), list):
        said["exited"] = [_respelt(item, "exited") for item in said["exited"]]
    # Written back for the decoder: a number JSON cannot spell (1e999 reads as inf) or a
    # depth Python cannot write refuses the line, as any malformed line.
    try:
        return TO_DAEMON.decode(jsonline.line(said)), as_before
    except (MessageError, ValueError, RecursionError):
        if kind != "state":
            return None
    minimal = {key: data[key] for key in ("version", "pid", "draining") if key in data}
    try:
        return _FOREIGN_STATE.decode(jsonline.line({"kind": "state", **minimal})), as_before
    except (MessageError, ValueError, RecursionError):
        return None


def _respelt(data: Any, kind: str) -> Any:
    """A message of the framing before this one, which spelt its kind "op"."""
    if not isinstance(data, dict):
        return data
    return {"kind": kind, **{k: v for k, v in data.items() if k not in ("op", "kind")}}


class Channel:
    """A framed, typed view of one connected stream socket: it sends the messages of one
    side and receives ``kinds``. The first line that fails to decode ends the channel
    (``error`` says why): framing, and trust in the peer, are lost with it."""

    def __init__(self, sock: socket.socket, kinds: Wire, chunk: int = 1 << 16):
        self.sock = sock
        self.kinds = kinds
        self.chunk = chunk  # bytes read each time the socket polls readable
        self._buffer = bytearray()
        self.closed = False
        self.error: str | None = None
        self.as_before = False  # the peer is a host of the framing before this one

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any) -> bool:
        """Send a whole message; False when the peer has gone. A message over the frame
        limit raises FrameTooLarge and sends nothing."""
        line = encode(message, self.as_before)
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
                message, as_before = read(line, self.kinds)
            except MessageError as exc:
                self._fail(f"{exc} in {_quote(line)}")
                return
            self.as_before = self.as_before or as_before
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


def _quote(line: bytes) -> str:
    """A bad line as a log or a job's reason may quote it: short, printable."""
    text = line[:120].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return repr(text + ("..." if len(line) > 120 else ""))
