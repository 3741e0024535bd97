"""The page an execution host shares with each of its workers: a job that has its lane to
itself keeps it across iteration boundaries without a message (a **lease**).

A READY/GO exchange costs two system calls on each side and, worse, a wait until the host
process is scheduled: on a busy node that wait is most of a boundary's cost. A job alone on
its lane needs no decision at its boundaries, so the host grants it the lane with a lease
(``Go(lease=True)``), and from then on the worker crosses boundaries in memory alone:

- **Who holds the lane** is a process-shared POSIX semaphore on the page, taken and given
  without a system call while uncontended (``sem_trywait``/``sem_post``). The leased worker
  takes it when an iteration begins and gives it at the iteration's end; the host takes it
  to end the lease in a gap. Whoever holds it owns the lane, so the host never grants the
  lane to another job while the leased one is inside an iteration.
- **Someone else wants the lane**: the host writes ``want`` and tries to take the semaphore.
  Taken, the lease is over and the lane is the host's at once (the job was in its gap).
  Not taken, the job is inside an iteration: the worker sees ``want`` at that iteration's
  end and gives the lane back with a Done, exactly as without a lease. Either way the
  worker's next acquire goes through READY/GO again.
- **Figures** (steps, iterations, time inside and between iterations, memory) are written
  by the worker under a sequence count (odd while it writes) and read by the host when it
  reports progress or ends the lease. They are the worker's word: the host checks them
  (:func:`implausible`) as it checks any message, and a worker that writes impossible
  ones loses its job and nothing else.

The page also names the **hand-over** (:mod:`gq.exec.handover`) a holder is to make at its
release: the host's word, never read back by it.

**A lane lent to two jobs.** Two lane-mates whose iterations fit in each other's gaps meet
no choice of the policy's (:func:`gq.exec.lanes.lendable`): whoever asks first gets the
lane. The host then gives both a lease at once, under one **loan**: a page of its own with
one token, a process-shared semaphore the two take from each other (:class:`LoanPage`),
sent to the two of them and to no other job (``Lent``), and named on each one's page
(``lent``). A leased worker under a loan takes the token, then its own semaphore, when an
iteration begins, and gives them back in that order at its end; where the other holds the
token it waits for it (one wake-up, from the other's release: no host on the way), looking
at its own page every ``LOAN_WAIT_SLICE`` for the host's ``want``. The job granted the Go
that starts the loan holds the token; the other is offered its lease in its gap and takes
it up at its next acquire. The host ends a loan as it ends a lease, job by job (each own
semaphore says whether that job is inside an iteration), as soon as a third job asks,
either asks with READY, or anything else changes; a job that waited for an ended loan's
token never takes a later loan's, which has a page of its own.

A job reads its page's ``lent`` again once it holds its own semaphore: the host gives a job
in its gap its semaphore only after naming the new loan, so a job held up between its
checks and its semaphore, while the host ended its loan and made another, takes the new
loan's token, never the ended one's (whose number is never used again).

What a hostile job can do with its loan: give the token more often than it took it (or
write over a semaphore), or hold it without being inside an iteration. The first lets the
two iterate at once, which it can match by running outside its grants; the second makes the
other wait, as a long iteration would, until the host sees it (``LOAN_SILENT_LIMIT``). The
host watches the token (:meth:`LoanPage.count`, and the own semaphores) and, on any of
these, ends the loan and lends those two nothing more. Only the host writes the ``want``
and ``lent`` a job reads, so no job can start or prolong another's lease, and no job off
the loan can touch its token.

The page is a sealed memfd (it cannot be shrunk under the host's mapping). Times are on
the system-wide monotonic clock both processes share.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from gq import defaults
from gq.codec import INT64_MAX

PAGE_SIZE = mmap.PAGESIZE
# The page as 64-bit words (native order: both ends are on one machine).
_SEMAPHORE = 0  # bytes 0-63: a sem_t (32 bytes in glibc's 64-bit ABI)
_WANT = 8  # the host's word: nonzero while it wants the lane back
_SEQUENCE = 16  # the worker's: a sequence count, then its figures
_BODY = slice(_SEQUENCE + 1, _SEQUENCE + 12)
_HANDOVER = 32  # the host's word: the hand-over the holder makes at its release (0: none)
_HANDOVER_AFTER = 33  # the host's word: that hand-over is made at a release from then (ns)
_LENT = 40  # the host's word: the loan its lease is under (0: a lease of its own)
_READ_TRIES = 50  # a sequence count still odd after these: read again another time
# A lease's times may exceed its wall time by this much (the two clocks are read apart).
_SLACK_NS = 50_000_000
_SHORTEST_ITERATION_NS = 1_000  # a boundary alone costs a worker more than this

_libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL is kept; none of these blocks
_libc.sem_init.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint)
_libc.sem_init.restype = ctypes.c_int
# On every iteration's path: given the semaphore as a c_void_p, with no conversion of
# arguments and no errno kept (a failure says only "not taken").
_hot = ctypes.PyDLL(None)
_sem_trywait, _sem_post = _hot.sem_trywait, _hot.sem_post
_sem_getvalue = _hot.sem_getvalue
_sem_getvalue.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
# A wait for a loan's token blocks: CDLL lets the GIL go meanwhile (the job's other threads
# run on). The monotonic clock where the C library has sem_clockwait (glibc 2.30).
_waiting = ctypes.CDLL(None)
_LOAN_SLICE_NS = int(defaults.LOAN_WAIT_SLICE * 1e9)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_clockwait = getattr(_waiting, "sem_clockwait", None)
if _clockwait is not None:
    _clockwait.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_Timespec))
_timedwait = _waiting.sem_timedwait
_timedwait.argtypes = (ctypes.c_void_p, ctypes.POINTER(_Timespec))


def _wait_slice(semaphore: ctypes.c_void_p) -> bool:
    """Wait up to LOAN_WAIT_SLICE for the semaphore; True if taken."""
    if _clockwait is not None:
        deadline = divmod(time.monotonic_ns() + _LOAN_SLICE_NS, 1_000_000_000)
        return _clockwait(semaphore, time.CLOCK_MONOTONIC, _Timespec(*deadline)) == 0
    deadline = divmod(time.time_ns() + _LOAN_SLICE_NS, 1_000_000_000)
    return _timedwait(semaphore, _Timespec(*deadline)) == 0


def _count(semaphore: ctypes.c_void_p) -> int:
    value = ctypes.c_int()
    _sem_getvalue(semaphore, ctypes.byref(value))
    return value.value


def _sealed_page(name: str) -> int:
    """A page-sized memfd, close-on-exec, that no one can shrink or grow (a worker that
    shrank it would make the host's next read a SIGBUS)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, PAGE_SIZE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class Figures:
    """What a worker wrote on its page: counts since it started, times in nanoseconds."""

    steps: int = 0
    iterations: int = 0  # iterations run under leases
    attained_ns: int = 0  # their time inside iterations
    first_ns: int = 0  # its first leased iteration's length (0: none yet)
    gaps: int = 0
    gap_ns: int = 0  # time between a leased iteration's end and the next one's start
    mem_persistent: int = -1  # -1: not measured
    mem_peak: int = -1
    in_iteration: bool = False
    since_ns: int = 0  # when the current iteration (or gap) began
    steps_at_take: int = 0  # the step count when its last leased iteration began


class _Page:
    """A sealed page-sized memfd, mapped here, with a process-shared semaphore at its
    start, held as it is made."""

    _name = ""

    def __init__(self, fd: int):
        self.map = mmap.mmap(fd, PAGE_SIZE)
        self._anchor = ctypes.c_char.from_buffer(self.map)  # pins the map for the address
        self._semaphore = ctypes.c_void_p(ctypes.addressof(self._anchor) + _SEMAPHORE)

    @classmethod
    def create(cls):
        """A new page and its descriptor (close-on-exec: the host places it in the job, or
        sends it)."""
        fd = _sealed_page(cls._name)
        try:
            page = cls(fd)
        except BaseException:
            os.close(fd)
            raise
        if _libc.sem_init(page._semaphore, 1, 0) != 0:
            page.close()
            os.close(fd)
            raise OSError(ctypes.get_errno(), f"sem_init failed on a {cls._name} page")
        return page, fd

    @classmethod
    def attach(cls, fd: int):
        """The worker's mapping of the page its host made; the descriptor is closed."""
        try:
            return cls(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        del self._anchor
        self.map.close()

    def count(self) -> int:
        """Its semaphore's count: 0 while held."""
        return _count(self._semaphore)


class SharedPage(_Page):
    """One worker's page, mapped by the host (``create``) and by the worker (``attach``)."""

    _name = "gq-lane"

    def __init__(self, fd: int):
        super().__init__(fd)
        # Read and written a word at a time: a word's store is one machine store, and costs
        # no packing on every iteration's path.
        self.words = memoryview(self.map).cast("q")

    @classmethod
    def create(cls) -> tuple[SharedPage, int]:
        page, fd = super().create()
        page.write(0, _nothing_yet())  # a fresh page's zeros would read as memory measured
        return page, fd

    def close(self) -> None:
        self.words.release()
        super().close()

    # ----- the lane ------------------------------------------------------------------
    def try_take(self) -> bool:
        return _sem_trywait(self._semaphore) == 0

    def give(self) -> None:
        _sem_post(self._semaphore)

    def drain(self) -> None:
        """Take every count a worker left (given back after its lease ended): the next
        lease starts with the lane the host's."""
        for _ in range(64):  # a worker may post any number; the host never loops for ever
            if not self.try_take():
                return

    def want(self, wanted: bool) -> None:
        self.words[_WANT] = int(wanted)

    def wanted(self) -> bool:
        return self.words[_WANT] != 0

    def lend(self, loan: int) -> None:
        """Name the loan its next lease is under (0: none). Written before the job's
        semaphore is given to it: a job that has taken it reads this loan (and checks it
        then, as its earlier reads of the page may be from before)."""
        self.words[_LENT] = loan

    # ----- a hand-over (gq.exec.handover) ----------------------------------------------
    def arm(self, number: int, after_ns: int = 0) -> None:
        """Name the hand-over the holder makes at a release from ``after_ns`` on (0: none);
        the time is written first, as the holder reads the number first."""
        self.words[_HANDOVER_AFTER] = after_ns
        self.words[_HANDOVER] = number

    def armed(self) -> int:
        return self.words[_HANDOVER]

    def armed_after(self) -> int:
        return self.words[_HANDOVER_AFTER]

    # ----- figures -------------------------------------------------------------------
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
                values[_IN_ITERATION] = bool(values[_IN_ITERATION])
                return Figures(*values)
        return None

    def write(self, sequence: int, values: array.array) -> None:
        """The worker's side: ``values`` (64-bit) in the order of :class:`Figures`;
        ``sequence`` is even, twice the count of writes so far."""
        words = self.words
        words[_SEQUENCE] = sequence + 1
        words[_BODY] = values
        words[_SEQUENCE] = sequence + 2


class LoanPage(_Page):
    """A loan's token: a page the host makes (``create``; the token held, by the job granted
    the lane as the loan begins) and sends to the two jobs it lends the lane to, and to no
    other (``attach``). Its count is 1 while free, 0 while held; more only if a job gave it
    more often than it took it."""

    _name = "gq-loan"

    @property
    def token(self) -> ctypes.c_void_p:
        return self._semaphore


def implausible(seen: Figures, now: Figures, lease_base: Figures, lease_ns: int,
                now_ns: int) -> str | None:
    """What is impossible in a worker's figures, given those read before (``seen``), those
    at its lease's start and how long the lease has lasted; None if nothing is."""
    for name in ("steps", "iterations", "attained_ns", "gaps", "gap_ns"):
        before, after = getattr(seen, name), getattr(now, name)
        if not before <= after <= INT64_MAX:
            return f"{name} went from {before} to {after}"
    if min(now.mem_persistent, now.mem_peak) < -1 or now.first_ns < 0:
        return "a negative figure"
    if now.first_ns > now.attained_ns:
        return "a first iteration longer than all of them"
    iterations = now.iterations - lease_base.iterations
    if iterations > lease_ns // _SHORTEST_ITERATION_NS + 1:
        return f"{iterations} iterations in a lease of {lease_ns / 1e9:.3f} s"
    gaps = now.gaps - lease_base.gaps
    # A gap is counted as the iteration after it begins; a lease a loan offered in a gap
    # begins with a gap.
    if gaps > iterations + 1:
        return f"{gaps} gaps after {iterations} iterations"
    spent = (now.attained_ns - lease_base.attained_ns) + (now.gap_ns - lease_base.gap_ns)
    if spent > lease_ns + _SLACK_NS:
        return f"{spent / 1e9:.3f} s of iterations and gaps in a lease of {lease_ns / 1e9:.3f} s"
    if now.since_ns > now_ns:  # read after the page: anything the worker wrote is earlier
        return "an iteration that begins in the future"
    return None


# Where each figure sits in a worker's list of them (the order of Figures' fields).
(_STEPS, _ITERATIONS, _ATTAINED, _FIRST, _GAPS, _GAP, _PERSISTENT, _PEAK, _IN_ITERATION,
 _SINCE, _STEPS_AT_TAKE) = range(11)


def _nothing_yet() -> array.array:
    """A worker's figures before its first write: nothing counted, no memory measured."""
    values = array.array("q", [0] * len(Figures.__dataclass_fields__))
    values[_PERSISTENT] = values[_PEAK] = -1
    return values


class WorkerLease:
    """The worker's side of its page: whether it holds a lease, and its figures (written
    whole at each boundary). This is every iteration's path, run between the script's own
    work, where each call costs several times what it does in a tight loop: few calls."""

    def __init__(self, page: SharedPage):
        self.page = page
        self.active = False
        self.loan = 0  # the loan its lease is under (0: a lease of its own)
        self.token: ctypes.c_void_p | None = None  # that loan's token
        self.spent = 0  # the last loan it left: never taken up again
        self.loans: dict[int, LoanPage] = {}  # the pages of loans it has been sent
        self.fetch: Callable[[], None] | None = None  # reads what the host has sent
        self.values = _nothing_yet()
        self._sequence = 2  # the host wrote the first

    def lent(self, number: int, fd: int) -> None:
        """A loan's page came: kept until it leaves that loan, or a later one comes (the
        first one kept where one comes again under a number)."""
        try:
            page = LoanPage.attach(fd)
        except OSError:  # not mapped: offered that loan, it asks with READY instead
            return
        if number in self.loans:  # sent again: the one kept stays (its token may be in use)
            page.close()
            return
        self.loans[number] = page
        for older in [n for n in self.loans if n < number and n != self.loan]:
            self.loans.pop(older).close()

    def _join(self, loan: int) -> bool:
        """Take up a loan (0: a lease of its own); False if its page never came."""
        page = self.loans.get(loan)
        if loan and page is None:
            return False
        self.loan, self.token = loan, None if page is None else page.token
        return True

    def _leave(self) -> None:
        """Its lease is over: the next acquire asks with READY."""
        self.active = False
        if self.loan:
            self.spent = self.loan
            page = self.loans.pop(self.loan, None)
            if page is not None:
                page.close()
        self.loan, self.token = 0, None

    def released_unleased(self, now_ns: int) -> None:
        """A release said with a Done: a loan offered in the gap that follows counts that
        gap from here (on its page too: the host starts that lease there)."""
        self.values[_SINCE], self.values[_IN_ITERATION] = now_ns, 0
        self._write()

    def _offered(self) -> bool:
        """A loan the host has offered it in its gap (its page names one it has not left,
        and wants nothing): its lease begins."""
        loan = self.page.words[_LENT]
        if not loan or loan == self.spent:
            return False
        if loan not in self.loans and self.fetch is not None:
            self.fetch()  # sent before the page named it: in its socket now
        self.active = self._join(loan)
        return self.active

    def _wait_for_token(self, token: ctypes.c_void_p) -> bool:
        """The loan's token, while the other job holds it; False once the host wants the
        lane back or has lent it anew (its page names another loan)."""
        words = self.page.words
        while not words[_WANT] and words[_LENT] == self.loan:
            if _wait_slice(token):
                return True
        return False

    def _write(self) -> None:
        self.page.write(self._sequence, self.values)
        self._sequence += 2

    def granted(self, leased: bool, steps: int) -> None:
        """A Go arrived: with a lease, an iteration begins that holds the lane's semaphore
        as the host handed it over (and, under a loan, the loan's token)."""
        if not leased:
            self._leave()
            return
        # Under a loan whose page did not come, it runs this iteration alone (the other job
        # waits for a token it holds) and asks with READY next time.
        self.active = self._join(self.page.words[_LENT])
        values = self.values
        values[_IN_ITERATION], values[_SINCE] = 1, time.monotonic_ns()
        values[_STEPS] = values[_STEPS_AT_TAKE] = steps
        self._write()

    def take(self, steps: int) -> bool:
        """At an acquire: the next iteration begins without asking, unless the host wants
        the lane back (then the lease is over: ask with READY). Under a loan, the token
        first (waited for), then its own semaphore."""
        page = self.page
        words = page.words
        asked = 0
        while True:
            if words[_WANT]:
                if self.active:
                    self._leave()
                return False
            if self.active and words[_LENT] != self.loan:
                self._leave()  # its lease ended in its gap, unseen, and another is offered
            if not (self.active or self._offered()):
                return False
            token = self.token
            if token is not None and _sem_trywait(token) != 0:
                asked = asked or time.monotonic_ns()  # its gap ends here: waiting is no work
                if not self._wait_for_token(token):
                    self._leave()  # wanted back, or lent anew while it waited: look again
                    continue
            if not page.try_take():
                if token is not None:
                    _sem_post(token)
                self._leave()
                return False
            if words[_LENT] == self.loan:
                break
            # Its checks above saw a loan the host had ended; its semaphore was given for
            # the next one (given after that loan is named): under that one's token, then.
            page.give()
            if token is not None:
                _sem_post(token)
            self._leave()
        now = time.monotonic_ns()
        values = self.values
        values[_GAPS] += 1
        values[_GAP] += max(0, (asked or now) - values[_SINCE])
        values[_IN_ITERATION], values[_SINCE] = 1, now
        values[_STEPS] = values[_STEPS_AT_TAKE] = steps
        page.write(self._sequence, values)
        self._sequence += 2
        return True

    def release(self, steps: int, persistent: int | None, peak: int | None) -> bool:
        """At a release: the iteration's figures, and the lane given. False if the host
        wants it back: the lease is over, and the worker says so with its Done."""
        now = time.monotonic_ns()
        values = self.values
        length = max(0, now - values[_SINCE])
        values[_IN_ITERATION], values[_SINCE], values[_STEPS] = 0, now, steps
        values[_ITERATIONS] += 1
        values[_ATTAINED] += length
        values[_FIRST] = values[_FIRST] or length
        values[_PERSISTENT] = -1 if persistent is None else persistent
        values[_PEAK] = -1 if peak is None else peak
        page = self.page
        page.write(self._sequence, values)
        self._sequence += 2
        if self.token is not None:  # the token first: a job its host finds in its gap
            _sem_post(self.token)  # holds no token
        page.give()
        if page.words[_WANT]:
            self._leave()
        return self.active

    def note_steps(self, steps: int) -> bool:
        """Steps counted outside an iteration (a loop that runs released), on the page
        while the lease holds, written holding the lane (the host takes it to read a final
        page); False once the host wants the lane back (the lease is over: say them in a
        message, the page is read no more). Under a loan they go in a message too: its own
        semaphore taken outside an iteration would tell the host it is inside one."""
        if self.loan:
            return False
        if self.page.wanted() or not self.page.try_take():
            self._leave()
            return False
        self.values[_STEPS] = steps
        self._write()
        self.page.give()
        return True
