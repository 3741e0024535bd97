"""Forecasts: when each job of the live queue will start and end (``gq status --start``,
``gq submit --test-only``). Pure: the simulator (:mod:`gq.sim.simulator`) run from a
:class:`Snapshot` of the node, which the daemon builds from what its scheduling pass reads
and what admission sees (:class:`gq.daemon.admission.DeviceLoad`, ``Request``, the policy's
``JobView``), so the forecast runs the same policy and admission code as the node itself.

What a job will still do is its :class:`Work`. It is known when the job gave ``--steps``
and its pace has been measured; estimated (``~``) from its time limit, from its owner's
recent jobs of the same name (:class:`Past`) or the pace of one running now; else unknown
(``?``), simulated as running for :data:`HORIZON`. A forecast is as good as the worst of
its own work and that of every job that shares a lane with it before it ends; one beyond
half the horizon is unknown. A job's forecast end is never later than its start plus its
time limit (it is ended there).
"""

from __future__ import annotations

import bisect
import enum
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gq import defaults, policies
from gq.daemon import admission
from gq.policies import JobView
from gq.sim.node import MEASURED_AFTER
from gq.sim.results import Result
from gq.sim.simulator import Resident, Start, simulate
from gq.sim.traces import TraceJob

HORIZON = 365 * 86400.0  # seconds an unknown job is simulated to run
UNKNOWN_PACE = 1.0  # seconds an iteration of a job whose pace nothing tells


class Basis(enum.IntEnum):
    """How much a forecast knows, better first (the worst of several wins)."""

    KNOWN = 0
    ESTIMATED = 1  # shown with "~"
    UNKNOWN = 2  # shown as "?"

    @property
    def mark(self) -> str:
        return ("", "~", "?")[self]


@dataclass(frozen=True)
class Work:
    """What a job will do in all (``steps`` iterations of ``iteration`` seconds on the
    device, each followed by ``gap`` idle seconds, after ``startup`` seconds, and
    ``teardown`` seconds from its last iteration to its exit), and how well that is known."""

    steps: int
    iteration: float
    gap: float
    startup: float
    basis: Basis
    teardown: float = 0.0


@dataclass(frozen=True)
class Past:
    """The owner's recent ended jobs of the same name, as medians: seconds from start to
    end, iterations, seconds an iteration and a gap (None where they ran none); the least
    overhead (run time less device and idle time: start-up, exit, and any wait for a lane);
    and, where their hosts measured it, their start-up (launch to first acquire) and the
    least exit (the overhead less the start-up). Where none has ended, the pace and
    start-up of one running now (:func:`running_pace`): no run or steps in all then."""

    run: float | None
    steps: int | None
    iteration: float | None
    gap: float | None
    overhead: float
    startup: float | None = None
    exit: float | None = None

    @property
    def start_cost(self) -> float:
        """Seconds from a job's start to its first iteration, as well as they are known: as
        measured, else the whole overhead (where no start-up was measured, runs of a host
        from before)."""
        return self.overhead if self.startup is None else self.startup

    @property
    def exit_cost(self) -> float:
        """Seconds from its last iteration to its exit: as measured, else the overhead not
        spent starting, never more than starting took (an overhead also holds waits for a
        shared lane)."""
        if self.exit is not None:
            return self.exit
        return max(0.0, min(self.overhead - self.start_cost, self.start_cost))


@dataclass(frozen=True)
class Ended:
    """One ended job, as :func:`past` summarises them."""

    run: float
    steps: int
    attained: float
    iteration: float | None
    gap: float | None
    startup: float | None = None


def past(ended: Sequence[Ended]) -> Past | None:
    """The summary of a user's recent jobs of one name (None: there were none)."""
    if not ended:
        return None
    paces = [job.iteration for job in ended if job.iteration]
    gaps = [job.gap or 0.0 for job in ended if job.iteration]
    overheads = [max(0.0, job.run - job.attained - job.steps * (job.gap or 0.0)) for job in ended]
    startups = [
        (job.startup, overhead)
        for job, overhead in zip(ended, overheads)
        if job.startup is not None
    ]
    return Past(
        run=statistics.median(job.run for job in ended),
        steps=round(statistics.median(job.steps for job in ended)),
        iteration=statistics.median(paces) if paces else None,
        gap=statistics.median(gaps) if gaps else None,
        overhead=min(overheads),
        startup=statistics.median(s for s, _ in startups) if startups else None,
        exit=min(max(0.0, o - s) for s, o in startups) if startups else None,
    )


def running_pace(running: Sequence[Running]) -> dict[tuple[str, str], Past]:
    """Each (user, name)'s pace and start-up as the first of their running jobs of that name
    whose pace is measured shows them: what a job of the same name goes on where none has
    ended yet (a sweep's first runs), rather than its whole time limit."""
    paces: dict[tuple[str, str], Past] = {}
    for job in running:
        view = job.view
        key = (view.user, job.name)
        if key in paces or view.mean_iteration is None or view.steps_done < MEASURED_AFTER:
            continue
        startup = job.startup or 0.0
        paces[key] = Past(
            run=None,
            steps=None,
            iteration=view.mean_iteration,
            gap=view.mean_gap or 0.0,
            overhead=startup,
            startup=startup,
        )
    return paces


def work(
    view: JobView,
    time_limit: float | None,
    previous: Past | None,
    elapsed: float | None = None,
    typical: float | None = None,
) -> Work:
    """What the job will do in all, from its view (steps given and done, pace measured),
    its time limit, and its owner's recent jobs of the same name; ``elapsed``: seconds
    it has run (None: it has not started); ``typical``: the run time of the node's recent
    jobs, what a job nothing else tells of is simulated to run (its forecast is unknown all
    the same, but its neighbours' are better bounds than behind a job that never ends)."""
    # (a pace of 0 is no pace: a job that has run no time yet, or whose figures are odd)
    measured = bool(view.mean_iteration) and view.steps_done >= MEASURED_AFTER
    if measured:
        iteration, gap = view.mean_iteration, view.mean_gap or 0.0
    elif previous is not None and previous.iteration:
        iteration, gap = previous.iteration, previous.gap or 0.0
    else:
        iteration, gap = None, 0.0
    startup = previous.start_cost if previous is not None else 0.0
    teardown = previous.exit_cost if previous is not None else 0.0
    if view.steps_total is not None and iteration is not None:
        basis = Basis.KNOWN if measured else Basis.ESTIMATED
        return Work(view.steps_total, iteration, gap, startup, basis, teardown)
    if view.steps_total is not None and time_limit:
        # spread over its steps: the slowest pace that ends in time
        per_step = max(time_limit - startup, 0.0) / view.steps_total
        return Work(view.steps_total, per_step, 0.0, startup, Basis.ESTIMATED)
    if (
        view.steps_total is None
        and previous is not None
        and previous.steps is not None
        and previous.iteration
        and iteration
    ):
        steps = max(previous.steps, view.steps_done + 1)
        return Work(steps, iteration, gap, startup, Basis.ESTIMATED, teardown)
    run = previous.run if previous is not None and view.steps_total is None else None
    if time_limit is not None:
        run = min(run, time_limit) if run is not None else time_limit
    if run is not None:
        return _running_for(view, run, elapsed, iteration, gap, startup, Basis.ESTIMATED)
    if typical is not None:
        return _running_for(view, typical, elapsed, iteration, gap, startup, Basis.UNKNOWN)
    measured_pace = view.mean_iteration if measured else None
    return _running_for(view, HORIZON, elapsed, measured_pace, gap, startup, Basis.UNKNOWN)


def _running_for(
    view: JobView,
    run: float,
    elapsed: float | None,
    iteration: float | None,
    gap: float,
    startup: float,
    basis: Basis,
) -> Work:
    """A job that runs ``run`` seconds in all, iterations at its pace where one is known
    (else of :data:`UNKNOWN_PACE` after its start-up): what is left, as iterations."""
    period = (iteration + gap) if iteration else UNKNOWN_PACE
    left = max(run - (elapsed or 0.0), period)
    steps = view.steps_done + max(1, math.ceil(left / period))
    return Work(
        steps,
        iteration or UNKNOWN_PACE,
        gap if iteration else 0.0,
        0.0 if iteration else startup,
        basis,
    )


@dataclass(frozen=True)
class Running:
    """A job resident on the node: its progress, where it is, since when."""

    view: JobView
    work: Work
    devices: tuple[str, ...]
    lane: int
    started: float
    memory: int  # bytes of device memory it holds or declared, whichever is larger
    time_limit: float | None
    name: str = ""
    startup: float | None = None  # seconds it took to its first acquire (None: not yet)
    measured_at: float | None = None  # when its progress was measured (None: ``now``)


@dataclass(frozen=True)
class Pending:
    """A job that may start: as the policy orders it and admission places it, what it will
    do, and what it waits for besides room (its begin time; jobs that must end first)."""

    view: JobView
    request: admission.Request
    work: Work
    begin_time: float | None = None
    after: tuple[int, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """The node as the daemon sees it at ``now`` (seconds since the epoch)."""

    now: float
    policy: tuple[str, str, str]  # name, fill, quantum
    devices: tuple[admission.DeviceLoad, ...]  # as admission sees them, held ones too
    lanes: int
    max_resident: int
    running: tuple[Running, ...] = ()
    pending: tuple[Pending, ...] = ()
    move_margin: float = defaults.MOVE_MARGIN


@dataclass(frozen=True)
class Forecast:
    """When a job starts and ends (seconds since the epoch; None: unknown), where, and how
    well that is known."""

    job_id: int
    start: float | None
    end: float | None
    device: str | None
    basis: Basis

    @classmethod
    def unknown(cls, job_id: int) -> Forecast:
        return cls(job_id, None, None, None, Basis.UNKNOWN)


@dataclass
class Forecasts:
    made_at: float
    jobs: dict[int, Forecast] = field(default_factory=dict)
    complete: bool = True  # False: the time budget ran out; later jobs are unknown
    seconds: float = 0.0  # what making it cost


def forecast(snapshot: Snapshot, stop: Callable[[], bool] | None = None) -> Forecasts:
    """Every running and pending job's forecast; ``stop`` ends the simulation early (jobs
    it had not yet started or ended are then unknown)."""
    seeded = _Seeded.of(snapshot)
    found = Forecasts(snapshot.now, dict(seeded.unknown))
    if not seeded.traces or not snapshot.devices:
        return found
    devices = snapshot.devices
    result = simulate(
        seeded.traces,
        policies.make(*snapshot.policy),
        gpus=len(devices),
        lanes=snapshot.lanes,
        max_resident=snapshot.max_resident,
        move_margin=snapshot.move_margin,
        stop=stop,
        start=seeded.start,
    )
    found.complete = result.complete
    shared = _neighbours_basis(result, seeded.basis, snapshot.lanes)
    for run in result.runs:
        job_id, start, end = run.job.id, run.start, run.end
        if start is None or start > HORIZON / 2:
            found.jobs[job_id] = Forecast.unknown(job_id)
            continue
        if end is not None and run.job.time_limit is not None:
            end = min(end, start + run.job.time_limit)  # it is ended there
        if end is not None:
            end = max(end, 0.0)  # one going on from older progress may seem to have ended
        quality = max(seeded.basis[job_id], shared.get(job_id, Basis.KNOWN))
        if end is None or end > HORIZON / 2:
            quality = Basis.UNKNOWN
        found.jobs[job_id] = Forecast(
            job_id,
            snapshot.now + start,
            None if quality is Basis.UNKNOWN else snapshot.now + end,
            ",".join(devices[lane // snapshot.lanes].name for lane in run.lanes) or None,
            quality,
        )
    return found


@dataclass
class _Seeded:
    """A snapshot as the simulator takes it: times from ``now`` (0), the running jobs'
    remaining work on their lanes, the pending ones' arrivals; the jobs left out, unknown."""

    traces: list[TraceJob]
    start: Start
    basis: dict[int, Basis]
    unknown: dict[int, Forecast]

    @classmethod
    def of(cls, snapshot: Snapshot) -> _Seeded:
        now, lanes = snapshot.now, snapshot.lanes
        index = {device.name: position for position, device in enumerate(snapshot.devices)}
        traces, residents, arrivals, after, basis, unknown = [], {}, {}, {}, {}, {}
        placed = [
            job
            for job in snapshot.running
            if job.devices and all(name in index for name in job.devices)
        ]
        running_ids = {job.view.id for job in placed}
        pending_ids = _reachable(snapshot.pending, running_ids)
        for job in placed:
            view = job.view
            trace = _trace(
                view,
                job.work,
                job.memory,
                len(job.devices),
                job.time_limit,
                now,
                floor=view.steps_done + 1,
            )
            traces.append(trace)
            residents[view.id] = Resident(
                tuple(index[name] * lanes + job.lane for name in job.devices),
                job.started - now,
                min(view.steps_done, trace.iterations - 1),
                view.attained,
                since=None if job.measured_at is None else min(job.measured_at - now, 0.0),
            )
            basis[view.id] = job.work.basis
        for job in snapshot.pending:
            view, request = job.view, job.request
            if view.id not in pending_ids:
                unknown[view.id] = Forecast.unknown(view.id)
                continue
            footprint = request.footprint
            traces.append(
                _trace(
                    view,
                    job.work,
                    footprint.persistent + footprint.ephemeral,
                    request.gpus,
                    request.time_limit,
                    now,
                )
            )
            if job.begin_time is not None:
                arrivals[view.id] = job.begin_time - now
            if job.after:
                after[view.id] = job.after
            basis[view.id] = job.work.basis
        for job in snapshot.running:
            if job.view.id not in running_ids:  # on a device the snapshot does not have
                unknown[job.view.id] = Forecast.unknown(job.view.id)
        devices = snapshot.devices
        start = Start(
            clock=0.0,
            residents=residents,
            arrivals=arrivals,
            after=after,
            held={position: device.held for position, device in enumerate(devices) if device.held},
            names=tuple(device.name for device in devices),
            capacities=tuple(sum(lane.capacity for lane in device.lanes) for device in devices),
            overheads=tuple(
                max((lane.overhead for lane in device.lanes), default=0) for device in devices
            ),
        )
        return cls(traces, start, basis, unknown)


def _reachable(pending: Sequence[Pending], running: set[int]) -> set[int]:
    """The pending jobs whose dependencies the simulation can follow: those that wait for
    nothing, or only for running jobs and other such pending ones (not for a held job, one
    outside the snapshot, or each other)."""
    reachable: set[int] = set()
    left = list(pending)
    while True:
        more = [job for job in left if all(i in running or i in reachable for i in job.after)]
        if not more:
            return reachable
        reachable.update(job.view.id for job in more)
        left = [job for job in left if job.view.id not in reachable]


def _trace(
    view: JobView,
    work: Work,
    memory: int,
    gpus: int,
    time_limit: float | None,
    now: float,
    floor: int = 1,
) -> TraceJob:
    steps = max(work.steps, floor)
    return TraceJob(
        view.id,
        view.submit_time - now,
        steps * work.iteration,
        steps,
        gpus=max(1, gpus),
        priority=view.priority,
        user=view.user,
        mem=memory or None,
        startup=work.startup,
        time_limit=None if time_limit is None else float(time_limit),
        deadline=None if view.deadline is None else view.deadline - now,
        gap=work.gap,
        teardown=work.teardown,
    )


def _neighbours_basis(result: Result, basis: dict[int, Basis], lanes: int) -> dict[int, Basis]:
    """For each job, the worst basis among the jobs that ran on one of its lanes before it
    ended, itself included (an unknown one makes a forecast estimated, not unknown: the
    forecast is then a bound)."""
    by_lane: dict[int, list[tuple[float, Basis]]] = {}
    for piece in result.slices:
        seen = min(basis[piece.job], Basis.ESTIMATED)
        by_lane.setdefault(piece.device * lanes + piece.lane, []).append((piece.start, seen))
    prefixes: dict[int, tuple[list[float], list[Basis]]] = {}
    for lane, pieces in by_lane.items():
        pieces.sort(key=lambda piece: piece[0])
        worst, running = [], Basis.KNOWN
        for _, seen in pieces:
            running = max(running, seen)
            worst.append(running)
        prefixes[lane] = ([start for start, _ in pieces], worst)
    found: dict[int, Basis] = {}
    for run in result.runs:
        if run.end is None:
            continue
        for lane in run.lanes:
            starts, worst = prefixes.get(lane, ([], []))
            before = bisect.bisect_left(starts, run.end)  # pieces begun before it ended
            if before:
                found[run.job.id] = max(found.get(run.job.id, Basis.KNOWN), worst[before - 1])
    return found


def delays(before: Forecasts, after: Forecasts) -> dict[int, float]:
    """How much later each job would end in ``after`` than in ``before`` (jobs delayed by a
    second or more; those whose forecast is unknown in either are left out)."""
    moved = {}
    for job_id, old in before.jobs.items():
        new = after.jobs.get(job_id)
        if new is None or old.end is None or new.end is None:
            continue
        if new.end - old.end >= 1.0:
            moved[job_id] = new.end - old.end
    return moved
