"""Listings too big to make in the daemon's loop (more than ``defaults.LIST_INLINE`` jobs:
``gq status -r`` of a big array, ``gq status --all --json``), made in forked children.

Made in the loop, a listing of 10,000 array tasks held it for half a second or more
(reading the rows, building the records and encoding 12 MB, in about equal parts), and
everyone's request waited behind it. A child instead reads the queue on a connection of its
own, in one read transaction (one snapshot, so the answer lists no job twice and misses
none, as one made in the loop), writes the answer to the client's socket itself and exits;
the loop only forks it and learns from its pipe's end that it has ended.

A uid has one child at a time, and all uids ``defaults.LISTING_CHILDREN``; a uid's other
big listings wait (their connections parked, as gq wait's are), the uids taking turns by how
much listing time each has used lately, so one user's flood of listings queues behind
itself. A child yields the CPUs (``defaults.LISTING_NICE``), lives no longer than a client
waits for an answer (an alarm ends it), and gives up on a client that reads nothing for the
connection idle time.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gq import defaults, messages, wakeup
from gq.daemon.serving.turns import Turns

if TYPE_CHECKING:
    from gq.daemon.serving.server import Connection, Server

log = logging.getLogger("gq.daemon")
_REPORT = 1 << 14  # bytes of a child's failure kept for the log (within a pipe's buffer)
_SEND = 1 << 20  # bytes a child hands the socket at once


@dataclass
class Listing:
    """A ListJobs too big to answer in the loop: answered by a listing child."""

    uid: int
    request: messages.ListJobs


@dataclass(eq=False)
class ListingChild:
    pid: int
    pipe: int  # its end closes when the child exits; a failure's traceback comes first
    connection: Connection
    uid: int
    started: float
    report: bytearray = field(default_factory=bytearray)


class Lister:
    def __init__(
        self,
        selector: selectors.BaseSelector,
        make: Callable[[messages.ListJobs], bytes],
        server: Server,
    ):
        self.selector = selector
        self.make = make  # (in the child) the answer line
        self.server = server  # whose parked connections the children answer
        self.waiting: Turns[tuple[Connection, Listing]] = Turns()
        self.children: dict[int, ListingChild] = {}
        self.closing = False

    def park(self, connection: Connection, listing: Listing) -> None:
        # Those of the uid's clients that went away while their listings waited are
        # forgotten first: what waits for one uid is bounded by its connections.
        self.waiting.prune(listing.uid, lambda waiting: waiting[0] in self.server.connections)
        self.waiting.add(listing.uid, (connection, listing))
        self._start_due()

    def receive(self, child: ListingChild) -> None:
        """A child's pipe is readable: what it reports; at its end, the child collected
        and the next listing started."""
        try:
            chunk = os.read(child.pipe, _REPORT)
        except BlockingIOError:
            return
        if chunk:
            child.report += chunk[: _REPORT - len(child.report)]
            return
        self._end(child)
        self._start_due()

    def close(self) -> None:
        self.closing = True
        for child in list(self.children.values()):
            _kill(child.pid)
            self._end(child)

    def _start_due(self) -> None:
        while len(self.children) < defaults.LISTING_CHILDREN and self.waiting:
            running = Counter(child.uid for child in self.children.values())
            busy = {u for u, n in running.items() if n >= defaults.LISTING_CHILDREN_PER_USER}
            taken = self.waiting.take(time.monotonic(), skip=busy)
            if taken is None:
                return  # only uids with their children running have listings waiting
            connection, listing = taken[1]
            if connection in self.server.connections:  # (its client may have gone)
                self._fork(connection, listing)

    def _fork(self, connection: Connection, listing: Listing) -> None:
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            log.warning("cannot fork a listing for uid %d: %s", listing.uid, exc)
            error = messages.Error(
                f"the daemon cannot start a listing now ({exc.strerror}); try again", 1
            )
            self.server.reply(connection, messages.encode(error))
            return
        # Forked outside any transaction of the daemon's (between requests): SQLite's
        # record of the locks this process holds, which the child inherits, then says none,
        # and the child's own connection takes its locks for itself.
        if pid == 0:  # the child: answer, leave without running any clean-up
            code = 1
            try:
                os.close(read_end)
                wakeup.detach_in_child()
                signal.alarm(math.ceil(defaults.CLIENT_TIMEOUT))
                os.nice(defaults.LISTING_NICE)
                code = self._answer(connection, listing.request, write_end)
            finally:
                os._exit(code)
        os.close(write_end)
        os.set_blocking(read_end, False)
        child = ListingChild(pid, read_end, connection, listing.uid, time.monotonic())
        self.children[pid] = child
        self.selector.register(read_end, selectors.EVENT_READ, child)

    def _answer(self, connection: Connection, request: messages.ListJobs, report: int) -> int:
        """In the child: the listing, sent; its exit status."""
        try:
            line = self.make(request)
        except Exception:  # noqa: BLE001 - the client gets an error answer; the log, why
            os.write(report, traceback.format_exc().encode()[-_REPORT:])
            line = messages.encode(
                messages.Error("the daemon failed on this list request; its log has the details", 1)
            )
        # A timeout, not blocking: the descriptor's flags are the daemon's too, and its loop
        # must never block on it.
        connection.sock.settimeout(self.server.idle)
        view = memoryview(line)
        try:
            while view:
                view = view[connection.sock.send(view[:_SEND]) :]
        except OSError:  # its client went away, or read nothing for the idle time
            return 1
        return 0

    def _end(self, child: ListingChild) -> None:
        """Collect a child that has ended (or been killed) and close its client's
        connection; the time it took counts against its uid's turns."""
        del self.children[child.pid]
        self.selector.unregister(child.pipe)
        os.close(child.pipe)
        _, status = os.waitpid(child.pid, 0)
        now = time.monotonic()
        self.waiting.charge(child.uid, now - child.started, now)
        if child.report:
            log.error(
                "a listing for uid %d failed: %s",
                child.uid,
                child.report.decode(errors="replace").strip(),
            )
        elif os.WIFSIGNALED(status) and not self.closing:
            log.warning(
                "a listing for uid %d was ended by signal %d (as one that outlives the "
                "%g s a client waits for its answer is)",
                child.uid,
                os.WTERMSIG(status),
                defaults.CLIENT_TIMEOUT,
            )
        self.server.finish(child.connection)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
