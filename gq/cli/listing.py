"""Listing jobs (gq status, gq history): asking for them a page at a time, and squeue's rows.

Imports no typer: ``gq status``, the command typed most, runs from here without it
(:mod:`gq.cli.quick`), and ``gq/cli/jobs.py`` declares its options for typer and calls
:func:`status` too. The listing is asked for with plain fields, and its jobs are read as
attributes of :class:`gq.client.Fields`, by the names gq.messages.JobInfo gives them:
building the typed messages would cost ``gq status`` more than all the rest of it.
"""

from __future__ import annotations

import os
import sys
import time

from gq import client, defaults
from gq.cli import render
from gq.queue.state_codes import ACTIVE, TERMINAL

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from gq.messages import JobInfo, Jobs


def status(
    all_jobs: bool,
    json_out: bool,
    user: list[str] | None,
    state: list[str] | None,
    format_spec: str | None,
    sort_spec: str | None,
    limit: int | None,
    start: bool,
    long: bool,
    array_tasks: bool,
) -> None:
    """gq status with its options' values (see ``gq status --help``). An array's pending
    tasks come folded into one row from the daemon (squeue's 17_[5-99%8]), each on its own
    with ``array_tasks``."""
    states = states_named(state) or (None if all_jobs else sorted(ACTIVE))
    answer = listed(
        states,
        user or None,
        limit_or_default(limit, json_out),
        forecast=start or long,
        array_tasks=array_tasks,
    )
    note_stale(answer)
    jobs = answer.jobs
    if sort_spec:
        from gq.cli import formats

        jobs = formats.sort(sort_spec, jobs)
    if json_out:
        print(render.dumps([render.job_json(j) for j in jobs]))
        return
    format_spec = format_spec or os.environ.get("GQ_STATUS_FORMAT")
    if format_spec:
        from gq.cli import formats

        print(formats.table(format_spec, [(job.label, job, reason(job)) for job in jobs]))
        return
    if start:
        rows = [
            [
                job.label,
                render.name_mark(job),
                job.user,
                render.state_label(job),
                job.device or "-",
                render.forecast_time(job, end=False),
                render.forecast_time(job, end=True),
                reason(job),
            ]
            for job in jobs
            if job.state not in TERMINAL
        ]
        print(
            render.table(
                ["JOBID", "NAME", "USER", "ST", "DEVICE", "START_TIME", "END_TIME", "REASON"], rows
            )
        )
        _note_forecast(answer)
        return
    now = time.time()
    rows = []
    for job in jobs:
        row = [
            job.label,
            render.name_mark(job),
            job.user,
            render.state_label(job),
            render.duration(render.elapsed(job, now)),
            job.device or "-",
            render.lane_state(job),
            render.progress(job),
        ]
        if long:
            row += [
                render.duration(job.time_limit) if job.time_limit else "UNLIMITED",
                render.forecast_time(job, end=False),
                render.forecast_time(job, end=True),
            ]
        rows.append([*row, reason(job)])
    headers = [
        "JOBID",
        "NAME",
        "USER",
        "ST",
        "TIME",
        "DEVICE",
        "LANE",
        "PROGRESS",
        *(["TIME_LIMIT", "START", "END"] if long else []),
        "REASON",
    ]
    print(render.table(headers, rows))
    if long:
        _note_forecast(answer)


def states_named(values: list[str] | None) -> list[str] | None:
    """-t/--state values (each may list several: PD,R) as the states' names; None for none
    given."""
    if not values:
        return None
    from gq.queue.states import JobState

    return [JobState.parse(part).value for value in values for part in value.split(",")]


def limit_or_default(given: int | None, whole: bool) -> int:
    """--limit, or its default: every finished job for output read by programs."""
    if given is not None:
        return given
    return 0 if whole else defaults.LISTED_FINISHED


def listed(
    states: list[str] | None,
    users: list[str] | None,
    limit: int,
    ended_since: float | None = None,
    forecast: bool = False,
    array_tasks: bool = False,
    fair_share: bool = False,
) -> client.Fields:
    """Pending and running jobs in ``states`` (names), and the ``limit`` finished ones that
    ended last (0: every one): the daemon sends finished jobs a page at a time. A job listed
    on more than one page (it ended, or was requeued, meanwhile) is listed as the last page
    saw it. In id order; an array's pending tasks folded as gq.messages.JobInfo says unless
    ``array_tasks``."""
    asked = {
        "states": states,
        "users": users,
        "ended_since": ended_since,
        "forecast": forecast,
        "array_tasks": array_tasks,
        "fair_share": fair_share,
    }
    answer = _page(asked, limit=limit or None)
    jobs = {job.id: job for job in answer.jobs}
    finished = sum(1 for job in answer.jobs if job.state in TERMINAL)
    asked["states"] = sorted(TERMINAL.intersection(states) if states else TERMINAL)
    while answer.older is not None and (limit == 0 or finished < limit):
        answer = _page(
            asked,
            before_end=answer.older_end,
            before=answer.older,
            limit=limit - finished if limit else None,
        )
        jobs.update((job.id, job) for job in answer.jobs)
        finished += len(answer.jobs)
    answer.jobs = sorted(jobs.values(), key=lambda job: job.id)
    if answer.older is not None:
        print(
            f"gq: note: the {finished} finished jobs that ended last shown; --limit N for "
            "more, --limit 0 for all",
            file=sys.stderr,
        )
    return answer


def _page(asked: dict, **page) -> client.Fields:
    """One ListJobs request's answer (gq.messages.Jobs), read as :class:`client.Fields`."""
    answer = client.Fields(client.ask_plain("list", {**asked, **page}, "jobs"))
    answer.jobs = [client.Fields(job) for job in answer.jobs]
    return answer


def note_stale(answer: Jobs | client.Fields) -> None:
    if answer.stale:
        print(f"gq: note: progress figures may be stale: {answer.stale}", file=sys.stderr)


def _note_forecast(answer: client.Fields) -> None:
    live = [job for job in answer.jobs if job.state not in TERMINAL]
    if any(job.forecast == "guessed" for job in live):
        print(
            "gq: note: jobs marked ~ that the daemon has not forecast yet are first guesses "
            "from time limits; ask again in a second",
            file=sys.stderr,
        )
    elif answer.forecast_made is None and live:
        print(
            "gq: note: the daemon has made no forecast yet; ask again in a second", file=sys.stderr
        )


def reason(job: JobInfo) -> str:
    """squeue's REASON column: why a pending job waits, or what is wrong with a running
    one (a deadline it will miss, memory over its figure)."""
    if job.state == "PENDING":
        return job.reason or "None"
    missed = render.deadline_miss(job)
    if job.state == "RUNNING" and missed is not None:
        return f"DeadlineAtRisk (misses it by ~{render.duration(missed)} at this pace)"
    if job.mem_over:
        over = f"MEM! (claims {render.size(job.mem_peak)}, over its {render.size(job.mem)})"
        return f"{over} {job.reason}" if job.reason else over
    return job.reason or ""
