"""The jobs of a forecast's snapshot, from what the last scheduling pass read.

A forecast (:mod:`gq.daemon.forecasts.forecasting`) starts from the node as the last pass saw it
(:class:`Pass`); :meth:`gq.daemon.scheduling.scheduler.Scheduler.snapshot` assembles it. Here: the
running jobs with their progress and what each has left to do, and the pending ones with the
view and request admission takes and what each waits for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gq import policies
from gq.daemon.scheduling import admission
from gq.daemon.scheduling.lane_waits import running_view
from gq.daemon.supervision.running import Running
from gq.exec.host.messages import PackingReport
from gq.exec.lane.packing import Mode
from gq.queue import dependencies
from gq.queue.scheduling_rows import SchedulingRow as Row
from gq.queue.states import JobState
from gq.sim import forecast, work_estimates


@dataclass(frozen=True)
class Pass:
    """What the last scheduling pass read: the forecast's starting point."""

    pending: Sequence[Row]  # not held
    running: Sequence[Row]
    needs: dict[int, dependencies.Dependency]
    runs: dict[int, list[tuple[JobState, bool]]]


def running_jobs(
    rows: Sequence[Row],
    jobs: dict[int, Running],
    past: Callable[[str, str], work_estimates.Past | None],
    typical: float | None,
    now: float,
) -> list[forecast.Running]:
    """The running jobs (``rows``; ``jobs``: as their hosts run them, by id) with their
    progress at ``now``, as a forecast takes them."""
    running = []
    for row in rows:
        job = jobs.get(row.id)
        if job is None:
            continue  # its host has not reported it yet
        latest = job.latest  # its host's last report: fresher than its row
        view = running_view(row) if latest is None else running_view(row, latest)
        footprint_now = job.footprint_now()
        running.append(
            forecast.Running(
                view,
                work_estimates.work(
                    view, job.time_limit, past(row.user, row.name), now - job.started, typical
                ),
                tuple(d.name for d in job.devices),
                job.lane,
                job.started,
                footprint_now.persistent + footprint_now.ephemeral,
                job.time_limit,
                row.name,
                startup=None if latest is None else latest.startup,
                measured_at=None if latest is None else job.latest_at,
            )
        )
    return running


def sharing(
    measured: bool, reports: dict[str, PackingReport]
) -> tuple[forecast.Sharing, ...] | None:
    """Under --lanes auto (``measured``), how each device's host last said its jobs share
    it (``reports``, by device: figures the wire's decoder has bounded); else None."""
    if not measured:
        return None
    return tuple(
        forecast.Sharing(
            device,
            report.mode == Mode.PACKED.value,
            tuple(tuple(lane) for lane in report.lanes),
            report.gain,
            report.most,
        )
        for device, report in sorted(reports.items())
    )


def pending_jobs(
    rows: Sequence[Row],
    needs: dict[int, dependencies.Dependency],
    runs: dict[int, list[tuple[JobState, bool]]],
    made: Callable[[Row], tuple[policies.JobView, admission.Request]],
    past: Callable[[str, str], work_estimates.Past | None],
    paces: dict[tuple[str, str], work_estimates.Past],
    typical: float | None,
) -> list[forecast.Pending]:
    """Pending jobs as a forecast takes them: the view and request admission takes
    (``made``), what each will do (from the owner's ended jobs of its name, else ``paces``:
    the pace of one running), what it waits for."""
    pending = []
    for row in rows:
        after = _waits_for(needs.get(row.id), runs)
        if after is None:
            continue
        view, request = made(row)
        previous = past(row.user, row.name) or paces.get((row.user, row.name))
        pending.append(
            forecast.Pending(
                view,
                request,
                work_estimates.work(view, row.time_limit, previous, typical=typical),
                row.begin_time,
                after,
            )
        )
    return pending


def _waits_for(
    need: dependencies.Dependency | None, runs: dict[int, list[tuple[JobState, bool]]]
) -> tuple[int, ...] | None:
    """The jobs that must end before a job with this dependency starts (``after``: start; a
    forecast takes its end, the later); None where a forecast cannot say (a dependency on an
    array's tasks, one that needs a failure, or any one of several)."""
    if need is None or dependencies.evaluate(need, runs) is dependencies.Outcome.SATISFIED:
        return ()
    if need.any_of or any(clause.kind == "afternotok" for clause in need.clauses):
        return None
    waits = []
    for clause in need.clauses:
        for job_id in clause.job_ids:
            states = runs.get(job_id, [])
            if len(states) != 1:
                return None
            state, started = states[0]
            if not state.terminal and not (clause.kind == "after" and started):
                waits.append(job_id)
    return tuple(waits)
