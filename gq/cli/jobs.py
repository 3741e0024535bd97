"""Read-only views of the queue: gq status, gq show, gq history."""

from __future__ import annotations

import re
import sys
import time
from typing import Optional

import typer

from gq import client, defaults, messages
from gq.cli import job_page, listing, render
from gq.queue.states import TERMINAL
from gq.units import parse_period, parse_when

STATUS_HELP = """List pending and running jobs (like squeue).

Columns: JOBID (17, or 17_3 for task 3 of array 17; 17_[5-99%8] for the pending tasks 5 to
99 of array 17, at most 8 of which run at once: -r lists them one by one), ST (PD pending,
R running, CD completed, F failed, CA cancelled, TO timeout, DL deadline), TIME (run time),
DEVICE, LANE, PROGRESS (steps done/total), REASON (why a pending job waits: Resources, Priority,
Dependency, JobHeldUser, JobHeldAdmin, JobArrayTaskLimit; a running job that will miss its deadline at
its pace: DeadlineAtRisk).

LANE says what a running job is doing at this moment: 'holds' = it is inside an iteration
and holds its device lane; 'waits' = it is resident (keeps its memory, counts as running)
but between iterations or waiting for the lane while another job's iteration runs; '-' = a
plain process (a shell script), which takes no turns on a lane.

--start (and START, END with -l) forecast when each pending job starts and each job ends:
the daemon simulates the queue as it is, under the node's policy, with each running job's
measured pace and progress, about once a second. A job with --steps and a measured pace is
known; '~' marks a time estimated from a time limit or the owner's recent jobs of the same
name (or behind such a job); '?' one that nothing tells (no --steps, no --time, no earlier
run; held; waiting for a job it cannot follow).
"""


LIMIT_HELP = (
    f"Show at most N finished jobs, those that ended last (default "
    f"{defaults.LISTED_FINISHED}, or all of them with --json or --csv; 0: all of "
    "them, fetched a page at a time)."
)


def status(
    all_jobs: bool = typer.Option(False, "-a", "--all", help="Include finished jobs."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON objects."),
    user: Optional[list[str]] = typer.Option(
        None, "-u", "--user", metavar="USER", help="Only these users' jobs."
    ),
    state: Optional[list[str]] = typer.Option(
        None,
        "-t",
        "--state",
        metavar="STATE",
        help="Only these states (PD, R, CD, ...; comma-separated).",
    ),
    format_spec: Optional[str] = typer.Option(
        None,
        "-o",
        "--format",
        metavar="FORMAT",
        help="Columns as squeue's: '%.18i %.9P %.8j %.8u %.2t %.10M %R' (also GQ_STATUS_FORMAT).",
    ),
    sort_spec: Optional[str] = typer.Option(
        None,
        "-S",
        "--sort",
        metavar="KEYS",
        help="Order by squeue's keys: -p,i (priority down, then id).",
    ),
    limit: Optional[int] = typer.Option(None, "--limit", min=0, metavar="N", help=LIMIT_HELP),
    start: bool = typer.Option(
        False,
        "--start",
        help="Forecast start and end of pending and running jobs (as squeue --start).",
    ),
    long: bool = typer.Option(
        False, "-l", "--long", help="More columns: TIME_LIMIT, and the forecast START and END."
    ),
    array_tasks: bool = typer.Option(
        False,
        "-r",
        "--array-tasks",
        help="Each pending array task on its own line (as squeue -r); without it, an array's pending tasks that never started are one line, 17_[5-99%8].",
    ),
) -> None:
    listing.status(
        all_jobs=all_jobs,
        json_out=json_out,
        user=user,
        state=state,
        format_spec=format_spec,
        sort_spec=sort_spec,
        limit=limit,
        start=start,
        long=long,
        array_tasks=array_tasks,
    )


def show(
    job_id: str = typer.Argument(
        ..., metavar="JOBID", help="17, 17_3 (one task), or an array's id (all its tasks)."
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object (a list for an array)."
    ),
) -> None:
    """Everything about one job, with its state history (like scontrol show job)."""
    job_page.show(job_id, json_out)


def history(
    json_out: bool = typer.Option(False, "--json", help="Print JSON objects."),
    user: Optional[list[str]] = typer.Option(
        None, "-u", "--user", metavar="USER", help="Only these users' jobs."
    ),
    state: Optional[list[str]] = typer.Option(
        None, "-t", "--state", metavar="STATE", help="Only these end states."
    ),
    csv_out: bool = typer.Option(False, "--csv", help="Print a trace for 'gq simulate'."),
    since: Optional[str] = typer.Option(
        None,
        "-S",
        "--since",
        metavar="WHEN",
        help="Only jobs that ended since then: 2days, 12hours (ago), or a time as --begin takes it.",
    ),
    limit: Optional[int] = typer.Option(None, "--limit", min=0, metavar="N", help=LIMIT_HELP),
) -> None:
    """Finished jobs (like sacct): wait time, run time, JCT, exit code, and what each
    measured: steps, lane time, iterations per second, the share of its lane it held, its
    pace side by side against taking turns (SIDE, where --lanes auto packed it), peak
    memory.

    A job requeued (gq requeue, scontrol requeue, out of memory, --retries) ran more than
    once (RUNS); its figures are over all its runs, as sacct sums a job's steps: WAIT is the
    time it was pending before each run (from its submission or requeue to that run's
    start), summed; RUN and LANE (lane time billed) are summed; STEPS is what it reached in
    the end (each run counts its own steps, so a job a resumed run completed reached its
    total). JCT is its end less its submission. 'gq show JOBID' lists each run.

    The jobs that ended last (--limit), the last of them at the bottom. --csv writes gq's
    trace layout, so 'gq simulate --trace' can replay the jobs.
    """
    states = listing.states_named(state) or sorted(TERMINAL)
    answer = listing.listed(
        states,
        user or None,
        listing.limit_or_default(limit, json_out or csv_out),
        _since(since) if since is not None else None,
        array_tasks=True,
        fair_share=not (json_out or csv_out),
    )  # as sacct: a line for each task
    answer.jobs.sort(key=lambda job: (job.end_time or 0.0, job.id))  # the last ended last
    if csv_out:
        _write_trace(answer.jobs)
        return
    if json_out:
        typer.echo(render.dumps([render.job_json(j) for j in answer.jobs]))
        return
    rows = []
    for job in answer.jobs:
        data = render.job_json(job)
        missed = data["missed_by"]
        rows.append(
            [
                job.label,
                job.name,
                job.user,
                job.state,
                "-" if job.exit_code is None else str(job.exit_code),
                str(job.run_count),
                render.duration(data["wait_time"]),
                render.duration(data["run_time"]),
                render.duration(data["jct"]),
                f"{data['steps_done']}/{job.steps_total}"
                if job.steps_total
                else str(data["steps_done"]),
                render.duration(data["attained"]),
                job_page.figure(data["iterations_per_second"], "{:.1f}"),
                job_page.figure(data["lane_share"], "{:.0%}"),
                job_page.figure(data["pace_side_by_side"], "{:.2f}x"),
                render.size(job.mem_peak),
                render.short_time(job.end_time),
                "-"
                if job.deadline is None
                else (
                    "met"
                    if missed is None and job.state != "DEADLINE"
                    else "?"
                    if missed is None
                    else render.duration(missed)
                ),
            ]
        )
    typer.echo(
        render.table(
            [
                "JOBID",
                "NAME",
                "USER",
                "STATE",
                "EXIT",
                "RUNS",
                "WAIT",
                "RUN",
                "JCT",
                "STEPS",
                "LANE",
                "IT/S",
                "SHARE",
                "SIDE",
                "PEAK MEM",
                "END",
                "MISSED BY",
            ],
            rows,
        )
    )
    if answer.fair_share:  # (a note: the table's lines stay the jobs')
        typer.echo(f"gq: note: {render.printable(render.fair_share(answer.fair_share))}", err=True)
    _note_reach(answer)


def _since(text: str) -> float:
    """--since as a time: a period ago (2days, 12hours), else a time (16:00 today, ISO)."""
    now = time.time()
    if re.fullmatch(r"\s*\d+(\.\d+)?\s*[a-z]+\s*", text.lower()):
        return now - parse_period(text)
    when = parse_when(text, now, "--since")
    return when - 86400 if when > now else when  # 16:00 means today's, once passed


def _note_reach(answer: client.Fields) -> None:
    """How far back history reaches: finished jobs are purged after the retention."""
    if answer.retention is None:
        return
    from gq.units import describe_period

    since = (
        f"; the oldest kept ended {render.short_time(answer.kept_since)}"
        if answer.kept_since is not None
        else ""
    )
    print(
        f"gq: note: finished jobs are kept {describe_period(answer.retention)} after they end{since}",
        file=sys.stderr,
    )


def _write_trace(jobs: list[messages.JobInfo]) -> None:
    """Device time alone is best estimated by attained time where iterations were seen; the
    measured idle gap goes along where a lane could fill it (a column only where some job
    had one): the host keeps the lane through a shorter one, as if it were no gap."""
    from gq.policies.base import anticipation_window
    from gq.sim.traces import TraceJob, write_gq_csv

    ran = [
        (j, j.start_time, j.end_time)
        for j in jobs
        if j.start_time is not None and j.end_time is not None
    ]
    first = min((j.submit_time for j, _, _ in ran), default=0.0)
    trace = [
        TraceJob(
            id=j.id,
            submit_time=j.submit_time - first,
            duration=(j.attained if j.steps_done and j.attained > 0 else max(end - start, 1e-3)),
            iterations=max(1, j.steps_done),
            gpus=max(1, j.gpus),
            priority=j.priority,
            user=j.user,
            mem=j.mem,
            time_limit=j.time_limit,
            gap=j.mean_gap if anticipation_window(j.mean_gap) is None and j.mean_gap else 0.0,
        )
        for j, start, end in ran
    ]
    write_gq_csv(trace, sys.stdout)
