"""A discrete-event, iteration-granular simulator of one gq node.

Events are arrivals and iteration ends (no fixed-step clock). At every event the daemon's
admission code places pending jobs in the policy's order; at every iteration boundary the
policy's ``pick`` chooses who runs next on each free device, exactly as the execution host
does. A job of ``iterations`` steps and ``duration`` seconds runs iterations of
``duration / iterations``; a device that changes job first pays ``switch_cost``. A job asking
for k > 1 GPUs takes k whole devices (all of them, if the node has fewer). Jobs have no idle
gaps here: between its iterations a trace job is always ready.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field

from gq.daemon import admission
from gq.policies import JobView, Policy
from gq.sim.traces import TraceJob


@dataclass
class JobRun:
    job: TraceJob
    gpus: int
    devices: tuple[int, ...] = ()
    start: float | None = None
    ready_at: float = 0.0
    end: float | None = None
    done: int = 0
    attained: float = 0.0
    released_at: float | None = None
    _view: JobView | None = None  # views are immutable: rebuild only after an iteration

    def view(self) -> JobView:
        if self._view is None:
            self._view = self._make_view()
        return self._view

    def finish_iteration(self, now: float) -> None:
        self.done += 1
        self.attained += self.job.iteration_time
        self.released_at = now
        self._view = None

    def _make_view(self) -> JobView:
        job = self.job
        return JobView(id=job.id, user=job.user, submit_time=job.submit_time,
                       priority=job.priority, steps_done=self.done, steps_total=job.iterations,
                       attained=self.attained,
                       mean_iteration=job.iteration_time if self.done else None,
                       released_at=self.released_at, deadline=job.deadline)


@dataclass
class Device:
    index: int
    residents: list[JobRun] = field(default_factory=list)
    busy_until: float | None = None
    last_job: int | None = None
    owner: JobRun | None = None  # a multi-GPU job whose iteration spans this device


@dataclass(frozen=True)
class Slice:
    """One stretch of device time given to a job (for timelines)."""

    device: int
    job: int
    start: float
    end: float


@dataclass
class Result:
    policy: str
    runs: list[JobRun]
    slices: list[Slice]
    busy: float
    gpus: int

    def jcts(self) -> list[float]:
        return [run.end - run.job.submit_time for run in self.runs]

    def summary(self) -> dict:
        jcts = sorted(self.jcts())
        first = min(run.job.submit_time for run in self.runs)
        makespan = max(run.end for run in self.runs) - first
        return {
            "policy": self.policy, "jobs": len(self.runs),
            "avg_jct": statistics.fmean(jcts), "median_jct": statistics.median(jcts),
            "p95_jct": jcts[min(len(jcts) - 1, int(round(0.95 * (len(jcts) - 1))))],
            "makespan": makespan,
            "utilization": self.busy / (self.gpus * makespan) if makespan > 0 else 0.0,
            "deadlines_met": self.deadlines_met(),
        }

    def deadlines_met(self) -> float | None:
        """The share of jobs with a deadline that ended by it (None: no job had one)."""
        due = [run for run in self.runs if run.job.deadline is not None]
        if not due:
            return None
        return sum(run.end <= run.job.deadline for run in due) / len(due)


def simulate(jobs: list[TraceJob], policy: Policy, gpus: int = 1, switch_cost: float = 0.0,
             capacity: int | None = None, max_resident: int | None = None,
             backfill: bool = True) -> Result:
    """Run the trace through ``policy`` on ``gpus`` devices. For backfill a job's time limit
    is its trace limit, else its duration (a perfect estimate)."""
    if gpus < 1:
        raise ValueError("gpus must be at least 1")
    devices = [Device(i) for i in range(gpus)]
    runs = {job.id: JobRun(job, min(job.gpus, gpus)) for job in jobs}
    if len(runs) != len(jobs):
        raise ValueError("job ids in a trace must be unique")
    pending: list[JobRun] = []
    events: list[tuple[float, int, str, int]] = []
    sequence = 0
    for job in jobs:
        events.append((job.submit_time, sequence, "arrive", job.id))
        sequence += 1
    heapq.heapify(events)
    slices: list[Slice] = []
    busy = 0.0
    finished = 0

    def place(now: float) -> None:
        order = policy.order([run.view() for run in pending])
        requests = [admission.Request(v.id, runs[v.id].gpus,
                                      admission.Footprint(runs[v.id].job.mem or 0),
                                      exclusive=runs[v.id].gpus > 1,
                                      time_limit=runs[v.id].job.limit) for v in order]
        loads = [admission.DeviceLoad(
            name=str(d.index), gpu=True, index=d.index,
            lanes=[admission.LaneLoad(capacity if capacity is not None else 1 << 62,
                                      [admission.Footprint(r.job.mem or 0) for r in d.residents])],
            max_resident=max_resident or 1 << 30, residents=len(d.residents),
            exclusive=any(r.gpus > 1 for r in d.residents),
            free_at=max((r.start + r.job.limit for r in d.residents), default=0.0))
            for d in devices]
        outcome = admission.place(requests, loads, now=now, backfill=backfill)
        for placement in outcome.placements:
            run = runs[placement.job_id]
            pending.remove(run)
            run.devices = tuple(int(name) for name in placement.devices)
            run.start = now
            run.ready_at = now + run.job.startup
            for index in run.devices:
                devices[index].residents.append(run)
            if run.job.startup:
                push(run.ready_at, "ready", run.job.id)

    def push(time: float, kind: str, payload: int) -> None:
        nonlocal sequence
        heapq.heappush(events, (time, sequence, kind, payload))
        sequence += 1

    def dispatch(now: float) -> None:
        nonlocal busy
        for device in devices:
            if device.busy_until is not None or device.owner is not None:
                continue
            ready = [r for r in device.residents if r.ready_at <= now and r.devices[0] == device.index]
            if not ready:
                continue
            chosen_view = policy.pick([r.view() for r in ready],
                                      [r.view() for r in device.residents], now)
            if chosen_view is None:
                continue
            run = runs[chosen_view.id]
            if any(devices[i].busy_until is not None for i in run.devices):
                continue
            switch = switch_cost if device.last_job not in (None, run.job.id) else 0.0
            end = now + switch + run.job.iteration_time
            for index in run.devices:
                devices[index].busy_until = end
                devices[index].last_job = run.job.id
                if index != device.index:
                    devices[index].owner = run
            previous = slices[-1] if slices else None
            if previous and (previous.device, previous.job, previous.end) == (
                    device.index, run.job.id, now + switch):
                slices[-1] = Slice(device.index, run.job.id, previous.start, end)
            else:
                slices.append(Slice(device.index, run.job.id, now + switch, end))
            busy += run.job.iteration_time * len(run.devices)
            push(end, "iteration", run.job.id)

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, job_id = heapq.heappop(events)
            run = runs[job_id]
            if kind == "arrive":
                pending.append(run)
            elif kind == "iteration":
                run.finish_iteration(now)
                for index in run.devices:
                    devices[index].busy_until = None
                    devices[index].owner = None
                if run.done == run.job.iterations:
                    run.end = now
                    finished += 1
                    for index in run.devices:
                        devices[index].residents.remove(run)
        if pending:
            place(now)
        dispatch(now)
    if finished != len(runs):
        stuck = sorted(set(runs) - {r.job.id for r in runs.values() if r.end is not None})
        raise RuntimeError(f"simulation ended with unfinished jobs {stuck[:10]}")
    return Result(policy.name, sorted(runs.values(), key=lambda r: r.job.id), slices, busy, gpus)
