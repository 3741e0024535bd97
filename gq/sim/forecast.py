"""Forecasts: when each job of the live queue will start and end (``gq status --start``,
``gq submit --test-only``). Pure: the simulator (:mod:`gq.sim.simulator`) run from a
:class:`Snapshot` of the node, which the daemon builds from what its scheduling pass reads
and what admission sees (``DeviceLoad``, ``Request``, the policy's ``JobView``: see
:mod:`gq.daemon.scheduling.admission`), so the forecast runs the same policy and admission
code as the node itself.

What a job will still do is its :class:`~gq.sim.work_estimates.Work`, known, estimated
(``~``) or unknown (``?``): see :mod:`gq.sim.work_estimates`. A forecast is as good as the
worst of its own work and that of every job that shares a lane with it before it ends; one
beyond half the horizon is unknown. A job's forecast end is never later than its start plus
its time limit (it is ended there).

Under ``--lanes auto`` the simulated host packs jobs as the real one does
(:mod:`gq.sim.lanes_auto`); a device whose host reports its jobs side by side
(:class:`Sharing`) goes on so, each of them at the speed its host measured them at there
(the gain over taking turns, shared evenly: :func:`gq.sim.side.busy_for_gain`). Only the
host's figure counts: nothing a job says of itself is taken for how much of its device it
leaves to others, and a job no report shows side by side is taken to keep its device busy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gq import defaults, policies
from gq.daemon.scheduling import admission
from gq.exec.lane import packing
from gq.policies import JobView
from gq.sim import side
from gq.sim.node import MEASURED_AFTER
from gq.sim.results import Result
from gq.sim.simulator import Resident, Start, simulate
from gq.sim.traces import TraceJob
from gq.sim.work_estimates import HORIZON, Basis, Past, Work


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
class Sharing:
    """How a device's host last reported its jobs sharing it under ``--lanes auto``: side by
    side (``packed``) or taking turns, the jobs of each lane in use, the last gain over
    taking turns it measured, and the most lanes it may run at once."""

    device: str
    packed: bool
    lanes: tuple[tuple[int, ...], ...]
    gain: float | None
    most: int


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
    packing: tuple[Sharing, ...] | None = None  # --lanes auto: the hosts' reports (else None)

    @property
    def lanes_at_once(self) -> int:
        """Lanes a device has in the simulation: the daemon's, or under --lanes auto the
        most its hosts may run at once (a GPU's, until one has said)."""
        if self.packing is None:
            return self.lanes
        most = max((s.most for s in self.packing), default=packing.most_lanes(cuda=True))
        return max(1, min(most, defaults.MAX_LANES))


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
    devices, per = snapshot.devices, snapshot.lanes_at_once
    result = simulate(
        seeded.traces,
        policies.make(*snapshot.policy),
        gpus=len(devices),
        lanes=per,
        packing=snapshot.packing is not None,
        max_resident=snapshot.max_resident,
        move_margin=snapshot.move_margin,
        stop=stop,
        start=seeded.start,
        horizon=HORIZON / 2,  # (what starts or ends later is reported unknown)
    )
    found.complete = result.complete
    shared = _neighbours_basis(result, seeded.basis, per)
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
            None if end is None or quality is Basis.UNKNOWN else snapshot.now + end,
            ",".join(devices[lane // per].name for lane in run.lanes) or None,
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
        now, lanes = snapshot.now, snapshot.lanes_at_once
        index = {device.name: position for position, device in enumerate(snapshot.devices)}
        traces, residents, arrivals, after, basis, unknown = [], {}, {}, {}, {}, {}
        placed = [
            job
            for job in snapshot.running
            if job.devices and all(name in index for name in job.devices)
        ]
        running_ids = {job.view.id for job in placed}
        pending_ids = _reachable(snapshot.pending, running_ids)
        packed = _side_by_side(snapshot, placed, index)
        for job in placed:
            view = job.view
            gain, running = packed.get(index[job.devices[0]], (None, 0))
            trace = _trace(
                view,
                job.work,
                job.memory,
                len(job.devices),
                job.time_limit,
                now,
                floor=view.steps_done + 1,
                busy=1.0 if gain is None else side.busy_for_gain(gain, running),
            )
            traces.append(trace)
            lane = job.lane if job.lane < lanes and snapshot.packing is None else 0
            residents[view.id] = Resident(
                tuple(index[name] * lanes + lane for name in job.devices),
                job.started - now,
                min(view.steps_done, trace.iterations - 1),
                view.attained,
                since=None if job.measured_at is None else min(job.measured_at - now, 0.0),
            )
            basis[view.id] = job.work.basis
        for waiting in snapshot.pending:
            view, request = waiting.view, waiting.request
            if view.id not in pending_ids:
                unknown[view.id] = Forecast.unknown(view.id)
                continue
            footprint = request.footprint
            traces.append(
                _trace(
                    view,
                    waiting.work,
                    footprint.persistent + footprint.ephemeral,
                    request.gpus,
                    request.time_limit,
                    now,
                )
            )
            if waiting.begin_time is not None:
                arrivals[view.id] = waiting.begin_time - now
            if waiting.after:
                after[view.id] = waiting.after
            basis[view.id] = waiting.work.basis
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
            packed={device: gain for device, (gain, _) in packed.items()},
        )
        return cls(traces, start, basis, unknown)


def _side_by_side(
    snapshot: Snapshot, placed: Sequence[Running], index: dict[str, int]
) -> dict[int, tuple[float, int]]:
    """The devices (by index) whose host reports its jobs side by side, paying: the gain it
    measured, and the lanes running at once. Only where the report shows exactly the jobs
    the daemon runs there, each on that one device (else the host has them taking turns
    again by now, as it does when its jobs change), and a gain past 1."""
    found: dict[int, tuple[float, int]] = {}
    for sharing in snapshot.packing or ():
        device, gain = index.get(sharing.device), sharing.gain
        if device is None or not sharing.packed or gain is None or not 1.0 < gain < math.inf:
            continue
        there = {job.view.id for job in placed if sharing.device in job.devices}
        alone = all(len(job.devices) == 1 for job in placed if job.view.id in there)
        shown = [job for lane in sharing.lanes for job in lane]
        running = sum(1 for lane in sharing.lanes if lane)
        if alone and running >= 2 and len(shown) == len(there) and set(shown) == there:
            found[device] = (gain, running)
    return found


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
    busy: float = 1.0,
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
        busy=busy,
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
