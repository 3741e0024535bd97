"""A discrete-event simulator of one gq node, iteration-exact, that advances in bulk.

Events are arrivals, job start-ups and the ends of *stretches*: runs of consecutive
iterations one job gets on a device. At every event the daemon's admission code places
pending jobs in the policy's order; whenever a device is free the policy's ``pick`` chooses
who runs next, exactly as the execution host does at an iteration boundary. Instead of
asking again after every iteration, the simulator asks the policy how long its pick would
stay the same if nothing else happened (:func:`gq.policies.base.run_length`) and schedules
that whole stretch as one event. Anything that may change the pick on a device (a job placed
on it, a resident job becoming ready) cuts its stretch short at the next iteration boundary,
where the iteration-by-iteration simulation would have asked the policy again. Jobs of a
policy that takes turns (:class:`gq.policies.base.TakesTurns`: fair, rr, priority's equal
priorities) take all their turns up to the next event in one
:class:`gq.sim.node.SharedWindow`, computed in closed form (:mod:`gq.sim.turns`). So the two
agree (``step_by_step=True`` runs one iteration per stretch), except where a stretch is
given a floor: ``share_slice`` (a share of the job's iterations) makes jobs that would take
turns every iteration take them in slices instead, which bounds the events of a long trace
at a small cost in accuracy. It is 0 (exact) unless switches cost time, which closed-form
turns do not model: then 0.1 % for policies whose pick alternates by nature (``fair``).

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

This module holds the entry point and its event loop; the node's state is in
:mod:`gq.sim.node`, placing and moving jobs in :mod:`gq.sim.placement`, running and settling
stretches in :mod:`gq.sim.stretches`, and what a run hands back in :mod:`gq.sim.results`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gq import defaults
from gq.exec.lane.packing import Packer
from gq.policies import Policy
from gq.policies.base import TakesTurns
from gq.sim.events import ARRIVE, LOOK, READY
from gq.sim.lanes_auto import LanesAuto
from gq.sim.node import MEASURED_AFTER, JobRun, Lane
from gq.sim.placement import Placement
from gq.sim.results import Result, Slice
from gq.sim.stretches import Stretches
from gq.sim.traces import TraceJob

DEFAULT_SHARE_SLICE = 0.001  # of a job's iterations, for policies that alternate
STOP_EVERY = 256  # moments between two questions to ``stop``


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
    # --lanes auto: devices (by index) whose host reports its jobs side by side, paying
    # this gain over taking turns (they go on so, on the lanes their packer plans)
    packed: dict[int, float] = field(default_factory=dict)


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
    packing: bool = False,
    progress: Callable[[int, int], None] | None = None,
    move_margin: float = defaults.MOVE_MARGIN,
    start: Start | None = None,
    stop: Callable[[], bool] | None = None,
    horizon: float = math.inf,
) -> Result:
    """Run the trace through ``policy`` on ``gpus`` devices of ``lanes`` lanes each (a lane
    runs one iteration at a time, lanes of a device at once; ``capacity``, a device's
    memory, is split between them; a multi-GPU job takes whole devices and runs on one lane
    of each; how fast jobs side by side go: :mod:`gq.sim.side`). ``packing``: the lanes
    run at once only where the host's packer finds it pays (``--lanes auto``, up to
    ``lanes``: :mod:`gq.sim.lanes_auto`), admission seeing each device as one lane. For
    backfill a job's time limit is its trace limit, else its run time alone (a perfect
    estimate). ``step_by_step`` asks the policy after every iteration (the
    reference the bulk advance is tested against); ``progress`` is called with (jobs
    finished, jobs) as jobs end; ``move_margin`` is the daemon's --move-margin; ``start``
    seeds a node that already runs jobs (:class:`Start`); ``stop``, asked every few hundred
    events, ends the run early when it says so (a result that is not ``complete``);
    ``horizon``: the time past which no start or end matters (a forecast's: it reports
    none so late), the run ending, ``complete``, once none can come before it."""
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
        packing,
        progress,
        move_margin,
        start,
        stop,
        horizon,
    )
    return simulation.run()


class _Simulation(Placement, Stretches, LanesAuto):
    """One run: its state, and the event loop that drives placement and stretches."""

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
        packing,
        progress,
        move_margin,
        start,
        stop,
        horizon,
    ):
        # A trace's every job ends; on a live node (``start``) one may never start (it waits
        # for devices that take no job): it is left with no end.
        self.strict = start is None
        start = start or Start(clock=-math.inf)
        self.clock = start.clock
        self.policy = policy
        self.turn_taker = policy if isinstance(policy, TakesTurns) else None
        self.gpus = gpus
        self.lanes_per_device = lanes
        self.switch_cost = switch_cost
        every = capacity if capacity is not None else 1 << 62
        memories = [start.capacities[d] if start.capacities else every for d in range(gpus)]
        # (under --lanes auto admission sees one lane of all the device's memory)
        self.admitted_lanes = 1 if packing else lanes
        self.lane_capacity = [memory // self.admitted_lanes for memory in memories]
        known = capacity is not None or bool(start.capacities)
        self.packers = (
            [Packer(lanes, memory if known else None) for memory in memories] if packing else []
        )
        self.look_at = [math.inf] * len(self.packers)
        self.moving = set()
        self.overheads = start.overheads
        self.max_resident = max_resident or 1 << 30
        self.backfill = backfill
        self.step_by_step = step_by_step
        if share_slice is None:  # turns are settled in closed form unless switches cost
            share_slice = DEFAULT_SHARE_SLICE if policy.alternates and switch_cost else 0.0
        self.share_slice = share_slice
        self.progress = progress
        self.stop = stop
        self.horizon = horizon
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
        for device, gain in start.packed.items():
            self._resume(device, gain, start.clock)
        heapq.heapify(self.events)
        self.slices: list[Slice] = []
        self.busy = 0.0
        self.finished = 0
        self.stretches = 0

    def run(self) -> Result:
        moments = 0
        while self.events:
            moments += 1
            now = self.events[0][0]
            if not moments % STOP_EVERY:
                if self.stop is not None and self.stop():
                    return self._result(complete=False)
                if self.horizon < math.inf and self._past_horizon(now):
                    self._record_under_way()
                    return self._result(complete=True)
            touched: set[int] = set()  # lanes whose resident set or readiness changed
            admissible = False  # only arrivals and ends make room: time alone never does
            due: set[int] = set()  # devices whose packer's look is due
            while self.events and self.events[0][0] == now:
                _, kind, _, payload = heapq.heappop(self.events)
                if kind == ARRIVE:
                    self.pending[payload] = self.runs[payload]
                    admissible = True
                elif kind == LOOK:
                    if self.look_at[payload] == now:  # (else a later one replaced it)
                        due.add(payload)
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
            if self.packers:
                touched.update(self._looks(now, due))
            for index in touched:
                self._cut(self.lanes[index], now)
            if self.events and self.events[0][0] == now:
                continue  # a stretch was cut to end right now: settle it first
            self._dispatch(now)
            self._reslow(now)
        if self.finished != len(self.runs) and self.strict:
            stuck = sorted(r.job.id for r in self.runs.values() if r.end is None)
            raise RuntimeError(f"simulation ended with unfinished jobs {stuck[:10]}")
        return self._result(complete=True)

    def _past_horizon(self, now: float) -> bool:
        """Whether no job can start, move or end before the horizon any more: none is left
        to arrive (room comes only from arrivals and ends) and none on a lane can move or
        end before it. Jobs of unknown length taking turns with host gaps between
        iterations, one event each, otherwise kept a forecast at work until its budget ran
        out."""
        if self.moving or any(kind == ARRIVE for _, kind, _, _ in self.events):
            return False
        movable = self.policy.waits_behind and self.gpus > 1
        begins = [lane.stretch.begin for lane in self.lanes if lane.stretch is not None]
        since = min([now, *begins])
        return all(
            self._stays_past(run, since, movable) for lane in self.lanes for run in lane.residents
        )

    def _stays_past(self, run: JobRun, since: float, movable: bool) -> bool:
        """Whether a job on a lane neither moves to another device (under a policy that
        moves those that have run no iteration) nor ends before the horizon: not by its
        work, were it alone from ``since`` (the earliest stretch under way) with its own
        gaps between its iterations, nor by its time limit."""
        job = run.job
        if run.end is not None or (movable and not run.done and run.gpus == 1):
            return False
        alone = (job.iterations - run.done) * (job.iteration_time + job.gap) - job.gap
        limit = job.time_limit
        return since + alone > self.horizon and (
            limit is None or (run.start or since) + limit > self.horizon
        )

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

    def _seat(self, run: JobRun, resident: Resident, clock: float) -> None:
        """Put a job that is already running on its lanes, with what it has done; it is
        ready once its start-up is over (at the clock: the dispatch there is the first), or,
        iterating already, when its progress was measured."""
        run.lanes, run.start = resident.lanes, resident.start
        run.done, run.attained = resident.done, resident.attained
        run.held, run.timed = resident.attained, resident.done >= MEASURED_AFTER
        measured = clock if resident.since is None else min(clock, resident.since)
        run.ready_at = measured if resident.done else max(clock, resident.start + run.job.startup)
        if resident.done:  # between two iterations then, as far as anyone knows
            run.released_at = measured
        for index in run.lanes:
            self.lanes[index].residents.append(run)
        self._push(run.ready_at, READY, run.job.id)

    def _resume(self, device: int, gain: float, clock: float) -> None:
        """A device whose host reports its jobs side by side: its packer takes the packing
        up, and they are seated on the lanes it plans."""
        jobs = self._packable(device, clock)
        if len(jobs) < 2 or not self.packers:
            return
        packer = self.packers[device]
        packer.resume([self._sample(run, clock) for run in jobs], gain, clock)
        self.look_at[device] = packer.next_look(clock)
        self._push(self.look_at[device], LOOK, device)
        plan, per = packer.plan(), self.lanes_per_device
        for run in jobs:
            self.lanes[run.lanes[0]].residents.remove(run)
            run.lanes = (device * per + plan.get(run.job.id, 0),)
            self.lanes[run.lanes[0]].residents.append(run)

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
