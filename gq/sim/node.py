"""The simulated node's parts: a job's run on it (what it has done, the view the policy
sees), the lanes of its devices, and what holds a lane: a stretch of one job's iterations or
a window of turns several jobs take. Plain state, no I/O; the simulator
(:mod:`gq.sim.simulator`) moves it along."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gq.daemon.scheduling import admission
from gq.policies import JobView
from gq.sim.traces import TraceJob

MEASURED_AFTER = 2  # iterations before a job's iteration time and gap are known (as the host's)
EPSILON = 1e-9  # relative slack when placing a moment on an iteration boundary


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
    # How many times slower than alone its iterations run now: jobs side by side on its
    # device (gq.sim.side), as when its stretch began.
    slow: float = 1.0
    timed: bool = False  # its pace was timed taking turns with another job (the host's)
    held: float = 0.0  # lane time it has held, gaps inside its stretches included
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
        return self.job.iteration_time * self.slow + self.job.gap

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
