"""Read-only views of the queue: gq status, gq show, gq history."""

from __future__ import annotations

import re
import sys
import time
from typing import Optional

import typer

from gq import defaults, messages
from gq.cli import listing, render
from gq.cli.common import ask, labels
from gq.queue.states import TERMINAL
from gq.units import format_duration, parse_period, parse_when

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
    answer = ask(messages.ShowJob(labels([job_id])[0]))
    listing.note_stale(answer)
    if answer.more:
        print(
            f"gq: note: {answer.more} more tasks of array {job_id} not shown; 'gq show "
            f"{job_id}_N' shows one, 'gq status -r --json' lists them all",
            file=sys.stderr,
        )
    if json_out:
        data = [render.job_json(job) for job in answer.jobs]
        typer.echo(render.dumps(data[0] if len(data) == 1 else data))
        return
    for index, job in enumerate(answer.jobs):
        if index:
            typer.echo()
        _print_job(job)


def _interactive(job: messages.JobInfo) -> str:
    """Whether it is on its submitter's terminal; its idle time and --idle-timeout."""
    if not job.interactive:
        return "no"
    said = "yes (on its submitter's terminal)"
    if job.idle is not None:
        said += f", idle {render.idle_time(job.idle)}"
    if job.idle_timeout is not None:
        said += f", ended when idle {format_duration(job.idle_timeout)} (--idle-timeout)"
    return said


def _print_job(job: messages.JobInfo) -> None:
    lines = [
        ("JobId", job.label),
        ("Name", job.name),
        ("User", f"{job.user} (uid {job.uid})"),
        ("State", f"{job.state} ({render.state_label(job)})"),
        ("Reason", job.reason or "-"),
        ("Priority", job.priority),
        ("Command", " ".join([job.script, *job.args])),
        ("Interactive", _interactive(job)),
        ("WorkDir", job.workdir),
        ("StdOut", job.stdout or "(its terminal)"),
        ("StdErr", job.stderr or "(its terminal)"),
        ("Gpus", f"{job.gpu_type}:{job.gpus}" if job.gpu_type else job.gpus),
        ("GpuMem", render.memory_figure(job)),
        (
            "OutOfMemory",
            f"{job.on_oom.value}" + (f" ({job.ooms} run(s) ran out so far)" if job.ooms else ""),
        ),
        ("HostMem", render.size(job.host_mem) if job.host_mem else "-"),
        ("CpusPerTask", job.cpus or "-"),
        ("TimeLimit", render.duration(job.time_limit) if job.time_limit else "UNLIMITED"),
        ("BeginTime", render.short_time(job.begin_time) if job.begin_time else "-"),
        ("Signal", job.warn_signal or "-"),
        ("NodeList", job.nodelist or "-"),
        (
            "Retries",
            f"{job.retries - (job.retries_left or 0)} of {job.retries} used"
            if job.retries
            else "-",
        ),
        ("Deadline", _deadline_line(job)),
        ("Exclusive", "yes" if job.exclusive else "no"),
        ("Requeue", "yes" if job.requeue else "no"),
        ("Dependency", job.dependency or "-"),
        ("Held", "yes" if job.held else "no"),
        ("Device", f"{job.device or '-'}" + (f" lane {job.lane}" if job.lane is not None else "")),
        ("SubmitTime", render.short_time(job.submit_time)),
        ("StartTime", render.short_time(job.start_time)),
        ("EndTime", render.short_time(job.end_time)),
        ("RunTime", render.duration(render.elapsed(job))),
        ("Forecast", _forecast_line(job)),
        ("ExitCode", "-" if job.exit_code is None else job.exit_code),
        (
            "Steps",
            f"{job.steps_done}/{job.steps_total or '?'}"
            + (
                f" (counted by run {job.run_count}; the job completed)"
                if render.resumed_and_done(job)
                else ""
            ),
        ),
        ("MeanIteration", f"{job.mean_iteration * 1000:.2f} ms" if job.mean_iteration else "-"),
        ("MeanGap", f"{job.mean_gap * 1000:.2f} ms" if job.mean_gap is not None else "-"),
        ("AttainedDeviceTime", f"{job.attained:.2f} s"),
        ("LaneTaken", _lane_taken(job)),
        ("IterationsPerSecond", _figure(render.iteration_rate(job), "{:.1f}")),
        ("LaneShare", _figure(render.lane_share(job), "{:.0%}")),
        ("MemPersistent", render.size(job.mem_persistent)),
        ("MemPeak", render.size(job.mem_peak)),
        ("HostMemory", render.size(job.host_memory)),
        ("Processes", "-" if job.processes is None else job.processes),
        ("Tasks", _tasks(job)),
        ("Runs", job.run_count),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        typer.echo(f"{key:>{width}}: {render.printable(value)}")
    typer.echo("\nState history:")
    for event in job.events or []:
        old = event.old_state or "-"
        reason = f"  ({event.reason})" if event.reason else ""
        typer.echo(
            render.printable(
                f"  {render.short_time(event.time)}  {old:>9} -> {event.new_state}{reason}"
            )
        )


def _forecast_line(job: messages.JobInfo) -> str:
    """When the job should start and end, as the daemon's last forecast has it."""
    if job.forecast is None:
        return "-"
    if job.forecast == "unknown":
        return "unknown (no --steps, --time or earlier runs of this name to go on)"
    start = (
        "" if job.start_time is not None else (f"start {render.forecast_time(job, end=False)}, ")
    )
    return f"{start}end {render.forecast_time(job, end=True)}" + _FORECAST_BASIS.get(
        job.forecast, ""
    )


_FORECAST_BASIS = {
    "estimated": " (estimated)",
    "guessed": " (a first guess from time limits: not forecast yet; ask again in a second)",
}


def _lane_taken(job: messages.JobInfo) -> str:
    """How often its device was taken from it inside an iteration (--max-hold)."""
    if not job.lane_taken:
        return "never"
    return (
        f"{job.lane_taken} time(s): its iterations held the device past the policy's "
        "--max-hold while another job waited, so they ran sliced"
    )


def _tasks(job: messages.JobInfo) -> str:
    """Its tasks now, against its limit, and the forks refused there (its pids cgroup's)."""
    if job.pids_current is None:
        return "-"
    limit = "" if job.pids_max is None else f" of at most {job.pids_max}"
    refused = f"; {job.pids_refused} forks refused at the limit" if job.pids_refused else ""
    return f"{job.pids_current}{limit}{refused}"


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _deadline_line(job: messages.JobInfo) -> str:
    if job.deadline is None:
        return "-"
    text = render.short_time(job.deadline)
    predicted = render.predicted_end(job)
    if predicted is not None:
        text += f" (predicted end {render.short_time(predicted)})"
    missed = render.deadline_miss(job)
    if missed is not None:
        text += f"; misses it by {render.duration(missed)}"
    return text


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
    measured: iterations per second, the share of its lane it held, peak memory.

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
                render.duration(data["wait_time"]),
                render.duration(data["run_time"]),
                render.duration(data["jct"]),
                _figure(data["iterations_per_second"], "{:.1f}"),
                _figure(data["lane_share"], "{:.0%}"),
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
                "WAIT",
                "RUN",
                "JCT",
                "IT/S",
                "SHARE",
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


def _note_reach(answer: messages.Jobs) -> None:
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

    ran = [j for j in jobs if j.start_time is not None and j.end_time is not None]
    first = min((j.submit_time for j in ran), default=0.0)
    trace = [
        TraceJob(
            id=j.id,
            submit_time=j.submit_time - first,
            duration=(
                j.attained
                if j.steps_done and j.attained > 0
                else max(j.end_time - j.start_time, 1e-3)
            ),
            iterations=max(1, j.steps_done),
            gpus=max(1, j.gpus),
            priority=j.priority,
            user=j.user,
            mem=j.mem,
            time_limit=j.time_limit,
            gap=j.mean_gap if anticipation_window(j.mean_gap) is None and j.mean_gap else 0.0,
        )
        for j in ran
    ]
    write_gq_csv(trace, sys.stdout)
