"""What a simulation hands back: the jobs' runs, the timeline of device time each got, and
the summary figures (job completion times, makespan, utilization, deadlines met)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gq.sim.node import JobRun


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
    lanes: int = 1  # per device
    # (``busy``: device seconds kept busy, each job's busy share of its iterations' time
    # alone; utilization is that over the devices' time, whatever their lanes)
    complete: bool = True  # False: stopped early (``stop``); jobs not ended have end None

    def _ends(self) -> list[tuple[JobRun, float]]:
        """Each run with its end. Figures over a result whose jobs did not all end (one
        stopped early, or a live node's with jobs that never start) would leave those jobs
        out and flatter it: refused."""
        ends = [(run, run.end) for run in self.runs if run.end is not None]
        if len(ends) != len(self.runs):
            raise ValueError(f"{len(self.runs) - len(ends)} of the jobs did not end")
        return ends

    def jcts(self) -> list[float]:
        return [end - run.job.submit_time for run, end in self._ends()]

    def summary(self) -> dict:
        jcts = sorted(self.jcts())
        first = min(run.job.submit_time for run in self.runs)
        makespan = max(end for _, end in self._ends()) - first
        return {
            "policy": self.policy,
            "jobs": len(self.runs),
            "avg_jct": statistics.fmean(jcts),
            "median_jct": statistics.median(jcts),
            "p95_jct": jcts[min(len(jcts) - 1, int(round(0.95 * (len(jcts) - 1))))],
            "makespan": makespan,
            "utilization": (self.busy / (self.gpus * makespan) if makespan > 0 else 0.0),
            "deadlines_met": self.deadlines_met(),
        }

    def deadlines_met(self) -> float | None:
        """The share of jobs with a deadline that ended by it (None: no job had one)."""
        due = [(end, run.job.deadline) for run, end in self._ends() if run.job.deadline is not None]
        if not due:
            return None
        return sum(end <= deadline for end, deadline in due) / len(due)
