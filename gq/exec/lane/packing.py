"""Parallel lanes chosen by measurement (``--lanes auto``): whether a device's jobs take
turns on one lane or run at once on lanes of their own (Salus's lanes, Gandiva's packing
that measures whether it helped and undoes what did not). Pure: the host
(:mod:`gq.exec.lane.packing_moves`) feeds it what it saw and moves jobs as it plans.

What is measured is *work*: the lane seconds each job's iterations would take taking turns
(taking turns, the lane time the host billed it; side by side, the iterations it counted
there at the pace they took taking turns: :mod:`gq.exec.lane.packing_moves`).
Taking turns, a device does at most one second of work a second; jobs that leave it idle
(data loading, launch-bound loops, single-threaded ones on a many-core cpu) do more than
that side by side. So the jobs take turns while their work is measured, then run on lanes
of their own while it is measured again, and stay so only while the packed work beats the
turns' by :data:`GAIN`; under a policy that favours a job (srtf's shortest, deadline's
nearest, priority's high job) also only while no job does less than :data:`KEEP` of what
it did taking turns, so the favoured one is not slowed by more than a tenth to run the
rest. Under fifo, fair and rr the whole queue's work decides (fifo's head may be slowed
where that speeds the queue; with other work on the machine, a second job side by side
always takes some of the first's CPU). A packing that failed is tried again
after a back-off that doubles; one that pays is measured on, and measured afresh taking
turns when a job's rate drifts or every :data:`REMEASURE` seconds.

A job's own figures are never taken for its work past what the host observed: taking turns
its work is its lane time whatever its page counts (a count only moves its pace), and side
by side iterations beyond what the lane time it held there holds at that pace are not
believed. So a job that lies can claim at most the lane time it held as work; a count too
high taking turns makes its pace, and its work side by side, smaller (itself packed worse).

Side by side, a job's lane time is charged to its owner's fair share at the share of the
device it got (:func:`lane_share`): its work a lane second there, as measured over the last
window, against taking turns. The boundaries that work is counted from are the job's own
(its lease's page), so that share is never taken below an even split of the lanes.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

GAIN = 1.1  # packed work over the turns' work that keeps a packing
KEEP = 0.9  # ... while every job keeps this share of its own work taking turns
DRIFT = 0.5  # a job's packed rate that moves this much from its trial's: measure again
WINDOW = 1.5  # seconds a measurement lasts at least (a packing's: PACKED_WINDOW) ...
PACKED_WINDOW = 5.0
MIN_ITERATIONS = 3  # ... until its jobs have this many iterations each in it ...
WINDOW_MAX = 15.0  # ... or this long at most
BACKOFF_FIRST = 10.0  # seconds before a failed packing is tried again, doubled each time
BACKOFF_MAX = 600.0
REMEASURE = 300.0  # seconds a packing goes before it is measured against turns again
PERIOD = 0.5  # seconds between the host's looks at its jobs
# Policies whose favourite is kept (no job below KEEP of its own work).
FAVOURING = frozenset({"srtf", "deadline", "priority"})
MOST_SHOWN = 1e6  # a gain reported past this is reported as this (the wire's bound)
SOME_WORK = 0.01  # work a second taking turns below which no gain is reckoned
SOME_LANE_TIME = 0.1  # lane seconds in a window below which a job's pace is not reckoned


def most_lanes(cuda: bool) -> int:
    """The lanes a device may run at once: on a GPU, two (the driver time-slices their
    contexts); on the cpu device, one a core this host may use, up to four."""
    if cuda:
        return 2
    return max(1, min(4, len(os.sched_getaffinity(0))))


def lane_share(pace: float | None, running: int) -> float:
    """The share of the device a job side by side is charged its lane time at: ``pace``,
    its work a lane second there (1.0: as fast as taking turns, or alone), at most 1, and
    never under 1/``running`` (the jobs running at once on the device's lanes): the pace
    stands on the iterations its page counts, so a job that under-counts them is charged
    no less than an even split. Unknown (None): the whole lane time."""
    if pace is None:
        return 1.0
    return min(1.0, max(1.0 / max(1, running), pace))


def may_share(users: Iterable[str], mps: bool) -> bool:
    """Whether jobs of these owners may run side by side. Under MPS only one user's: classic
    MPS serves one user on a device at a time, so a job of another user is no MPS client
    there (gq.daemon.mps) and takes turns with the rest as it would without MPS."""
    return not mps or len(set(users)) <= 1


class Mode(enum.Enum):
    TURNS = "turns"  # every job on one lane
    TRIAL = "trial"  # jobs on lanes of their own, measured against the turns
    PACKED = "packed"  # the trial paid: kept, and measured on


class Verdict(enum.Enum):
    CHANGED = "changed"  # jobs came or went: measured afresh, taking turns
    MEASURED = "measured"  # the turns' work is known, and a packing may be tried
    PAID = "paid"
    FAILED = "failed"
    DRIFTED = "drifted"  # a rate moved, or it is time: the turns measured again


# What follows what: a mode and what a measurement found.
TRANSITIONS: dict[tuple[Mode, Verdict], Mode] = {
    (Mode.TURNS, Verdict.CHANGED): Mode.TURNS,
    (Mode.TURNS, Verdict.MEASURED): Mode.TRIAL,
    (Mode.TRIAL, Verdict.CHANGED): Mode.TURNS,
    (Mode.TRIAL, Verdict.PAID): Mode.PACKED,
    (Mode.TRIAL, Verdict.FAILED): Mode.TURNS,
    (Mode.PACKED, Verdict.CHANGED): Mode.TURNS,
    (Mode.PACKED, Verdict.PAID): Mode.PACKED,
    (Mode.PACKED, Verdict.FAILED): Mode.TURNS,
    (Mode.PACKED, Verdict.DRIFTED): Mode.TURNS,
}


@dataclass(frozen=True)
class Sample:
    """One job as its host sees it now: the work and iterations it vouches for since the
    job began (lane seconds at its timed pace; a job it has timed no pace of yet, fifo's
    second job say, the lane time it held: as if it ran at its alone speed, which only the
    other jobs' :data:`KEEP` then holds to account), and the device memory it may hold,
    resident and at its peak (None: unknown), and the lane time it was billed."""

    job: int
    work: float
    iterations: int
    persistent: int | None = None
    peak: int | None = None
    user: str = ""
    timed: bool = True  # its work is at a pace the host timed (else its lane time)
    billed: float = 0.0


@dataclass
class _Window:
    started: float
    work: dict[int, float]
    iterations: dict[int, int]
    billed: dict[int, float] = field(default_factory=dict)


@dataclass
class Packer:
    """One device's lanes: ``lanes`` that may run at once, ``memory`` bytes they share
    (None: no bound the host knows, as on the cpu device)."""

    lanes: int
    memory: int | None = None
    mode: Mode = Mode.TURNS
    jobs: frozenset[int] = frozenset()
    users: dict[int, str] = field(default_factory=dict)  # each job's owner
    mps: bool = False  # MPS serves the device: side by side only one user's jobs (may_share)
    # The policy favours a job (srtf, deadline, priority): no job may keep less than KEEP
    # of its own work. Under fifo, fair and rr the whole queue's work decides.
    favours: bool = False
    turns: dict[int, float] = field(default_factory=dict)  # work a second, taking turns
    packed: dict[int, float] = field(default_factory=dict)  # ... on lanes of their own
    gain: float | None = None  # the last packed work over the turns'
    # ... and the job that kept the least of its own work, with that share
    slowest: tuple[float, int] | None = None
    # Each job's work a lane second on lanes of their own, over the last window measured so
    # (none taking turns): what its lane time is charged at (lane_share).
    paces: dict[int, float] = field(default_factory=dict)
    retry_at: float = 0.0
    backoff: float = BACKOFF_FIRST
    packed_since: float = 0.0
    last: Verdict | None = None  # what the last measurement found (for gq info)
    _window: _Window | None = None

    def plan(self) -> dict[int, int]:
        """Each job's lane: all on lane 0 taking turns, else spread over the lanes: with as
        many users as lanes or more, each user's jobs on one lane (alice's three and bob's
        one: bob gets a lane of his own, not half of one beside alice while her others
        have the other), each on the lane with the fewest jobs; with fewer, jobs spread
        over them one by one."""
        if self.mode is Mode.TURNS or self.lanes < 2:
            return {job: 0 for job in self.jobs}
        owned: dict[str, list[int]] = {}
        for job in sorted(self.jobs):
            owned.setdefault(self.users.get(job, ""), []).append(job)
        lanes: list[list[int]] = [[] for _ in range(self.lanes)]
        if len(owned) >= self.lanes:  # each user's jobs on one lane, most jobs first
            for user in sorted(owned, key=lambda u: (-len(owned[u]), u)):
                min(lanes, key=len).extend(owned[user])
        else:  # more lanes than users: one user's jobs spread over them too
            for user in sorted(owned, key=lambda u: (len(owned[u]), u)):
                for job in owned[user]:
                    min(lanes, key=len).append(job)
        return {job: i for i, jobs in enumerate(lanes) for job in jobs}

    def tick(self, now: float, samples: Sequence[Sample]) -> bool:
        """Take in what the host sees; True where the plan changed."""
        before = self.plan()
        jobs = frozenset(s.job for s in samples)
        if jobs != self.jobs:
            # The back-off stays: a user who suspends and resumes a job, or submits one,
            # must not have a trial made at each change.
            self.jobs, self.users = jobs, {s.job: s.user for s in samples}
            self.gain = self.slowest = None  # (figures of other jobs)
            self._enter(Verdict.CHANGED, now, samples)
            return self.plan() != before
        if self.mode is not Mode.TURNS and not self._fits(samples):
            self._fail(now, samples)  # the memory side by side no longer holds
            return self.plan() != before
        window = self._window
        if window is None or not self._complete(window, now, samples):
            return False
        rates = _rates(window, now, samples)
        if self.mode is not Mode.TURNS:
            self.paces = _paces(window, samples)
        self._judge(rates, now, samples)
        return self.plan() != before

    def next_look(self, now: float) -> float:
        """When a simulated host looks next after a look at ``now``, the jobs staying the
        same (the host looks every :data:`PERIOD`): when the window measured now may be
        complete; taking turns, not before the back-off ends less a window (so that the
        turns are measured afresh by then); a window past its least time that has not seen
        enough iterations yet, after as long again as it has run (to its most), not every
        period: what it finds is then a rate over up to twice the host's window, in a tenth
        of the looks. At the soonest a :data:`PERIOD` on."""
        window = self._window
        if window is None:
            return now + PERIOD
        least = PACKED_WINDOW if self.mode is Mode.PACKED else WINDOW
        due = window.started + least
        if self.mode is Mode.TURNS and self.retry_at > now:
            due = max(due, self.retry_at - WINDOW)
        elif now >= due:
            due = min(window.started + WINDOW_MAX, 2 * now - window.started)
        return max(now + PERIOD, due)

    def resume(self, samples: Sequence[Sample], gain: float, now: float) -> None:
        """Take up a packing its host reports paying ``gain`` times the turns' work (a
        forecast of a live node): the jobs ``samples`` show side by side, measured on from
        ``now`` as if each did an even share of that work, taking turns and side by side.
        What the host's next remeasure would find a forecast cannot know: none is made
        until the jobs change."""
        self.jobs, self.users = frozenset(s.job for s in samples), {s.job: s.user for s in samples}
        share = 1.0 / max(1, len(samples))
        self.turns = {s.job: share for s in samples}
        self.packed = {s.job: share * gain for s in samples}
        self.mode, self.last, self.gain = Mode.PACKED, Verdict.PAID, gain
        self.packed_since = math.inf
        self._window = _start(now, samples)

    def _judge(self, rates: dict[int, float], now: float, samples: Sequence[Sample]) -> None:
        if self.mode is Mode.TURNS:
            self.turns = rates
            if self._may_pack(now, samples):
                self._enter(Verdict.MEASURED, now, samples)
            else:
                self._window = _start(now, samples)  # measured on, taking turns
            return
        total, turns = sum(rates.values()), sum(self.turns.values())
        self.gain = total / turns if turns >= SOME_WORK else None
        kept = [
            (rates.get(job, 0.0) / share, job) for job, share in self.turns.items() if share > 0
        ]
        self.slowest = min(kept) if kept else None
        paid = (
            self.gain is not None
            and self.gain >= GAIN
            and (
                # (a job whose pace was never timed counts its lane time as work: what it
                # costs the others then decides, as under a policy that favours one)
                not (self.favours or not all(s.timed for s in samples))
                or all(rates.get(job, 0.0) >= KEEP * share for job, share in self.turns.items())
            )
        )
        if not paid:
            self._fail(now, samples)
            return
        if self.mode is Mode.PACKED and (
            now - self.packed_since >= REMEASURE
            or any(
                abs(rates[job] - was) > DRIFT * was
                for job, was in self.packed.items()
                if job in rates and was > 0
            )
        ):
            self._enter(Verdict.DRIFTED, now, samples)
            return
        if self.mode is Mode.TRIAL:
            self.packed, self.packed_since = rates, now
            self.backoff = BACKOFF_FIRST
        self._enter(Verdict.PAID, now, samples)

    def _fail(self, now: float, samples: Sequence[Sample]) -> None:
        self.retry_at = now + self.backoff
        self.backoff = min(BACKOFF_MAX, self.backoff * 2)
        self._enter(Verdict.FAILED, now, samples)

    def _enter(self, verdict: Verdict, now: float, samples: Sequence[Sample]) -> None:
        self.mode, self.last = TRANSITIONS[self.mode, verdict], verdict
        self._window = _start(now, samples)
        if self.mode is Mode.TURNS:
            self.paces = {}  # (a trial measures them afresh)

    def _may_pack(self, now: float, samples: Sequence[Sample]) -> bool:
        """Two jobs or more, room for them side by side, owners who may share
        (:func:`may_share`), and no back-off from a packing that failed."""
        if self.lanes < 2 or len(samples) < 2 or now < self.retry_at:
            return False
        if not may_share((s.user for s in samples), self.mps):
            return False
        return self._fits(samples)

    def _fits(self, samples: Sequence[Sample]) -> bool:
        """The lanes' safety condition side by side: each lane's jobs' resident memory and
        the largest peak beyond it, summed over the lanes, within the device's memory (the
        host gives each job's admitted figure as both: never what a job says it uses)."""
        if self.memory is None:
            return True
        mode, self.mode = self.mode, Mode.TRIAL
        plan = self.plan()  # where the trial would put them
        self.mode = mode
        lanes: dict[int, list[Sample]] = {}
        for sample in samples:
            lanes.setdefault(plan.get(sample.job, 0), []).append(sample)
        needed = 0
        for lane in lanes.values():
            if any(s.persistent is None or s.peak is None for s in lane):
                return False
            needed += sum(s.persistent or 0 for s in lane) + max(
                max(0, (s.peak or 0) - (s.persistent or 0)) for s in lane
            )
        return needed <= self.memory

    def _complete(self, window: _Window, now: float, samples: Sequence[Sample]) -> bool:
        elapsed = now - window.started
        if elapsed >= WINDOW_MAX:
            return True
        # (in all: a job fifo lets wait does none taking turns)
        done = sum(s.iterations - window.iterations.get(s.job, s.iterations) for s in samples)
        least = PACKED_WINDOW if self.mode is Mode.PACKED else WINDOW
        return elapsed >= least and done >= MIN_ITERATIONS * len(samples)


def _start(now: float, samples: Sequence[Sample]) -> _Window:
    return _Window(
        now,
        {s.job: s.work or 0.0 for s in samples},
        {s.job: s.iterations for s in samples},
        {s.job: s.billed for s in samples},
    )


def _rates(window: _Window, now: float, samples: Sequence[Sample]) -> dict[int, float]:
    """Each job's work a second over the window."""
    elapsed = max(1e-9, now - window.started)
    return {s.job: max(0.0, s.work - window.work.get(s.job, s.work)) / elapsed for s in samples}


def _paces(window: _Window, samples: Sequence[Sample]) -> dict[int, float]:
    """Each job's work a lane second over the window, where it was billed enough to tell."""
    paces = {}
    for s in samples:
        billed = s.billed - window.billed.get(s.job, s.billed)
        if billed >= SOME_LANE_TIME:
            paces[s.job] = max(0.0, s.work - window.work.get(s.job, s.work)) / billed
    return paces
