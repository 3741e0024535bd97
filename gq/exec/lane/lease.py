"""The page an execution host shares with each of its workers: a job that has its lane to
itself keeps it across iteration boundaries without a message (a **lease**).

A READY/GO exchange costs a wait until the host process is scheduled, twice: on a busy node
most of a boundary's cost. A job alone on its lane needs no decision at its boundaries, so
the host grants it the lane with a numbered lease (``Go(lease=N)``: the page's ``lease``
word says N, and the host has let go of the lock the page carries); the worker takes the
lock as the Go arrives, notes N on its page, and from then on crosses boundaries in memory
and two system calls:

- **Who holds the lane** is an advisory lock (``flock``) on the page's file. The worker
  takes it without blocking when an iteration begins and lets it go at the iteration's end;
  the host takes it, without blocking, to end the lease in a gap. The kernel keeps the
  lock, not the page, so nothing a job writes can make the host's call abort or hang, and a
  job that dies lets go of it. The host opens the file anew (its own open file description):
  its lock and the worker's are two owners.
- **Someone else wants the lane**: the host clears ``lease`` and tries to take the lock.
  Taken where the page notes the lease (the worker took it up, and is now in its gap), the
  lease is over and the lane is the host's at once: the job's next acquire finds the word
  cleared, or the lock taken, and asks with READY. Not taken, the job is inside an
  iteration: it sees the cleared word at that iteration's end and says so with a Done; the
  host also tries the lock again at every turn of its loop, so a job that wrote the word
  back keeps the lane for no longer than that iteration. Taken where the page does not note
  the lease yet, the Go is still on its way, or the job's take failed: its first iteration
  is a plain grant, ended by its Done (the host keeps the lock and waits for that).
- **Jobs beside a slice**: under fair the lease may be a slice of lane time beside the jobs
  it alternates with; the host says so on the page (``pace``), and the worker then waits at
  each release for the iteration before to have run on its device (alone it runs ahead, its
  device never idle while it queues): one iteration's work is queued behind the one running
  at most, so its device does not run a queue far longer than the slice once it is asked
  back, and a hand-over at the slice's end still has a tail to overlap. A job that clears the
  word runs ahead as if alone: the queue it leaves is its own lane time (the lock, or its
  tail, is the job's until its device has run it), and bounded as any hold (--max-hold).
- **A run's end**: a lease for a person's run of turns (gq.exec.lane.rule.PeopleTurns) says
  when the run is over (``until``, monotonic ns); the worker begins no iteration under it
  from then on and asks with READY, so the run does not go on into the iteration the host
  would otherwise catch it inside. A worker that takes no notice is asked back as any
  lease is, billed the overrun.
- **Figures** (steps, iterations, memory) are written by the worker under a sequence count
  (odd while it writes) and read by the host when it reports progress or ends the lease.
  They are the worker's word and checked (:func:`implausible`); a worker that writes
  impossible ones loses its job and nothing else. **Time is not its word**: a lease is
  billed its wall time as the host saw it begin and end (a job alone on its lane has it
  for all of that time, as an allocation is billed on a cluster), so a page that claims
  little time inside iterations costs no one else anything.

The page is a sealed memfd (it cannot be shrunk under the host's mapping, which would make
the host's next read a SIGBUS). Only the host writes ``lease``; a job that writes it harms
at most its own lease, since the lock, not the word, says who holds the lane.
"""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import time
from dataclasses import dataclass

from gq.exec.lane.device_sync import DeviceWork
from gq.validation import INT64_MAX

PAGE_SIZE = mmap.PAGESIZE
# The page as 64-bit words (native order: both ends are on one machine).
_LEASE = 0  # the host's word: nonzero while the lane is offered to the job across boundaries
_PACED = 1  # the host's: nonzero while jobs wait beside the lease, a slice at a time
_UNTIL = 2  # the host's: the monotonic ns after which no iteration begins under it (0: none)
_SEQUENCE = 8  # the worker's: a sequence count, then its figures
_BODY = slice(_SEQUENCE + 1, _SEQUENCE + 7)
_READ_TRIES = 50  # a sequence count still odd after these: read again another time
_SHORTEST_ITERATION_NS = 1_000  # a boundary alone costs a worker more than this
_TAKE = fcntl.LOCK_EX | fcntl.LOCK_NB


def _sealed_page(name: str) -> int:
    """A page-sized memfd, close-on-exec, that no one can shrink or grow."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, PAGE_SIZE)
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _take(fd: int) -> bool:
    """The lock, without waiting; any error means "not taken"."""
    try:
        fcntl.flock(fd, _TAKE)
    except OSError:
        return False
    return True


def _give(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass


@dataclass(frozen=True)
class Figures:
    """What a worker wrote on its page: counts since it started."""

    steps: int = 0
    iterations: int = 0  # iterations run under leases
    mem_persistent: int = -1  # -1: not measured
    mem_peak: int = -1
    steps_at_take: int = 0  # the step count when its last leased iteration began
    lease: int = 0  # the lease it took up last (its Go's number)


class SharedPage:
    """One worker's page: made by the host (``create``), which keeps a descriptor of its
    own to lock it with, and mapped by the worker (``attach``), which keeps the one it was
    given. Read and written a 64-bit word at a time: a word's store is one machine store,
    and costs no packing on every iteration's path."""

    def __init__(self, fd: int):
        self.fd = fd
        self.map = mmap.mmap(fd, PAGE_SIZE)
        self.words = memoryview(self.map).cast("q")

    @classmethod
    def create(cls) -> tuple[SharedPage, int]:
        """The host's page, the lane's lock held by the host, and the descriptor to place
        in the job (close-on-exec; a separate open file description from the host's own)."""
        fd = _sealed_page("gq-lane")
        try:
            own = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        except BaseException:
            os.close(fd)
            raise
        try:
            page = cls(own)
            if not _take(own):
                raise OSError("the lane's lock could not be taken on a new page")
        except BaseException:
            os.close(own)
            os.close(fd)
            raise
        page.write(0, _nothing_yet())  # a fresh page's zeros would read as memory measured
        return page, fd

    @classmethod
    def attach(cls, fd: int) -> SharedPage:
        """The worker's mapping of the page its host made (the descriptor is kept: its
        lock is taken through it)."""
        return cls(fd)

    def close(self) -> None:
        self.words.release()
        self.map.close()
        os.close(self.fd)

    # ----- the lane --------------------------------------------------------------------
    def try_take(self) -> bool:
        return _take(self.fd)

    def give(self) -> None:
        _give(self.fd)

    def offer(self, number: int) -> None:
        """The host's side: the lane is the job's across boundaries (``number`` > 0) or
        wanted back (0). Written before the lock is let go, and before it is tried."""
        self.words[_LEASE] = number

    def offered(self) -> int:
        return self.words[_LEASE]

    def pace(self, paced: bool) -> None:
        """The host's side: jobs wait beside the lease it offers next, for a slice each
        (gq.exec.lane.rule.sliced): its worker keeps no more than an iteration's work on
        its device, so that a slice of lane time is one of device time too."""
        self.words[_PACED] = 1 if paced else 0

    def paced(self) -> bool:
        return bool(self.words[_PACED])

    def run_until(self, until_ns: int) -> None:
        """The host's side: the lease it offers next is for a run of lane time that ends at
        ``until_ns`` (time.monotonic_ns; 0: for as long as the host leaves it): its worker
        begins no iteration under it from then on, and asks with READY instead."""
        self.words[_UNTIL] = until_ns

    # ----- figures -----------------------------------------------------------------------
    def sequence(self) -> int:
        """The worker's count of writes (odd while it writes)."""
        return self.words[_SEQUENCE]

    def read(self) -> Figures | None:
        """The worker's figures, or None while it is writing them (read again later)."""
        for _ in range(_READ_TRIES):
            before = self.sequence()
            if before & 1:
                continue
            values = self.words[_BODY].tolist()
            if self.sequence() == before:
                return Figures(*values)
        return None

    def write(self, sequence: int, values: array.array) -> None:
        """The worker's side: ``values`` (64-bit) in the order of :class:`Figures`;
        ``sequence`` is even, twice the count of writes so far."""
        words = self.words
        words[_SEQUENCE] = sequence + 1
        words[_BODY] = values
        words[_SEQUENCE] = sequence + 2


def implausible(seen: Figures, now: Figures, lease_base: Figures, lease_ns: int) -> str | None:
    """What is impossible in a worker's figures, given those read before (``seen``), those
    at its lease's start and how long the lease has lasted; None if nothing is."""
    for name in ("steps", "iterations"):
        before, after = getattr(seen, name), getattr(now, name)
        if not before <= after <= INT64_MAX:
            return f"{name} went from {before} to {after}"
    if min(now.mem_persistent, now.mem_peak) < -1 or now.steps_at_take < 0:
        return "a negative figure"
    iterations = now.iterations - lease_base.iterations
    if iterations > lease_ns // _SHORTEST_ITERATION_NS + 1:
        return f"{iterations} iterations in a lease of {lease_ns / 1e9:.3f} s"
    return None


# Where each figure sits in a worker's list of them (the order of Figures' fields).
_STEPS, _ITERATIONS, _PERSISTENT, _PEAK, _STEPS_AT_TAKE, _LEASE_TAKEN = range(6)


def _nothing_yet() -> array.array:
    """A worker's figures before its first write: nothing counted, no memory measured."""
    values = array.array("q", [0] * len(Figures.__dataclass_fields__))
    values[_PERSISTENT] = values[_PEAK] = -1
    return values


class WorkerLease:
    """The worker's side of its page: whether it holds a lease, and its figures (written
    whole at each boundary). This is every iteration's path, run between the script's own
    work, where each call costs several times what it does in a tight loop: few calls."""

    def __init__(self, page: SharedPage, device: DeviceWork | None = None):
        self.page = page
        self.device = device or DeviceWork()  # the lock is let go once it has run the work
        self.active = False  # inside an iteration taken under the lease
        self.values = _nothing_yet()
        self._sequence = 2  # the host wrote the first

    def _count(self, steps: int) -> int:
        """The count the page says: never less than it said (the worker's count falls as
        it moves to a better place to count at, module calls to optimizer steps, which a
        host reads as impossible), as the host keeps a Done's count."""
        return max(steps, self.values[_STEPS])

    def _write(self) -> None:
        self.page.write(self._sequence, self.values)
        self._sequence += 2

    def granted(self, number: int, steps: int) -> None:
        """A Go with lease ``number`` arrived: the iteration it grants holds the lane's lock,
        noted on the page (where the lock is not free, it is a plain grant: a Done ends it)."""
        if not self.page.try_take():
            return
        self.active = True
        self.values[_LEASE_TAKEN] = number
        self.values[_STEPS] = self.values[_STEPS_AT_TAKE] = self._count(steps)
        self._write()

    def gives(self, pending) -> bool:
        """Whether a give the device held back is this lease's lock."""
        return pending == self.page.give

    def take(self, steps: int, kept: bool = False) -> bool:
        """At an acquire: the next iteration begins without asking where the lane is
        offered and its lock is free (the host has not taken it back); else ask with
        READY. ``kept``: the last release's lock is held still (the device was busy then,
        and the give was taken back)."""
        page = self.page
        words = page.words
        until = words[_UNTIL]
        over = until and time.monotonic_ns() >= until  # the run it was leased for is over
        if kept:
            if not words[_LEASE] or over:  # ... and the host wants the lane back
                self.hand_back()
                return False
        elif over or words[_LEASE] != self.values[_LEASE_TAKEN] or not page.try_take():
            return False  # asked back, or a lease it never took up
        self.active = True
        self.values[_STEPS] = self.values[_STEPS_AT_TAKE] = self._count(steps)
        self._write()
        return True

    def release(self, steps: int, persistent: int | None, peak: int | None) -> bool:
        """At a leased iteration's end: its figures, and the lane let go once the device
        has run the iteration's work (meanwhile the job runs on). False if the host wants
        the lane back: the worker says so with a Done, and lets the lock go once its device
        is done (:meth:`hand_back`, or after a hand-over's event: gq.exec.lane.handover)."""
        values = self.values
        values[_STEPS] = self._count(steps)
        values[_ITERATIONS] += 1
        values[_PERSISTENT] = -1 if persistent is None else persistent
        values[_PEAK] = -1 if peak is None else peak
        page = self.page
        page.write(self._sequence, values)
        self._sequence += 2
        self.active = False
        if not page.words[_LEASE]:
            return False
        self.device.then(page.give)
        return True

    def lapse(self) -> bool:
        """Between iterations, give up a lease still offered (a statement's end: a person's
        pause is no iteration of the lane's): True where it was, which the worker tells the
        host with a Done once its lock is let go; its next acquire asks with READY."""
        number = self.values[_LEASE_TAKEN]
        if self.active or not number or self.page.words[_LEASE] != number:
            return False
        self.values[_LEASE_TAKEN] = 0
        return True

    def hand_back(self) -> None:
        """Let the lock go now, once the device has run what the job queued (whatever the
        wait raises: a lock kept would keep the lane from every other job)."""
        try:
            self.device.finish()
        finally:
            self.page.give()
