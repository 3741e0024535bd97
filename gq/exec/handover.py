"""A lane handed from job to job with one wake-up: the holder wakes the job that follows it.

Through the host, a contended switch costs two wake-ups in a row: the holder's DONE wakes
the host, whose GO wakes the next job. Where the host knows before the holder's release
which job the lane goes to next (the policy's pick if the holder released it now), it
**arms** a hand-over instead:

- a **pipe** per ordered pair of lane-mates: the host sends the read end to the job that
  may follow (``Standby``) and the write end to the job it may follow (``HandOver``), each
  with a message of its own, read while that job waits for the lane (never at a release).
  A job waiting after its READY waits on its socket and on every such read end;
- to arm a pipe, the host posts the grant semaphore on the successor's page and names the
  pipe on the holder's page, with the least length of iteration from which the lane goes
  to that successor (:func:`gq.exec.lanes.hand_over`: shorter, the policy may keep it for
  the holder). At its release the holder writes one byte there, before its DONE, if its
  iteration was that long: the successor wakes, takes its grant and runs, and the host is
  not on the way;
- the host hears the DONE as before and **settles** the hand-over: where it still picks the
  successor, or the successor has taken its grant, the lane is the successor's (the host
  writes the byte too, in case the holder did not); else it takes the grant back and
  grants the lane as usual. Each pipe is armed once; while the successor waits, the host
  sends it the pipe for the turn after (the same two jobs the other way round).

Until the successor takes it, the host can take the grant back (``sem_trywait``), so it
can change its mind whenever the policy's pick changes. Whoever takes the grant first
decides, atomically: the host never grants the lane to two jobs.

What a hostile worker can do with this: a holder can wake a job that may follow it early,
which it can already match by running outside its grants; it cannot grant anything (the
grant is on the other job's page, which it cannot reach), and a pipe is closed by its
reader after one wake-up. A job can take a grant it was not woken for, which is running
outside its grants again. A worker that does not read its socket has only its own
hand-overs fail (the host's send fails, and it loses its channel as with a Go).
"""

from __future__ import annotations

import os
import select
import socket
import time
from dataclasses import dataclass

from gq import defaults
from gq.exec.lease import SharedPage
from gq.exec.protocol import Channel, Go, HandOver, Standby, WorkerChannel

_WAKE = b"\0"


# ----- the host's side ---------------------------------------------------------------
@dataclass
class Pipe:
    """A pipe delivered to two lane-mates, not armed yet; the host keeps a write end."""

    number: int
    wake: int


@dataclass
class Armed:
    """The hand-over armed on a lane: ``successor`` takes it at ``holder``'s release."""

    pipe: Pipe
    holder: int  # job ids
    successor: int


def deliver(number: int, holder: Channel, successor: Channel, empty_cache: bool) -> Pipe | None:
    """A new pipe from ``holder`` to ``successor``, its ends sent to them; None if either
    channel would not take its message."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if (successor.send_with_descriptor(Standby(number, empty_cache), read_end)
                and holder.send_with_descriptor(HandOver(number), write_end)):
            return Pipe(number, write_end)
        os.close(write_end)
        return None
    finally:
        os.close(read_end)


def arm(pipe: Pipe, holder_page: SharedPage, successor_page: SharedPage, after: float) -> None:
    """The successor's grant posted, then the holder told to hand over once its iteration
    has lasted ``after`` seconds."""
    successor_page.post_grant(pipe.number)
    holder_page.arm(pipe.number, after)


def settle(armed: Armed, holder_page: SharedPage | None, successor_page: SharedPage | None,
           keep: bool) -> bool:
    """End an armed hand-over: with ``keep``, the successor has the lane (woken by the host
    if the holder did not); else the host takes its grant back. True if the lane is the
    successor's: kept, or its grant taken already."""
    if holder_page is not None:
        holder_page.arm(0)
    try:
        if keep and _wake(armed.pipe.wake):
            return True
        # Not kept, or its pipe has no reader: it woke and took its grant, or it dropped
        # the pipe (then the host takes the grant back, and grants the lane with a Go).
        return successor_page is not None and not successor_page.take_grant()
    finally:
        close(armed.pipe)


def close(pipe: Pipe) -> None:
    os.close(pipe.wake)


def _wake(descriptor: int) -> bool:
    """One byte down a pipe: False if nobody reads it any more."""
    try:
        os.write(descriptor, _WAKE)
    except BlockingIOError:  # full: a writer that is not the host filled it, and woke it
        pass
    except OSError:
        return False
    return True


# ----- the worker's side -------------------------------------------------------------
class WorkerHandOvers:
    """A worker's hand-overs: as a successor, its wait for a grant; as a holder, the
    wake-up it gives at its release. Called under its session's lock."""

    def __init__(self, channel: WorkerChannel, page: SharedPage | None):
        self.channel = channel
        self.page = page
        self.standbys: dict[int, tuple[Standby, int]] = {}  # with their read ends
        self.write_ends: dict[int, int] = {}
        self.made = 0  # the last hand-over it made as a holder
        self.granted_ns = 0  # when its current iteration was granted
        self.early: list[tuple[object, int | None]] = []  # read at a release, for the wait
        # A forked child (a DataLoader worker) keeps no pipe end: a copy of a read end would
        # hide from the host that the job itself has closed it.
        os.register_at_fork(after_in_child=self._forget)

    def await_grant(self) -> Go:
        """After READY: the host's Go, or a grant handed over by the job before it."""
        sock = self.channel.sock.fileno()
        while True:
            received = self.early.pop(0) if self.early else self.channel.next_buffered()
            if received is not None:
                if isinstance(received[0], Go):
                    self.granted_ns = time.monotonic_ns()
                    return received[0]
                self._keep(*received)
                continue
            if not self.standbys:
                self.channel.fill()
                continue
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            for _message, read_end in self.standbys.values():
                poller.register(read_end, select.POLLIN)
            woken = {fd for fd, _ in poller.poll()}
            for number, (_message, read_end) in list(self.standbys.items()):
                if read_end in woken and (grant := self._woken_by(number)) is not None:
                    return grant
            if sock in woken:
                self.channel.fill()

    def _forget(self) -> None:
        for _message, read_end in self.standbys.values():
            os.close(read_end)
        for write_end in self.write_ends.values():
            os.close(write_end)
        self.standbys.clear()
        self.write_ends.clear()

    def _woken_by(self, number: int) -> Go | None:
        """Its pipe ``number`` polled readable: a byte there is its hand-over if the grant
        on its page is posted for that pipe (then it is its own now). An end of file only
        says that its writers are gone, and a byte down another pipe is a job that may
        follow it waking it out of turn: a grant for another pipe is not its to take."""
        message, read_end = self.standbys[number]
        try:
            written = os.read(read_end, 64)
        except BlockingIOError:
            return None
        page = self.page
        # Grant first: a host that finds this pipe closed takes the grant back.
        granted = (bool(written) and page is not None and page.granted_for() == number
                   and page.take_grant())
        del self.standbys[number]
        os.close(read_end)
        if not granted:
            return None
        self.granted_ns = time.monotonic_ns()
        return Go(empty_cache=message.empty_cache)

    def _keep(self, message: object, descriptor: int | None) -> None:
        """A pipe end the host sent, kept for later (the oldest closed past the bound)."""
        if isinstance(message, Standby):
            kept: dict = self.standbys
            kept[message.number] = (message, descriptor)
        elif isinstance(message, HandOver):
            kept = self.write_ends
            kept[message.number] = descriptor
        else:
            return
        while len(kept) > defaults.HANDOVER_PIPES_KEPT:
            oldest = kept.pop(next(iter(kept)))
            os.close(oldest[1] if isinstance(oldest, tuple) else oldest)

    def _read_sent(self) -> None:
        """Take in what the host has sent, without waiting. A read stops after a message
        with a descriptor, so it reads on until nothing is left (the host sends a few)."""
        for _ in range(4 * defaults.HANDOVER_PIPES_KEPT):
            try:
                self.channel.fill(socket.MSG_DONTWAIT)
            except (BlockingIOError, EOFError):
                break
        while (received := self.channel.next_buffered()) is not None:
            if isinstance(received[0], Go):
                self.early.append(received)
            else:
                self._keep(*received)

    def hand_over(self) -> None:
        """At a release, before the DONE: wake the successor the host armed, if any."""
        page = self.page
        if page is None:
            return
        number, after = page.armed()
        if (number <= 0 or number == self.made
                or time.monotonic_ns() - self.granted_ns < after):
            return
        self.made = number
        if number not in self.write_ends:  # sent while it held the lane: read it now
            self._read_sent()
        write_end = self.write_ends.pop(number, None)
        if write_end is not None:
            _wake(write_end)
            os.close(write_end)
