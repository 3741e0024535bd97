"""A lane handed from job to job with one wake-up: the holder wakes the job that follows it.

Through the host, a contended switch costs two wake-ups in a row: the holder's DONE wakes
the host, whose GO wakes the next job. Where the host knows before the holder's release
which job the lane goes to next (the policy's pick at that release), it **arms** a
hand-over instead:

- each ordered pair of lane-mates gets a **pipe** (two socket pairs): a wake channel the
  holder writes to and the successor waits on, and a grant channel only the host writes
  to. The host sends the successor its ends (``Standby``) and the holder the wake channel's
  other end (``HandOver``), each while that job waits for the lane (never at a release);
- to arm a pipe (where the lane goes to that successor however long the holder's
  iteration lasts, from some point on: :func:`gq.exec.lanes.hand_over`), the host posts
  one byte down its grant channel and names the pipe, and that point, on the holder's
  page. At a release from that point on the holder writes one byte down the wake channel,
  before its DONE: the successor wakes, takes the grant's byte and runs, and the host is
  not on the way (at a release before it, the host decides as it reads the DONE);
- the host hears the DONE as before and **settles** the hand-over: where the successor has
  taken the grant, the lane is the successor's; else the host takes the grant back and
  grants the lane as usual (a Go: the holder did not wake it, or it is not awake yet). Each
  pipe is armed once; while the successor waits, the host sends it the pipe for the turn
  after (the same two jobs the other way round).
- the lane changes hands, in the host's books (and in each job's attained time), as the
  host reads the holder's DONE: on no job's word. A successor's grant is not dated from
  when it took it (its page could say): a hostile holder that woke it early and ran on
  would bill it for its own iteration, as the host reads nothing of the successor before
  the holder's DONE.

Until the successor takes it, the host can take the grant back (it reads the byte itself),
so it can change its mind whenever the policy's pick changes. One byte is read by one
reader: the host never grants the lane to two jobs.

What a hostile worker can do with this: a holder can wake a job that follows it early,
which it can already match by running outside its grants; it cannot grant anything (only
the host writes to a grant channel), and a byte down another pair's wake channel takes no
grant. A successor can take its grant early: the host still counts the lane as its
holder's until the holder's DONE, and reads nothing of the successor until then; where
that DONE comes before the point the hand-over was armed from, the lane is the
successor's only if the host's decision then is to grant it anyway: else one of the two
woke or took early, the successor runs outside its grants (booked nothing, granted
nothing until it asks again), and the host grants the lane as usual. Nothing a
worker does to its ends (flags, full buffers, closing them) can block the host, which
writes to no wake channel and sends and reads its grant channels with MSG_DONTWAIT, nor
raise SIGPIPE in a job (MSG_NOSIGNAL). A worker that does not read its socket has only its
own hand-overs fail (the host's send fails, and it loses its channel as with a Go).
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from gq import defaults
from gq.exec.lease import SharedPage
from gq.exec.protocol import Channel, Go, HandOver, Lent, Standby, WorkerChannel

_BYTE = b"\0"


# ----- the host's side ---------------------------------------------------------------
_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


@dataclass
class Pipe:
    """The two channels of one hand-over between two lane-mates, armed at most once."""

    number: int
    grant: socket.socket  # the host's end of the grant channel: it posts the grant there
    taken: socket.socket  # a copy of the successor's end: the host takes a grant back there


@dataclass
class Armed:
    """The hand-over armed on a lane: ``successor`` takes it at ``holder``'s release."""

    pipe: Pipe
    holder: int  # job ids
    successor: int
    after: float  # the holder hands over at a release from then on (monotonic)
    deferred: bool = False  # the successor's socket is not read until it is settled


def deliver(number: int, holder: Channel, successor: Channel, empty_cache: bool) -> Pipe | None:
    """A new pipe from ``holder`` to ``successor``, its ends sent to them; None if either
    channel would not take its message."""
    wake_successor, wake_holder = socket.socketpair()
    grant_successor, grant_host = socket.socketpair()
    # One way each: a successor writes to neither its predecessor nor the host.
    wake_successor.shutdown(socket.SHUT_WR)
    grant_successor.shutdown(socket.SHUT_WR)
    pipe = Pipe(number, grant_host, grant_successor)
    try:
        if (successor.send_with_descriptors(Standby(number, empty_cache),
                                            [wake_successor.fileno(), grant_successor.fileno()])
                and holder.send_with_descriptors(HandOver(number), [wake_holder.fileno()])):
            return pipe
        close(pipe)
        return None
    finally:
        wake_successor.close()
        wake_holder.close()


def arm(pipe: Pipe, holder_page: SharedPage, after: float) -> bool:
    """The successor's grant posted, then the holder told to hand over at a release from
    ``after`` on; False (nothing armed) if the grant could not be posted."""
    try:
        pipe.grant.send(_BYTE, _FLAGS)
    except OSError:  # its end shrunk to nothing, say: the lane goes through the host
        return False
    holder_page.arm(pipe.number, int(after * 1e9))
    return True


def take_back(armed: Armed, holder_page: SharedPage | None) -> bool:
    """Take the successor's grant back (True, and the hand-over is over), unless it has
    taken it already (False: the hand-over stands, settled at the holder's release)."""
    if not _take_grant_back(armed.pipe):
        return False
    if holder_page is not None:
        holder_page.arm(0)
    close(armed.pipe)
    return True


def settle(armed: Armed, holder_page: SharedPage | None) -> bool:
    """End an armed hand-over at the holder's release: True if the successor has taken its
    grant (the lane is its own, unless the release came before the point: Granter._settle);
    else the host has taken it back (the successor was not woken yet, or the holder did
    not wake it: the lane is granted the usual way, a Go)."""
    if holder_page is not None:
        holder_page.arm(0)
    try:
        return not _take_grant_back(armed.pipe)
    finally:
        close(armed.pipe)


def _close(ends) -> None:
    for end in ends:
        end.close()


def _take_grant_back(pipe: Pipe) -> bool:
    try:
        return pipe.taken.recv(1, socket.MSG_DONTWAIT) == _BYTE
    except BlockingIOError:  # the successor has read it
        return False


def close(pipe: Pipe) -> None:
    _close((pipe.grant, pipe.taken))


# ----- the worker's side -------------------------------------------------------------
def _wake(end: socket.socket) -> None:
    """One byte down a wake channel (a full one has woken its reader; a closed one has
    none left to wake)."""
    try:
        end.send(_BYTE, _FLAGS)
    except OSError:
        pass


class WorkerHandOvers:
    """A worker's hand-overs: as a successor, its wait for a grant; as a holder, the
    wake-up it gives at its release. Called under its session's lock."""

    def __init__(self, channel: WorkerChannel, page: SharedPage | None,
                 on_lent: Callable[[int, int], None] | None = None):
        self.channel = channel
        self.page = page
        self.on_lent = on_lent  # a loan's number and page (gq.exec.lease) go there
        # Its ends, by hand-over: as a successor, the wake and grant channels' (Standby).
        self.standbys: dict[int, tuple[Standby, socket.socket, socket.socket]] = {}
        self.wake_ends: dict[int, socket.socket] = {}  # as a holder (HandOver)
        self.made = 0  # the last hand-over it made as a holder
        self.early: list[Go] = []  # read at a release (the host's, out of turn): for the wait
        self.spent: tuple[socket.socket, ...] = ()  # the ends of its last hand-over
        # A forked child (a DataLoader worker) closes its copies of the ends: it neither
        # waits for the lane nor hands it over, and a copy would keep a channel open.
        os.register_at_fork(after_in_child=self._forget)

    def await_grant(self) -> Go:
        """After READY: the host's Go, or a grant handed over by the job before it."""
        _close(self.spent)
        self.spent = ()
        sock = self.channel.sock.fileno()
        if self.early:
            return self.early.pop(0)
        while True:
            received = self.channel.next_buffered()
            if received is not None:
                if isinstance(received[0], Go):
                    return received[0]
                self._keep(*received)
                continue
            if not self.standbys:
                self.channel.fill()
                continue
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            for _message, wake, _grant in self.standbys.values():
                poller.register(wake, select.POLLIN)
            woken = {fd for fd, _ in poller.poll()}
            for number, (_message, wake, _grant) in list(self.standbys.items()):
                if wake.fileno() in woken and (grant := self._woken_by(number)) is not None:
                    return grant
            if sock in woken:
                self.channel.fill()

    def _woken_by(self, number: int) -> Go | None:
        """Its wake channel ``number`` polled readable: a byte there is its hand-over, if
        the grant on that pipe is still there to take (else the host took it back). An end
        of file only says that its writers are gone."""
        message, wake, grant = self.standbys[number]
        try:
            woken = wake.recv(64, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        try:
            # Grant first: a host that finds this pipe closed takes the grant back.
            granted = bool(woken) and grant.recv(1, socket.MSG_DONTWAIT) == _BYTE
        except BlockingIOError:
            granted = False
        del self.standbys[number]
        if not granted:
            _close((wake, grant))
            return None
        self.spent = (wake, grant)  # closed at its next wait: not on the way to its iteration
        return Go(empty_cache=message.empty_cache)

    def _keep(self, message: object, descriptors: list[int]) -> None:
        """The ends of a pipe the host sent, kept for later (the oldest closed past the
        bound); a loan's page goes to the worker's lease."""
        if isinstance(message, Lent):
            if self.on_lent is not None:
                self.on_lent(message.number, descriptors[0])
            else:
                os.close(descriptors[0])
            return
        # Family and type named: else each end costs three system calls to find them out.
        ends = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, descriptor)
                for descriptor in descriptors]
        bound = defaults.HANDOVER_PIPES_KEPT
        if isinstance(message, Standby):
            wake, grant = ends
            self.standbys[message.number] = (message, wake, grant)
            while len(self.standbys) > bound:
                _message, *oldest = self.standbys.pop(next(iter(self.standbys)))
                _close(oldest)
        elif isinstance(message, HandOver):
            self.wake_ends[message.number] = ends[0]
            while len(self.wake_ends) > bound:
                self.wake_ends.pop(next(iter(self.wake_ends))).close()
        else:
            _close(ends)

    def _forget(self) -> None:
        for _message, *ends in self.standbys.values():
            _close(ends)
        _close([*self.wake_ends.values(), *self.spent])
        self.standbys.clear()
        self.wake_ends.clear()
        self.spent = ()

    def read_sent(self) -> None:
        """Take in what the host has sent, without waiting. A read stops after a message
        with descriptors, so it reads on until nothing is left (the host sends a few)."""
        for _ in range(4 * defaults.HANDOVER_PIPES_KEPT):
            try:
                self.channel.fill(socket.MSG_DONTWAIT)
            except (BlockingIOError, EOFError):
                break
        while (received := self.channel.next_buffered()) is not None:
            if isinstance(received[0], Go):
                self.early.append(received[0])
            else:
                self._keep(*received)

    def hand_over(self) -> None:
        """At a release, before the DONE: wake the successor the host armed, if any."""
        page = self.page
        if page is None:
            return
        number = page.armed()
        if number <= 0 or number == self.made or time.monotonic_ns() < page.armed_after():
            return  # none, made already, or too soon: the host decides
        self.made = number
        if number not in self.wake_ends:  # sent while it held the lane: read it now
            self.read_sent()
        wake = self.wake_ends.pop(number, None)
        if wake is not None:
            _wake(wake)
            wake.close()
