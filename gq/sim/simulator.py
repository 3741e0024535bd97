"""A discrete-event simulator of one gq node, iteration-exact, that advances in bulk.

Events are arrivals, job start-ups and the ends of *stretches*: runs of consecutive
iterations one job gets on a device. At every event the daemon's admission code places
pending jobs in the policy's order; whenever a device is free the policy's ``pick`` chooses
who runs next, exactly as the execution host does at an iteration boundary. Instead of
asking again after every iteration, the simulator asks the policy how long its pick would
stay the same if nothing else happened (:func:`gq.policies.base.run_length`) and schedules
that whole stretch as one event. Anything that may change the pick on a device (a job
placed on it, a resident job becoming ready) cuts its stretch short at the next iteration
boundary, where the iteration-by-iteration simulation would have asked the policy again.
Jobs of a policy that takes turns (:class:`gq.policies.base.TakesTurns`: fair, rr, priority's
equal priorities) take all their turns up to the next event in one :class:`SharedWindow`,
computed in closed form (:mod:`gq.sim.turns`). So the two agree (``step_by_step=True`` runs one
iteration per stretch), except where a stretch is given a floor: ``share_slice`` (a share of
the job's iterations) makes jobs that would take turns every iteration take them in slices
instead, which bounds the events of a long trace at a small cost in accuracy. It is 0 (exact)
unless switches cost time, which closed-form turns do not model: then 0.1 % for policies
whose pick alternates by nature (``fair``).

A job of ``iterations`` steps and ``duration`` seconds runs iterations of
``duration / iterations``; a device that changes job first pays ``switch_cost``. As on the
execution host, a job's iteration time is known once it has run two iterations (the first
one includes warm-up). A job asking for k > 1 GPUs takes k whole devices (all of them, if
the node has fewer).

A job may have an idle ``gap`` after each iteration (data loading, host-side work): it is not
ready then, and other jobs may take the device, as the policy's ``pick`` decides (``priority
--fill``). A lower job's iteration that outlasts the gap delays the next one, since a lane
is never taken from a job mid-iteration. Where nothing else could take the device in its
gaps (the job is alone on it, or its gaps are too short to fill and the host anticipates
it), its iterations still run in bulk; otherwise one at a time. A job stays resident
through its last gap, as its process sleeps, then exits (after its ``teardown``, if any).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gq import defaults
from gq.daemon import admission
from gq.exec import lanes as lane_rule
from gq.policies import JobView, Policy
from gq.policies.base import TakesTurns, anticipation_window, run_length, time_left
from gq.sim import turns
from gq.sim.traces import TraceJob

MEASURED_AFTER = 2  # iterations before a job's iteration time and gap are known (as the host's)
EPSILON = 1e-9  # relative slack when placing a moment on an iteration boundary
DEFAULT_SHARE_SLICE = 0.001  # of a job's iterations, for policies that alternate
STOP_EVERY = 256  # moments between two questions to ``stop``


@dataclass
class JobRun:
    job: TraceJob
    gpus: int
    lanes: tuple[int, ...] = ()  # one per device it holds
    start: float | None = None
    ready_at: float = 0.0
    end: float | None = None
    done: int = 0
    attained: float = 0.0
    released_at: float | None = None
    _view: JobView | None = None  # views are immutable: rebuild only after a stretch
    _request: admission.Request | None = None

    @property
    def request(self) -> admission.Request:
        """What it asks admission for (the same at every placement)."""
        if self._request is None:
            job = self.job
            self._request = admission.Request(
                job.id,
                self.gpus,
                admission.Footprint(job.mem or 0),
                exclusive=self.gpus > 1,
                time_limit=job.limit,
            )
        return self._request

    def view(self) -> JobView:
        if self._view is None:
            self._view = self.projected(0, self.released_at)
        return self._view

    def projected(self, more: int, released_at: float | None) -> JobView:
        """Its view after ``more`` further iterations, the last ending at ``released_at``."""
        job, done = self.job, self.done + more
        return JobView(
            id=job.id,
            user=job.user,
            submit_time=job.submit_time,
            priority=job.priority,
            steps_done=done,
            steps_total=job.iterations,
            attained=self.attained + more * job.iteration_time,
            mean_iteration=job.iteration_time if done >= MEASURED_AFTER else None,
            mean_gap=job.gap if done >= MEASURED_AFTER else None,
            released_at=released_at,
            deadline=job.deadline,
        )

    def finish_iterations(self, count: int, released_at: float) -> None:
        """``count`` more iterations, the last released at ``released_at``; the job is ready
        again after its gap."""
        self.done += count
        self.attained += count * self.job.iteration_time
        self.released_at = released_at
        self.ready_at = released_at + self.job.gap
        self._view = None

    @property
    def period(self) -> float:
        """From one of its iterations' start to the next's, when nothing comes between."""
        return self.job.iteration_time + self.job.gap

    def release_after(self, begin: float, count: int) -> float:
        """When the last of ``count`` iterations ends, begun at ``begin`` one per period."""
        return begin + count * self.period - self.job.gap


@dataclass
class Stretch:
    """``count`` iterations of ``run`` from ``begin`` (after any switch), one per
    ``run.period`` (with its gaps between them: the lane is held for the job), ending at
    ``end``."""

    run: JobRun
    begin: float
    count: int
    end: float
    version: int  # unique; its end event is stale once the stretch is cut and re-dated

    @property
    def released_at(self) -> float:
        """When its last iteration ends."""
        return self.run.release_after(self.begin, self.count)

    def boundary_after(self, now: float) -> tuple[int, float]:
        """Where to stop if the pick may change at ``now``: after the iteration running then
        (or, in a gap, the one before it). Iterations done by then, and when that is (not
        before ``now``)."""
        done = math.ceil((now - self.begin) / self.run.period - EPSILON)
        done = min(self.count, max(1, done))
        return done, max(now, self.run.release_after(self.begin, done))


@dataclass
class SharedWindow:
    """Turns that jobs take, settled at once: ``counts`` iterations
    each, in ``begin``-``end``. It ends before the next event, so nothing cuts it."""

    counts: list[tuple[JobRun, int]]
    begin: float
    end: float
    version: int


@dataclass
class Lane:
    """One lane of a device: it runs one iteration at a time, its own jobs' picks."""

    index: int
    device: int
    residents: list[JobRun] = field(default_factory=list)
    stretch: Stretch | SharedWindow | None = None
    last_job: int | None = None
    owner: JobRun | None = None  # a multi-GPU job whose stretch spans this lane


@dataclass(frozen=True)
class Slice:
    """One stretch of device time given to a job (for timelines)."""

    device: int
    job: int
    start: float
    end: float
    lane: int = 0


@dataclass
class Result:
    policy: str
    runs: list[JobRun]
    slices: list[Slice]
    busy: float
    gpus: int
    events: int = 0  # stretches scheduled: what the run cost
    lanes: int = 1  # per device: utilization is the share of lane time busy
    complete: bool = True  # False: stopped early (``stop``); jobs not ended have end None

    def jcts(self) -> list[float]:
        return [run.end - run.job.submit_time for run in self.runs]

    def summary(self) -> dict:
        jcts = sorted(self.jcts())
        first = min(run.job.submit_time for run in self.runs)
        makespan = max(run.end for run in self.runs) - first
        return {
            "policy": self.policy,
            "jobs": len(self.runs),
            "avg_jct": statistics.fmean(jcts),
            "median_jct": statistics.median(jcts),
            "p95_jct": jcts[min(len(jcts) - 1, int(round(0.95 * (len(jcts) - 1))))],
            "makespan": makespan,
            "utilization": (
                self.busy / (self.gpus * self.lanes * makespan) if makespan > 0 else 0.0
            ),
            "deadlines_met": self.deadlines_met(),
        }

    def deadlines_met(self) -> float | None:
        """The share of jobs with a deadline that ended by it (None: no job had one)."""
        due = [run for run in self.runs if run.job.deadline is not None]
        if not due:
            return None
        return sum(run.end <= run.job.deadline for run in due) / len(due)


ARRIVE, READY, STRETCH_END = 0, 1, 2  # event kinds, in the order a moment handles them


@dataclass(frozen=True)
class Resident:
    """A job already resident when the simulation starts: the lanes it holds (one per
    device, as :attr:`JobRun.lanes` counts them), when it started, and what it has done;
    ``since``: when that was measured, where before the simulation's clock (a host reports
    progress about once a second): it goes on from then."""

    lanes: tuple[int, ...]
    start: float
    done: int = 0
    attained: float = 0.0
    since: float | None = None


@dataclass(frozen=True)
class Start:
    """A node that is not empty when the simulation starts (a forecast's live queue), where
    a trace starts from an empty one.

    ``clock``: no job is placed before it (jobs submitted earlier wait until then);
    ``residents``: the jobs already on lanes, by id; ``arrivals``: a job's earliest start
    (--begin); ``after``: jobs that arrive only once all of these other jobs have ended (a
    dependency); ``held``: devices (by index) that admit no job, with the guard's reason;
    ``names``: the devices' names, as admission's placements give them; ``capacities``: each
    device's memory for jobs, where they differ (else ``capacity`` for all); ``overheads``:
    what each resident job holds there beyond its figure (a CUDA context), where known."""

    clock: float = 0.0
    residents: dict[int, Resident] = field(default_factory=dict)
    arrivals: dict[int, float] = field(default_factory=dict)
    after: dict[int, tuple[int, ...]] = field(default_factory=dict)
    held: dict[int, str] = field(default_factory=dict)
    names: tuple[str, ...] = ()
    capacities: tuple[int, ...] = ()
    overheads: tuple[int, ...] = ()


def simulate(
    jobs: list[TraceJob],
    policy: Policy,
    gpus: int = 1,
    switch_cost: float = 0.0,
    capacity: int | None = None,
    max_resident: int | None = None,
    backfill: bool = True,
    step_by_step: bool = False,
    share_slice: float | None = None,
    lanes: int = 1,
    progress: Callable[[int, int], None] | None = None,
    move_margin: float = defaults.MOVE_MARGIN,
    start: Start | None = None,
    stop: Callable[[], bool] | None = None,
) -> Result:
    """Run the trace through ``policy`` on ``gpus`` devices of ``lanes`` lanes each (a lane
    runs one iteration at a time, lanes of a device at once; ``capacity``, a device's
    memory, is split between them; a multi-GPU job takes whole devices and runs on one lane
    of each). For backfill a job's time limit is its trace limit, else its run time alone
    (a perfect estimate). ``step_by_step`` asks the policy after every iteration (the
    reference the bulk advance is tested against); ``progress`` is called with (jobs
    finished, jobs) as jobs end; ``move_margin`` is the daemon's --move-margin; ``start``
    seeds a node that already runs jobs (:class:`Start`); ``stop``, asked every few hundred
    events, ends the run early when it says so (a result that is not ``complete``)."""
    if gpus < 1 or lanes < 1:
        raise ValueError("gpus and lanes must be at least 1")
    simulation = _Simulation(
        jobs,
        policy,
        gpus,
        switch_cost,
        capacity,
        max_resident,
        backfill,
        step_by_step,
        share_slice,
        lanes,
        progress,
        move_margin,
        start,
        stop,
    )
    return simulation.run()


class _Simulation:
    def __init__(
        self,
        jobs,
        policy,
        gpus,
        switch_cost,
        capacity,
        max_resident,
        backfill,
        step_by_step,
        share_slice,
        lanes,
        progress,
        move_margin,
        start,
        stop,
    ):
        # A trace's every job ends; on a live node (``start``) one may never start (it waits
        # for devices that take no job): it is left with no end.
        self.strict = start is None
        start = start or Start(clock=-math.inf)
        self.clock = start.clock
        self.policy = policy
        self.gpus = gpus
        self.lanes_per_device = lanes
        self.switch_cost = switch_cost
        every = capacity if capacity is not None else 1 << 62
        self.lane_capacity = [
            (start.capacities[d] if start.capacities else every) // lanes for d in range(gpus)
        ]
        self.overheads = start.overheads
        self.max_resident = max_resident or 1 << 30
        self.backfill = backfill
        self.step_by_step = step_by_step
        if share_slice is None:  # turns are settled in closed form unless switches cost
            share_slice = DEFAULT_SHARE_SLICE if policy.alternates and switch_cost else 0.0
        self.share_slice = share_slice
        self.progress = progress
        self.stop = stop
        self.move_margin = move_margin
        self.lanes = [Lane(i, i // lanes) for i in range(gpus * lanes)]
        self.runs = {job.id: JobRun(job, min(job.gpus, gpus)) for job in jobs}
        if len(self.runs) != len(jobs):
            raise ValueError("job ids in a trace must be unique")
        self.names = start.names or tuple(str(device) for device in range(gpus))
        self.device_index = {name: device for device, name in enumerate(self.names)}
        self.held = start.held
        self.pending: dict[int, JobRun] = {}
        self.waiting_for = {job_id: set(ids) for job_id, ids in start.after.items()}
        self.dependants: dict[int, list[int]] = {}
        for job_id, ids in start.after.items():
            for other in ids:
                self.dependants.setdefault(other, []).append(job_id)
        self.earliest = {
            job.id: max(job.submit_time, start.clock, start.arrivals.get(job.id, -math.inf))
            for job in jobs
        }
        self.events = [
            (self.earliest[job.id], ARRIVE, i, job.id)
            for i, job in enumerate(jobs)
            if job.id not in start.residents and not self.waiting_for.get(job.id)
        ]
        self.sequence = len(jobs)
        for job_id, resident in start.residents.items():
            self._seat(self.runs[job_id], resident, start.clock)
        heapq.heapify(self.events)
        self.slices: list[Slice] = []
        self.busy = 0.0
        self.finished = 0
        self.stretches = 0

    def run(self) -> Result:
        moments = 0
        while self.events:
            moments += 1
            if self.stop is not None and not moments % STOP_EVERY and self.stop():
                return self._result(complete=False)
            now = self.events[0][0]
            touched: set[int] = set()  # lanes whose resident set or readiness changed
            admissible = False  # only arrivals and ends make room: time alone never does
            while self.events and self.events[0][0] == now:
                _, kind, _, payload = heapq.heappop(self.events)
                if kind == ARRIVE:
                    self.pending[payload] = self.runs[payload]
                    admissible = True
                elif kind == READY:
                    run = self.runs[payload]
                    touched.update(run.lanes)
                    if run.end is not None:  # its last gap is over: it has exited
                        self._leave(run)
                        admissible = True
                else:
                    admissible |= self._end_stretch(payload, now)
            # (not before the clock: residents going on from older progress are in the past)
            if admissible and self.policy.waits_behind and self.gpus > 1 and now >= self.clock:
                touched.update(self._move_unstarted(now))
            if admissible and self.pending and self._room():
                touched.update(self._place(now))
            for index in touched:
                self._cut(self.lanes[index], now)
            if self.events and self.events[0][0] == now:
                continue  # a stretch was cut to end right now: settle it first
            self._dispatch(now)
        if self.finished != len(self.runs) and self.strict:
            stuck = sorted(r.job.id for r in self.runs.values() if r.end is None)
            raise RuntimeError(f"simulation ended with unfinished jobs {stuck[:10]}")
        return self._result(complete=True)

    def _result(self, complete: bool) -> Result:
        return Result(
            self.policy.name,
            sorted(self.runs.values(), key=lambda r: r.job.id),
            self.slices,
            self.busy,
            self.gpus,
            self.stretches,
            self.lanes_per_device,
            complete,
        )

    def _push(self, time: float, kind: int, payload) -> None:
        heapq.heappush(self.events, (time, kind, self.sequence, payload))
        self.sequence += 1

    def _seat(self, run: JobRun, resident: Resident, clock: float) -> None:
        """Put a job that is already running on its lanes, with what it has done; it is
        ready once its start-up is over (at the clock: the dispatch there is the first), or,
        iterating already, when its progress was measured."""
        run.lanes, run.start = resident.lanes, resident.start
        run.done, run.attained = resident.done, resident.attained
        measured = clock if resident.since is None else min(clock, resident.since)
        run.ready_at = measured if resident.done else max(clock, resident.start + run.job.startup)
        if resident.done:  # between two iterations then, as far as anyone knows
            run.released_at = measured
        for index in run.lanes:
            self.lanes[index].residents.append(run)
        self._push(run.ready_at, READY, run.job.id)

    def _ended(self, run: JobRun) -> None:
        """A job has ended (at ``run.end``): those that waited for it, and for nothing else
        now, arrive then."""
        self.finished += 1
        if self.progress is not None:
            self.progress(self.finished, len(self.runs))
        for job_id in self.dependants.pop(run.job.id, ()):
            waits = self.waiting_for[job_id]
            waits.discard(run.job.id)
            if not waits:
                self._push(max(run.end, self.earliest[job_id]), ARRIVE, job_id)

    # ----- admission ------------------------------------------------------------------
    def _device_residents(self) -> list[list[JobRun]]:
        """Each device's resident jobs (a multi-GPU job on each of its devices)."""
        residents: list[list[JobRun]] = [[] for _ in range(self.gpus)]
        for lane in self.lanes:
            residents[lane.device] += lane.residents
        return residents

    def _room(self) -> bool:
        """Whether any device could take a job now (else placement is not worth asking)."""
        return any(
            len(jobs) < self.max_resident and not any(r.gpus > 1 for r in jobs)
            for jobs in self._device_residents()
        )

    def _loads(self, now: float) -> list[admission.DeviceLoad]:
        """Each device as admission sees it (the daemon's Scheduler.loads)."""
        per_lane = self.lanes_per_device
        return [
            admission.DeviceLoad(
                name=self.names[device],
                gpu=True,
                index=device,
                held=self.held.get(device),
                lanes=[
                    admission.LaneLoad(
                        self.lane_capacity[device],
                        [
                            admission.Footprint(r.job.mem or 0)
                            for r in self.lanes[device * per_lane + k].residents
                        ],
                        self._starts_in(self.lanes[device * per_lane + k], now),
                        self.overheads[device] if self.overheads else 0,
                    )
                    for k in range(per_lane)
                ],
                max_resident=self.max_resident,
                residents=len(jobs),
                exclusive=any(r.gpus > 1 for r in jobs),
                free_at=max((r.start + r.job.limit for r in jobs), default=0.0),
            )
            for device, jobs in enumerate(self._device_residents())
        ]

    def _move_unstarted(self, now: float) -> set[int]:
        """Residents that have run no iteration go back to the queue where another device
        would start them sooner (admission.move, as the daemon's scheduler asks it at each
        of its passes); the lanes they left."""
        left: set[int] = set()
        while moved := self._move_one(now):
            left.update(moved)
        return left

    def _move_one(self, now: float) -> tuple[int, ...]:
        waiting = []
        for lane in self.lanes:
            current = lane.stretch.run if isinstance(lane.stretch, Stretch) else None
            for run in lane.residents:
                if run.done or run.gpus > 1 or run is current or run.start is None:
                    continue
                ahead = [
                    other
                    for other in lane.residents
                    if (other.job.submit_time, other.job.id) < (run.job.submit_time, run.job.id)
                ]
                waiting.append(
                    admission.Unstarted(
                        run.job.id,
                        self.names[lane.device],
                        admission.Footprint(run.job.mem or 0),
                        self._time_left(lane, ahead, now),
                        gpus=run.gpus,
                        only=None,
                    )
                )
        chosen = admission.move(waiting, self._loads(now), self.move_margin)
        if chosen is None:
            return ()
        run = self.runs[chosen]
        left = run.lanes
        for index in left:
            self.lanes[index].residents.remove(run)
        run.lanes, run.start, run.ready_at = (), None, 0.0
        self.pending[chosen] = run
        return left

    def _place(self, now: float) -> set[int]:
        """Admit pending jobs; the lanes that got one."""
        runs = self.runs
        order = self.policy.order([run.view() for run in self.pending.values()])
        requests = [runs[view.id].request for view in order]
        per_lane = self.lanes_per_device
        loads = self._loads(now)
        outcome = admission.place(
            requests, loads, now=now, backfill=self.backfill, waits_behind=self.policy.waits_behind
        )
        touched = set()
        for placement in outcome.placements:
            run = self.pending.pop(placement.job_id)
            run.lanes = tuple(
                self.device_index[name] * per_lane + placement.lane for name in placement.devices
            )
            run.start = now
            run.ready_at = now + run.job.startup
            for index in run.lanes:
                self.lanes[index].residents.append(run)
            touched.update(run.lanes)
            if run.job.startup:
                self._push(run.ready_at, READY, run.job.id)
        return touched

    def _starts_in(self, lane: Lane, now: float) -> float:
        """When a job placed on the lane now would get its first iteration, as the daemon
        predicts it: 0 unless the policy makes a newcomer wait behind the residents."""
        if not self.policy.waits_behind:
            return 0.0
        return self._time_left(lane, lane.residents, now)

    def _time_left(self, lane: Lane, runs: list[JobRun], now: float) -> float:
        """How long ``runs`` of the lane will still hold it, as the daemon predicts it
        (:func:`gq.policies.base.time_left`, from the progress they show by now). A job the
        trace gives no time limit is known perfectly: its steps left at its pace. (Its run
        alone taken as a limit counted from its placement, as the daemon counts a real
        one, made a job waiting behind others seem to end the sooner the longer it had
        waited: jobs were bound behind it, and moved, where it would in fact run its whole
        length.)"""
        total = 0.0
        for run in runs:
            done = 0
            stretch = lane.stretch
            if isinstance(stretch, Stretch) and stretch.run is run and now > stretch.begin:
                # iterations of the stretch released by now (the k-th at begin + k periods
                # less a gap): what a stretch of one at a time would have counted
                done = min(
                    stretch.count,
                    max(0, math.floor((now - stretch.begin + run.job.gap) / run.period + EPSILON)),
                )
            view = run.projected(done, run.released_at) if done else run.view()
            limit = run.job.time_limit
            if limit is None:
                view = replace(view, mean_iteration=run.job.iteration_time, mean_gap=run.job.gap)
            total += time_left(view, now - (run.start or now), limit)
        return total

    # ----- stretches ------------------------------------------------------------------
    def _cut(self, lane: Lane, now: float) -> None:
        """The lane's pick may change: end its stretch at the next iteration boundary."""
        stretch = lane.stretch
        if stretch is None or stretch.end <= now or isinstance(stretch, SharedWindow):
            return
        done, end = stretch.boundary_after(now)
        if done >= stretch.count:
            return
        stretch.count, stretch.end = done, end
        stretch.version = self.sequence
        self._push(end, STRETCH_END, (lane.index, stretch.version))

    def _end_stretch(self, payload: tuple[int, int], now: float) -> bool:
        """Settle a stretch; True if its job ended (and left room)."""
        index, version = payload
        lane = self.lanes[index]
        stretch = lane.stretch
        if stretch is None or stretch.version != version:
            return False  # cut short and re-dated
        if isinstance(stretch, SharedWindow):
            self._settle_window(lane, stretch, now)
            return False
        run = stretch.run
        self._record(lane, stretch)
        run.finish_iterations(stretch.count, stretch.released_at)
        for other in run.lanes:
            self.lanes[other].stretch = None
            self.lanes[other].owner = None
        if run.done >= run.job.iterations:
            # Its process sleeps through its last gap, then exits (taking its teardown):
            # resident until then, and never ready again.
            run.end = run.ready_at = run.ready_at + run.job.teardown
            self._ended(run)
            if run.end <= now:
                self._leave(run)
                return True
        if run.ready_at > now:
            self._push(run.ready_at, READY, run.job.id)
        return False

    def _leave(self, run: JobRun) -> None:
        for index in run.lanes:
            self.lanes[index].residents.remove(run)

    def _settle_window(self, lane: Lane, window: SharedWindow, now: float) -> None:
        """Credit each job its turns (none ends inside a window); on the timeline each job's
        turns are drawn as one piece, in turn order of their first grant."""
        begin = window.begin
        for run, count in window.counts:
            run.finish_iterations(count, now)
            length = count * run.job.iteration_time
            self.slices.append(self._slice(lane, run, begin, begin + length))
            self.busy += length
            begin += length
        lane.stretch = None
        lane.last_job = None

    def _record(self, lane: Lane, stretch: Stretch) -> None:
        run = stretch.run
        end = stretch.released_at
        self.busy += stretch.count * run.job.iteration_time * len(run.lanes)
        previous = self.slices[-1] if self.slices else None
        if previous and (previous.device, previous.lane, previous.job, previous.end) == (
            lane.device,
            lane.index % self.lanes_per_device,
            run.job.id,
            stretch.begin,
        ):
            self.slices[-1] = self._slice(lane, run, previous.start, end)
        else:
            self.slices.append(self._slice(lane, run, stretch.begin, end))

    def _slice(self, lane: Lane, run: JobRun, start: float, end: float) -> Slice:
        return Slice(lane.device, run.job.id, start, end, lane.index % self.lanes_per_device)

    def _dispatch(self, now: float) -> None:
        for lane in self.lanes:
            if lane.stretch is not None or lane.owner is not None:
                continue
            ready = [r for r in lane.residents if r.ready_at <= now and r.lanes[0] == lane.index]
            if not ready:
                continue
            ready_views = [r.view() for r in ready]
            resident_views = [r.view() for r in lane.residents]
            in_gaps = [
                awaited
                for run, view in zip(lane.residents, resident_views)
                if run.ready_at > now
                and (awaited := lane_rule.awaited(view, run.released_at, self._measured_gap(run)))
            ]
            decision = lane_rule.next_step(self.policy, ready_views, resident_views, in_gaps, now)
            if not isinstance(decision, lane_rule.Grant):
                continue
            chosen_view = decision.job
            run = self.runs[chosen_view.id]
            if any(self.lanes[i].stretch is not None for i in run.lanes):
                continue
            window = self._shared_window(lane, ready, ready_views, now)
            if window is not None:
                lane.stretch = window
                self.stretches += 1
                self._push(window.end, STRETCH_END, (lane.index, window.version))
                continue
            switch = self.switch_cost if lane.last_job not in (None, run.job.id) else 0.0
            begin = now + switch
            count = self._length(lane, run, chosen_view, ready_views, resident_views, begin)
            stretch = Stretch(run, begin, count, run.release_after(begin, count), self.sequence)
            for index in run.lanes:
                self.lanes[index].stretch = stretch
                self.lanes[index].last_job = run.job.id
                if index != lane.index:
                    self.lanes[index].owner = run
            self.stretches += 1
            self._push(stretch.end, STRETCH_END, (lane.index, stretch.version))

    @staticmethod
    def _measured_gap(run: JobRun) -> float | None:
        """The job's gap as its host knows it: measured once it has run a few iterations."""
        return run.job.gap if run.job.gap > 0 and run.done >= MEASURED_AFTER else None

    @classmethod
    def _anticipated(cls, run: JobRun) -> bool:
        """Whether the host would keep the lane for the job in its gaps, if preferred."""
        return anticipation_window(cls._measured_gap(run)) is not None

    def _shared_window(
        self, lane: Lane, ready: list[JobRun], ready_views: list[JobView], now: float
    ) -> SharedWindow | None:
        """The turns the policy's sharers take before the next event, settled at once
        (:mod:`gq.sim.turns`); None where ordinary stretches are due: some resident job is
        not ready, a switch has a cost, or there is not room for two turns each."""
        if (
            not isinstance(self.policy, TakesTurns)
            or self.step_by_step
            or self.switch_cost
            or self.share_slice
            or len(ready) != len(lane.residents)
        ):
            return None
        views = self.policy.sharers(ready_views)
        group = [self.runs[view.id] for view in views]
        if len(group) < 2 or any(r.gpus > 1 or r.job.gap for r in group):
            return None
        budget = self.events[0][0] - now if self.events else math.inf
        if budget < 2 * sum(r.job.iteration_time for r in group):
            return None
        service = self.policy.service
        counts = turns.settle(
            self.policy,
            [
                turns.Sharer(
                    view,
                    run.job.iteration_time,
                    service(run.projected(1, None)) - service(view),
                    run.job.iterations - run.done - 1,
                )
                for view, run in zip(views, group)
            ],
            budget,
        )
        if counts is None or sum(counts) < 2 * len(group):
            return None
        order = sorted(
            zip(group, counts),
            key=lambda pair: (pair[0].attained, pair[0].job.submit_time, pair[0].job.id),
        )
        length = sum(n * r.job.iteration_time for r, n in order)
        return SharedWindow([(r, n) for r, n in order if n], now, now + length, self.sequence)

    def _length(
        self,
        lane: Lane,
        run: JobRun,
        chosen: JobView,
        ready: list[JobView],
        resident: list[JobView],
        begin: float,
    ) -> int:
        """How many iterations the chosen job runs before the policy is asked again. A job
        with gaps runs one, unless nothing else could take the lane in its gaps: it is alone
        on the lane, or the host anticipates it."""
        left = run.job.iterations - run.done
        if self.step_by_step:
            return 1
        if run.job.gap and len(resident) > 1 and not self._anticipated(run):
            return 1
        if run.done < MEASURED_AFTER:  # its view changes in kind once its pace is known
            left = min(left, MEASURED_AFTER - run.done)
        waking = [r.ready_at for r in lane.residents if r.ready_at > begin]
        if waking:
            # A job becoming ready cuts the stretch after the iteration running then; asking
            # beyond it could even mislead: gapfit's pick returns once a gap has overrun.
            left = min(left, max(1, math.ceil((min(waking) - begin) / run.period - EPSILON)))
        if len(resident) == 1:
            return left
        period = run.period
        count = run_length(
            self.policy,
            chosen,
            ready,
            resident,
            lambda k: (run.projected(k, run.release_after(begin, k)), begin + k * period),
            left,
        )
        if self.share_slice and count < left:
            count = min(left, max(count, math.ceil(self.share_slice * run.job.iterations)))
        return count
