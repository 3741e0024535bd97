"""What an execution host knows of each job resident on its device and of each lane: a
job's process, its iterations and gaps as measured (by the host, or from its worker's page
under a lease), the view of it a policy is given, and what is reported of it to the daemon
(progress, its state to a daemon that attaches, its exit). :mod:`gq.exec.host.loop`,
``gq/exec/host/job_processes.py`` and ``granting.py`` keep these records and change them
as events arrive; nothing here does I/O.
"""

from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass, field

from gq.exec.cgroups.job_cgroups import JobCgroup
from gq.exec.host import messages as wire
from gq.exec.host.memory_places import Memory
from gq.exec.host.messages import StopWhy
from gq.exec.host.spawn import JobProcess
from gq.exec.lane.lease import Figures, SharedPage
from gq.exec.lane.paces import OUTLIER, SETTLED, RecentMean
from gq.exec.lane.rule import PeopleTurns
from gq.exec.lane.standings import HOLDS_LANE, IN_ITERATION, WANTS_LANE, Standing
from gq.exec.protocol import Channel
from gq.policies.base import JobView


@dataclass
class Resident:
    job_id: int
    run: int  # which run of the job this is: exit reports name it, so a rerun is not ended
    user: str
    priority: int
    submit_time: float
    declared_total: int | None  # --steps at submit: the job cannot change it
    lane: int
    process: JobProcess
    channel: Channel | None  # None for plain processes (no iteration boundaries)
    started_at: float  # monotonic
    started_wall: float
    cgroup: JobCgroup | None = None
    time_limit: int | None = None  # seconds; the host enforces it, daemon or not
    deadline: float | None = None  # wall clock; enforced likewise (state DEADLINE)
    interactive: bool = False  # on a terminal (gq run --pty, a kernel): people first
    burst_counted: float = 0.0  # its attained time its owner's burst counts already
    idle_timeout: int | None = None  # seconds it may sit idle (gq.exec.job.idleness)
    active_at: float | None = None  # wall clock: its last activity seen
    active_told: float | None = None  # ... as the daemon was last told it
    warning: tuple[int, int, bool] | None = None  # --signal: number, seconds before, B:
    suspended: bool = False  # gq suspend: its processes stopped; it is granted nothing
    frozen: bool = False  # its processes are stopped now (from a suspend until it is thawed)
    suspended_at: float | None = None  # monotonic, while suspended
    paused: float = 0.0  # seconds it spent suspended: its time limit does not count them
    # Seconds from its launch to its first acquire (interpreter, imports, set-up; not the
    # wait for the lane after it): what forecasts add before a job of its name iterates.
    startup: float | None = None
    kill_why: StopWhy | None = None
    detail: str | None = None  # what its worker did wrong, for its exit report
    standing: Standing = Standing.IDLE
    # It speaks the worker protocol: the host counts its iterations, and no more steps.
    worker: bool = False
    steps_done: int = 0  # what it says it did (its own count, shown as it says it)
    # ... and as far as the host vouches for it: for a worker, no more than the iterations
    # its host granted it. Policies rank by this.
    steps_counted: int = 0
    worker_total: int | None = None  # what the job itself declared (gq.set_total_steps)
    past_total: bool = False  # it reported more steps than its total: the total is wrong
    attained: float = 0.0  # lane time billed: grant to release, a lease's whole wall time
    unbilled: float = 0.0  # of it, what fair share is not charged (packed: the share not got)
    iterations: int = 0  # all of them (under a lease: as its page counts them)
    # Of those, the ones its page counted under leases, and its leases' lane time: the host
    # vouches for as many as that time holds at the pace it timed (a page that claims a
    # million iterations in a second's lease is believed for a second's worth).
    page_iterations: int = 0
    leased: float = 0.0
    # Iterations the host saw from grant to release (device work included), the recent ones
    # with their steps: the pace policies use, where there are two (a page's word is not).
    timed: int = 0
    timed_recent: RecentMean = field(default_factory=RecentMean)
    first_iteration: float = 0.0  # the first one timed: warm-up, kept out of the mean
    # Its lane taken inside an iteration, past --max-hold while another job waited, and
    # the lane time of that iteration before it was (its length, once it ends).
    taken: int = 0
    sliced: float = 0.0
    gaps: RecentMean = field(default_factory=RecentMean)  # release to the next acquire
    granted_at: float = 0.0
    released_at: float | None = None
    mem_persistent: int | None = None
    mem_peak: int | None = None
    kill_deadline: float | None = None
    mem_cap: int | None = None  # bytes of device memory it may hold (its figure)
    cgroup_cap: int | None = None  # its cgroup's memory limit, where that holds mem_cap
    host_mem_watched: int | None = None  # its --host-mem, where no cgroup holds it
    # Where a plain process's lowest rank sends its count of steps (gq.exec.job.rank_progress).
    step_socket: socket.socket | None = None
    cap_unsent: bool = False  # a CUDA worker is told its probed cap with its next grant
    probing: bool = False  # it declared no memory: its first figures go to the daemon at once
    page: SharedPage | None = None  # shared with its worker (gq.exec.lane.lease)
    lease: int = 0  # the number of its lease (gq.exec.lane.lease), while leased
    recalled_at: float = 0.0  # monotonic: when its lease was last asked back
    lease_started: float = 0.0  # monotonic
    lease_base: Figures = field(default_factory=Figures)  # its page when the lease began
    page_seen: Figures = field(default_factory=Figures)  # its page when last read
    page_unread: tuple[int, float] | None = None  # its page's odd sequence count, first seen
    shortage: wire.Shortage | None = None  # it ran out of memory: held, asked for
    exit_status: int | None = None  # its process's, once collected (Popen's convention)
    exited_at: float = 0.0  # monotonic: when it was collected
    ended_wall: float = 0.0  # wall clock: the same moment, the job's end time
    dirty: bool = True
    moving: bool = False  # to another lane (gq.exec.lane.packing_moves): granted nothing here
    memory: Memory = field(default_factory=Memory)  # where it is (gq.exec.host.memory_moves)

    @property
    def steps_total(self) -> int | None:
        return self.declared_total if self.declared_total is not None else self.worker_total

    @property
    def mean_iteration(self) -> float | None:
        """From the iterations the host timed, past the first (its warm-up would mislead
        srtf, and a job it ranks last never runs again to correct it). A job that has run
        alone under a lease since its first: its lease's pace (:meth:`_lease_pace`), gaps
        and all, the lane time each of its iterations held. The page's count is its word,
        so this is believed only until the host has timed a second iteration, at the
        first contention."""
        if self.timed >= 2:
            return self.timed_recent.per_step()  # robust to a compilation, a checkpoint
        return self._lease_pace()

    def _lease_pace(self) -> float | None:
        """Lane seconds an iteration under leases, gaps and all: billed time (less the first
        iteration where it was timed; the one under way counted half done) over the page's
        count; a first iteration it did not time is in the lease's time, warm-up and all."""
        if self.iterations < 2:
            return None
        counted = self.iterations - (1 if self.timed else 0) + (0.5 if self.in_iteration else 0)
        return max(0.0, self.billed - self.first_iteration) / counted

    def time_iteration(self, length: float, steps: int) -> None:
        """One iteration the host timed from grant to release, and the steps it advanced
        (the first one is warm-up: kept out of the mean)."""
        self.timed += 1
        if self.timed == 1:
            self.first_iteration = length
        else:
            self.timed_recent.add(length, steps)

    @property
    def billed(self) -> float:
        """Lane time billed so far, the grant or lease in progress included (it grows
        while a long iteration, or a lease, goes on)."""
        if self.in_iteration:
            return self.attained + max(0.0, time.monotonic() - self.granted_at)
        return self.attained

    @property
    def charged(self) -> float:
        """Of the lane time billed, what its owner's fair share is charged."""
        return max(0.0, self.billed - self.unbilled)

    @property
    def mean_gap(self) -> float | None:
        """Idle time from a release to the next acquire (data loading, host-side work). The
        host times gaps between grants, not a lease's (those timed before one are a
        compiling job's first and longest). Where more iterations ran leased than gaps were
        timed, and the timed ones are far longer than the leases' (:meth:`_leased_gap`),
        it is the leases'. A job paced by its leases alone has none: its gaps are in that
        pace, its iteration's (a gap timed before its lease, as long as a warm-up's or as
        the job makes it, would otherwise take the iterations' lane time for its own)."""
        if self.timed < 2 and self._lease_pace() is not None:
            return None
        timed = self.gaps.per_item()
        leased = self._leased_gap()
        if leased is not None and leased[1] >= len(self.gaps):
            if timed is None or timed > OUTLIER * leased[0]:
                return leased[0]
        return timed

    def _leased_gap(self) -> tuple[float, int] | None:
        """Seconds a gap under its leases, and how many iterations that holds: the leases'
        lane time less the page-counted iterations the host vouches for at its timed pace
        (a page that claims more than that time holds is believed for as many), over
        those; None without a timed pace or a lease."""
        pace = self.timed_pace
        if pace is None or not self.page_iterations or self.leased <= 0:
            return None
        vouched = (
            self.page_iterations
            if pace <= 0
            else min(self.page_iterations, math.ceil(self.leased / pace))
        )
        return max(0.0, self.leased - vouched * pace) / vouched, vouched

    def record_steps(self, reported: int) -> None:
        """What the worker says it has done, made plausible: never less than before, never
        more than its total. A job that claims more than its total has shown the total to be
        wrong, and policies stop believing it (srtf then ranks it by attained service)."""
        total = self.steps_total
        if total is not None and reported > total:
            self.past_total = True
            reported = total
        if reported > self.steps_done:
            self.steps_done = reported
            self.dirty = True
        self.count_steps()

    def count_steps(self) -> None:
        """Its steps as far as the host vouches for them: for a worker, no more than the
        iterations its host granted it, the one under way included (a count is its word, a
        grant the host's; again after every grant and every iteration's end)."""
        steps = self.steps_done
        if self.worker:
            steps = min(steps, self.vouched_iterations() + (1 if self.in_iteration else 0))
        if steps != self.steps_counted:
            self.steps_counted = steps
            self.dirty = True

    def vouched_iterations(self) -> int:
        """The iterations the host granted (or saw end), and of those its page counted
        under leases, as many as the leases' lane time holds at the pace the host timed."""
        granted = self.iterations - self.page_iterations
        pace = self.timed_pace
        if pace is None or pace <= 0:
            return self.iterations
        leased = self.leased
        if self.standing in (Standing.LEASED, Standing.RECALLED):
            leased += max(0.0, time.monotonic() - self.granted_at)
        return granted + min(self.page_iterations, math.ceil(leased / pace))

    @property
    def timed_pace(self) -> float | None:
        """Lane seconds an iteration the host timed held, past the first (None: fewer)."""
        return self.timed_recent.per_item()

    def end_iteration(self, held: float, steps: int | None = None) -> None:
        """An iteration is over (a Done, or a READY while holding: the host saw it end),
        ``held`` lane seconds since its last grant: billed, counted, timed whole (with what
        it held before its lane was taken, if it was), with the steps it says it took."""
        self.attained += held
        self.iterations += 1
        before = self.steps_counted
        self.record_steps(self.steps_done if steps is None else steps)
        self.time_iteration(held + self.sliced, max(0, self.steps_counted - before))
        self.sliced = 0.0
        self.dirty = True

    def declare_total(self, total: int) -> None:
        """The job's own total (gq.set_total_steps), unless --steps declared one at submit.
        A total under the steps already done is as wrong as a count past it, and so is one
        raised after it was given: a job that kept raising it would stay "nearly done"
        under srtf for ever."""
        if self.declared_total is not None or total == self.worker_total:
            return
        if total < self.steps_done or (self.worker_total is not None and total > self.worker_total):
            self.past_total = True
        self.worker_total, self.dirty = total, True
        # A count past its new total is believed no further than that total (shown so).
        self.steps_done = min(self.steps_done, total)
        self.steps_counted = min(self.steps_counted, total)

    def asks_for_iteration(self) -> None:
        """At an acquire: a job that has done all its steps and asks for more has shown its
        total (or its count) wrong. Believed, it would stay at zero remaining time under
        srtf for as long as it liked; doubted, it ranks by attained service."""
        total = self.steps_total
        if total is not None and self.steps_done >= total:
            self.past_total = True

    def view(self, user_usage: float = 0.0) -> JobView:
        iteration, settled = self._ranking()
        return JobView(
            id=self.job_id,
            user=self.user,
            submit_time=self.submit_time,
            priority=self.priority,
            steps_done=self._steps_ranked(),
            steps_total=None if self.past_total else self.steps_total,
            attained=self.billed,
            charged=self.charged,
            mean_iteration=iteration,
            pace_settled=settled,
            mean_gap=self.mean_gap,
            released_at=self.released_at,
            deadline=self._deadline_now(),
            user_usage=user_usage,
        )

    def _steps_ranked(self) -> int:
        """Its steps as policies count them: inside an iteration (holding its lane, or stopped
        in it), the one under way is not done, though its count may hold it. A job that says
        all its steps are done inside an iteration that never ends would otherwise have no
        time left however long that iteration lasted, and srtf kept it on its lane past any
        --max-hold."""
        total = self.steps_total
        if total is None or self.standing not in IN_ITERATION:
            return self.steps_counted
        return max(0, min(self.steps_counted, total - 1))

    def _ranking(self) -> tuple[float | None, bool]:
        """The iteration length policies rank it by, and whether srtf may rank it by that.

        The length is its mean, but never less than the iteration under way has lasted (a
        job whose iterations never end would otherwise rank as one whose iterations take no
        time, and srtf would keep it on the lane). It is settled once the mean rests on
        :data:`SETTLED` iterations timed past the first, or on a lone lease's as many, or
        once the iteration under way has outlasted the mean (it ranks by that). The mean and
        the iteration under way are read once, for both."""
        mean, ongoing = self.mean_iteration, self._ongoing()
        leased = self.timed < 2 and self.iterations > SETTLED  # (its lease's pace)
        settled = (mean is not None and (self.timed > SETTLED or leased)) or ongoing > (mean or 0.0)
        if mean is None:
            return ongoing or None, settled
        return max(mean, ongoing), settled

    def _ongoing(self) -> float:
        """Lane seconds the iteration under way has held (none between iterations)."""
        ongoing = self.sliced
        if self.standing is Standing.HOLDING:
            ongoing += time.monotonic() - self.granted_at
        elif self.standing is Standing.RECALLED:
            ongoing += time.monotonic() - self.recalled_at
        return ongoing

    def _deadline_now(self) -> float | None:
        """The deadline on the monotonic clock policies are given."""
        return None if self.deadline is None else self.deadline - time.time() + time.monotonic()

    def progress(self) -> wire.JobProgress:
        return wire.within_bounds(wire.JobProgress(**self._figures()))

    def _figures(self) -> dict:
        """What the daemon is told."""
        return dict(
            job=self.job_id,
            run=self.run,
            steps_done=self.steps_done,
            steps_counted=self.steps_counted,
            steps_total=self.steps_total,
            attained=self.billed,
            charged=self.charged,
            mean_iteration=self.mean_iteration,
            mean_gap=self.mean_gap,
            mem_persistent=self.mem_persistent,
            mem_peak=self.mem_peak,
            holds_lane=self.in_iteration,
            iterations=self.iterations,
            lane_taken=self.taken,
            startup=self.startup,
            active_at=self.active_at,
            memory=self.memory.report(),
        )

    @property
    def in_iteration(self) -> bool:
        """Holding the lane now: billed from ``granted_at`` (a lease: from its start)."""
        return self.standing in HOLDS_LANE

    def take_figures(self, figures: Figures) -> None:
        """What a leased worker's page says it did since it was last read (checked already):
        counts and memory, never time."""
        seen, self.page_seen = self.page_seen, figures
        self.iterations += figures.iterations - seen.iterations
        self.page_iterations += figures.iterations - seen.iterations
        self.record_steps(figures.steps)
        total = self.steps_total
        if (
            figures.iterations > seen.iterations
            and total is not None
            and figures.steps_at_take >= total
        ):
            self.past_total = True  # it went on iterating after all its steps
        if figures.mem_peak >= 0:
            self.mem_persistent = max(0, figures.mem_persistent)
            self.mem_peak = figures.mem_peak
        self.dirty = True

    def resident_state(self) -> wire.ResidentState:
        return wire.within_bounds(
            wire.ResidentState(
                **self._figures(),
                pid=self.process.pid,
                started=self.started_wall,
                time_limit=self.time_limit,
                kill_why=self.kill_why,
            )
        )

    def exit_report(self) -> wire.Exited:
        """How its run ended, and when its process was collected. A process whose set-up
        failed before its exec ran nothing of the job's: the report says why (no directory,
        no output file, no interpreter)."""
        code = self.exit_status
        assert code is not None, "reported before its process was collected"
        failure = self.process.setup_failure
        if failure is not None:
            return wire.within_bounds(
                wire.Exited(
                    **self._figures(),
                    kill_why=StopWhy.LAUNCH,
                    detail=failure,
                    end_time=self.ended_wall,
                )
            )
        return wire.within_bounds(
            wire.Exited(
                **self._figures(),
                code=code if code >= 0 else None,
                signal=-code if code < 0 else None,
                kill_why=self.kill_why,
                detail=self.detail,
                end_time=self.ended_wall,
                shortage=self.shortage,
            )
        )


@dataclass
class Lane:
    index: int
    holder: Resident | None = None  # HOLDING, LEASED or RECALLED
    residents: list[Resident] = field(default_factory=list)
    kept_until: float | None = None  # kept free for a job in its gap until then (monotonic)
    last_job: int | None = None  # the job granted it last
    turns: PeopleTurns = field(default_factory=PeopleTurns)  # (gq.exec.lane.rule)
    # Since when a job has waited that the rule would grant first (bounds the hold).
    contended_since: float | None = None
    switches: int = 0  # grants to a job other than the last one


def ready_to_grant(lane: Lane) -> list[Resident]:
    """The lane's residents that wait for an iteration and may be granted one."""
    return [
        r
        for r in lane.residents
        if r.standing in WANTS_LANE and not r.suspended and r.channel is not None and not r.moving
    ]
