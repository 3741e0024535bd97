"""The daemon's request socket: accepts clients, reads one request line each without ever
blocking the daemon's loop, takes the caller's identity from the kernel (SO_PEERCRED), hands
the line to the dispatcher, and writes the answer back (with any descriptors it carries).

What one client can cost everyone is bounded: a client that sends nothing (or reads no
answer) for ``idle`` seconds is dropped; one whose request passes the request size gets an
error answer and is dropped; a uid with its limit of connections open, or a new client once
the daemon has its total, is answered with an error and closed at once (the daemon keeps
accepting, so nobody else waits behind them). None of them delays other clients.

A request read is not served at once: requests ready together are served one a turn of the
loop, in :class:`gq.daemon.serving.turns.Turns`' order (the uid that has used the least of the loop
lately first), so that a uid that sends many waits behind those that send few.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gq import defaults, messages
from gq.daemon import forked
from gq.daemon.serving.access import Caller
from gq.daemon.serving.turns import Turns
from gq.home import Home

log = logging.getLogger("gq.daemon")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid

# What an answer that comes later waits for (gq wait's Waiting, gq submit --test-only's
# WhatIf): dispatch returns it, and ``park`` takes it.
Later = TypeVar("Later")
# dispatch(caller, line) -> (answer line, descriptors to pass with it), or what the answer
# waits for: it comes later, through Server.reply, from whoever ``park`` hands it to.
Dispatch = Callable[[Caller, bytes], "tuple[bytes, list[int]] | Later"]


@dataclass(frozen=True)
class ConnectionLimits:
    per_user: int = defaults.MAX_CONNECTIONS_PER_USER
    total: int = defaults.MAX_CONNECTIONS
    request: int = defaults.MAX_REQUEST  # bytes in one request line
    idle: float = defaults.CONNECTION_IDLE  # seconds a client may stay silent


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    caller: Caller
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    request: bytes = b""  # its request, read and waiting for its turn
    outbox: memoryview = memoryview(b"")  # what is left to send: each send takes a slice
    fds: list[int] = field(default_factory=list)
    answered: bool = False
    waiting: bool = False  # its answer comes later: no deadline, nothing more is read


class Server(Generic[Later]):
    def __init__(
        self,
        home: Home,
        selector: selectors.BaseSelector,
        dispatch: Dispatch[Later],
        identify: Callable[[int, int, int], Caller],
        limits: ConnectionLimits = ConnectionLimits(),
        park: Callable[[Connection, Later], None] | None = None,
    ):
        self.home = home
        self.limits = limits
        self.idle = limits.idle
        self.selector = selector
        self.dispatch = dispatch
        self.identify = identify
        self.park = park  # takes the connections whose answer comes later
        self.connections: set[Connection] = set()
        self.per_uid: dict[int, int] = {}
        self.turns: Turns[Connection] = Turns()  # the requests read and not yet served
        self.listener = listen(home)
        selector.register(self.listener, selectors.EVENT_READ, self)

    def close(self, unlink: bool) -> None:
        for connection in list(self.connections):
            self._drop(connection)
        self.selector.unregister(self.listener)
        forked.let_go(self.listener.fileno())
        self.listener.close()
        if unlink:
            try:
                self.home.socket.unlink()
            except FileNotFoundError:
                pass

    def accept(self) -> None:
        """Take every waiting client (the listener is readable)."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the others get served first
                log.warning("cannot accept a client: %s", exc)
                return
            sock.setblocking(False)
            pid, uid, gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
            refusal = self._over_limit(uid)
            if refusal is not None:
                _refuse(sock, refusal)
                continue
            connection = Connection(
                sock, self.identify(pid, uid, gid), time.monotonic() + self.idle
            )
            self.connections.add(connection)
            self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
            self.selector.register(sock, selectors.EVENT_READ, connection)
            self.service(connection, selectors.EVENT_READ)  # its request is usually there

    def _over_limit(self, uid: int) -> str | None:
        """Why a new connection of ``uid`` is refused, if it is."""
        if self.per_uid.get(uid, 0) >= self.limits.per_user:
            return (
                f"uid {uid} has {self.limits.per_user} connections to the daemon open "
                "(its limit, --max-connections-per-user); close some and try again"
            )
        if len(self.connections) >= self.limits.total:
            return (
                f"the daemon has {self.limits.total} clients connected (its limit, "
                "--max-connections); try again shortly"
            )
        return None

    def service(self, connection: Connection, mask: int) -> None:
        """Read a request or write an answer; a connection whose handling fails is dropped
        (logged), so that it cannot fail again at every turn of the loop."""
        try:
            if mask & selectors.EVENT_READ and not connection.answered:
                self._read(connection)
            if connection in self.connections and mask & selectors.EVENT_WRITE:
                self._write(connection)
        except Exception:  # noqa: BLE001 - one client must not cost the daemon its loop
            log.exception("error serving uid %d; dropping its connection", connection.caller.uid)
            self._drop(connection)

    def serve(self) -> None:
        """Serve the request whose turn it is, if one is ready: one a turn of the loop, so
        that one read meanwhile from a uid that has used less of the loop goes next."""
        taken = self.turns.take(time.monotonic())
        if taken is None:
            return
        uid, connection = taken
        line, connection.request = connection.request, b""
        connection.waiting = False
        began = time.monotonic()
        try:
            result = self.dispatch(connection.caller, line)
            if not isinstance(result, tuple) and self.park is not None:
                connection.waiting, connection.deadline = True, math.inf
                self.park(connection, result)
                return
            if not isinstance(result, tuple):
                result = messages.encode(messages.Error("this daemon answers no wait", 1)), []
            self._answer(connection, *result)
        except Exception:  # noqa: BLE001 - one client must not cost the daemon its loop
            log.exception("error serving uid %d; dropping its connection", uid)
            self._drop(connection)
        finally:
            self.turns.charge(uid, time.monotonic() - began, time.monotonic())

    def finish(self, connection: Connection) -> None:
        """A waiting connection answered by someone else (a listing's child): closed."""
        self._drop(connection)

    def expire(self, now: float) -> None:
        """Drop clients that sent no request, or read no answer, in time."""
        for connection in [c for c in self.connections if now > c.deadline]:
            log.info(
                "dropping uid %d's connection: idle for %g s", connection.caller.uid, self.idle
            )
            self._drop(connection)

    def next_deadline(self) -> float | None:
        return min((c.deadline for c in self.connections), default=None)

    def reply(self, connection: Connection, line: bytes) -> None:
        """The answer to a waiting connection's request."""
        if connection in self.connections:
            connection.waiting = False
            self._answer(connection, line, [])

    def _read(self, connection: Connection) -> None:
        try:
            chunk = connection.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk or connection.waiting:  # gone, or saying more than its one request
            self._drop(connection)
            return
        connection.inbox += chunk
        if self._over_buffer(connection):
            connection.inbox.clear()
            self._answer(
                connection,
                messages.encode(
                    messages.Error(
                        f"uid {connection.caller.uid} has over "
                        f"{defaults.MAX_BUFFERED_PER_USER} bytes of requests in flight; refused"
                    )
                ),
                [],
            )
            return
        newline = connection.inbox.find(b"\n")
        if newline < 0 or newline > self.limits.request:
            if len(connection.inbox) > self.limits.request:
                connection.inbox.clear()
                self._answer(
                    connection,
                    messages.encode(
                        messages.Error(
                            f"request over {self.limits.request} bytes (the daemon's "
                            "--max-request); refused"
                        )
                    ),
                    [],
                )
            return
        connection.request = bytes(connection.inbox[:newline])
        connection.inbox.clear()
        # It waits for its turn (no idle deadline: the daemon is the one that is slow), and
        # anything more its client sends, or its going, drops it as a waiting one's does.
        connection.waiting, connection.deadline = True, math.inf
        self.turns.add(connection.caller.uid, connection)

    def _answer(self, connection: Connection, line: bytes, fds: list[int]) -> None:
        connection.answered = True
        connection.outbox, connection.fds = memoryview(line), fds  # no copy for each send
        connection.deadline = time.monotonic() + self.idle
        self.selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._write(connection)
        if connection in self.connections and self._over_buffer(connection):
            log.warning(
                "dropping uid %d's connection: its clients leave over %d bytes of answers unread",
                connection.caller.uid,
                defaults.MAX_BUFFERED_PER_USER,
            )
            self._drop(connection)

    def _over_buffer(self, connection: Connection) -> bool:
        """Whether the daemon holds more than its share of bytes for this connection's uid:
        requests still arriving and answers its clients do not read, on all its connections."""
        uid = connection.caller.uid
        held = sum(
            len(c.inbox) + len(c.request) + len(c.outbox)
            for c in self.connections
            if c.caller.uid == uid
        )
        return held > defaults.MAX_BUFFERED_PER_USER

    def _write(self, connection: Connection) -> None:
        try:
            if connection.fds:
                sent = socket.send_fds(connection.sock, [connection.outbox], connection.fds)
                self._close_fds(connection)
            else:
                sent = connection.sock.send(connection.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(connection)
            return
        connection.outbox = connection.outbox[sent:]
        if not connection.outbox:
            self._drop(connection)

    def _drop(self, connection: Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            uid = connection.caller.uid
            self.turns.remove(uid, connection)  # (if its request waits for its turn)
            self.per_uid[uid] -= 1
            if not self.per_uid[uid]:
                del self.per_uid[uid]
        self._close_fds(connection)
        try:
            self.selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

    @staticmethod
    def _close_fds(connection: Connection) -> None:
        for fd in connection.fds:
            os.close(fd)
        connection.fds = []


def _refuse(sock: socket.socket, why: str) -> None:
    """Answer a connection the daemon will not serve with the reason, and close it."""
    try:
        sock.send(messages.encode(messages.Error(why, 1)))
    except OSError:
        pass
    sock.close()


def listen(home: Home) -> socket.socket:
    """Bind the socket: 0666 for the node's users in system mode, 0600 for its owner else."""
    path = home.socket
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o111 if home.system else 0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o666 if home.system else 0o600)
    sock.listen(defaults.LISTEN_BACKLOG)
    sock.setblocking(False)
    forked.keep_from_children(sock.fileno())  # no connection waits on a child of the daemon
    return sock
