"""Read-only views of the queue: gq status, gq show, gq history, gq logs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from gq.cli import render
from gq.cli.common import database, resolve_one
from gq.errors import UserError
from gq.queue import queries
from gq.queue.states import ACTIVE, TERMINAL, JobState


def _states(values: Optional[list[str]]) -> list[JobState] | None:
    if not values:
        return None
    return [JobState.parse(part) for value in values for part in value.split(",")]


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def status(
    all_jobs: bool = typer.Option(False, "-a", "--all", help="Include finished jobs."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON objects."),
    user: Optional[list[str]] = typer.Option(None, "-u", "--user", help="Only these users' jobs."),
    state: Optional[list[str]] = typer.Option(None, "-t", "--state", help="Only these states (PD, R, CD, ...; comma-separated)."),
) -> None:
    """List pending and running jobs (like squeue): progress, lane use, pending reasons."""
    states = _states(state) or (None if all_jobs else sorted(ACTIVE))
    with database().read() as session:
        jobs = queries.jobs(session, states=states, users=user or None)
    if json_out:
        typer.echo(render.dumps([render.job_json(j) for j in jobs]))
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("JOBID", "NAME", "USER", "ST", "TIME", "DEVICE", "LANE", "PROGRESS",
                   "REASON"):
        table.add_column(column, no_wrap=True)
    now = time.time()
    for label, job in _fold_pending_arrays(jobs):
        table.add_row(label, job.name[:24], job.user, render.state_label(job),
                      render.duration(render.elapsed(job, now)), job.device or "-",
                      render.lane_state(job), render.progress(job), _reason(job))
    _console().print(table)


def _fold_pending_arrays(jobs) -> list[tuple[str, object]]:
    """squeue's rows: an array's pending tasks fold into one, e.g. 17_[5-99%8]."""
    from gq.queue.arrays import fold

    pending: dict[int, list] = {}
    for job in jobs:
        if job.array_job_id is not None and job.state == JobState.PENDING.value:
            pending.setdefault(job.array_job_id, []).append(job)
    rows, shown = [], set()
    for job in jobs:
        tasks = pending.get(job.array_job_id) if job.state == JobState.PENDING.value else None
        if not tasks:
            rows.append((job.label, job))
        elif job.array_job_id not in shown:
            shown.add(job.array_job_id)
            label = f"{job.array_job_id}_" + fold([t.array_task_id for t in tasks],
                                                  job.array_max_running)
            rows.append((label, job))
    return rows


def _reason(job) -> str:
    if job.state == JobState.PENDING.value:
        return job.reason or "None"
    return job.reason or ""


def show(
    job_id: str = typer.Argument(..., metavar="JOBID", help="The job id (17, or 17_3 for an array task)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Everything about one job, with its state history (like scontrol show job)."""
    with database().read() as session:
        job = resolve_one(session, job_id)
        events = queries.events(session, job.id)
    data = render.job_json(job)
    data["events"] = [render.event_json(e) for e in events]
    if json_out:
        typer.echo(render.dumps(data))
        return
    lines = [
        ("JobId", job.label), ("Name", job.name), ("User", job.user),
        ("State", f"{job.state} ({render.state_label(job)})"), ("Reason", job.reason or "-"),
        ("Priority", job.priority), ("Command", " ".join([job.script, *job.args])),
        ("WorkDir", job.workdir), ("StdOut", job.stdout_path), ("StdErr", job.stderr_path),
        ("Gpus", job.gpus), ("Mem", render.size(job.mem)),
        ("TimeLimit", render.duration(job.time_limit) if job.time_limit else "UNLIMITED"),
        ("Exclusive", "yes" if job.exclusive else "no"), ("Requeue", "yes" if job.requeue else "no"),
        ("Dependency", job.dependency or "-"), ("Held", "yes" if job.held else "no"),
        ("Device", f"{job.device or '-'}" + (f" lane {job.lane}" if job.lane is not None else "")),
        ("SubmitTime", render.short_time(job.submit_time)),
        ("StartTime", render.short_time(job.start_time)),
        ("EndTime", render.short_time(job.end_time)),
        ("RunTime", render.duration(render.elapsed(job))),
        ("ExitCode", "-" if job.exit_code is None else job.exit_code),
        ("Steps", f"{job.steps_done}/{job.steps_total or '?'}"),
        ("MeanIteration", f"{job.mean_iteration * 1000:.2f} ms" if job.mean_iteration else "-"),
        ("AttainedDeviceTime", f"{job.attained:.2f} s"),
        ("MemPersistent", render.size(job.mem_persistent)), ("MemPeak", render.size(job.mem_peak)),
        ("Runs", job.run_count),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        typer.echo(f"{key:>{width}}: {value}")
    typer.echo("\nState history:")
    for event in events:
        old = event.old_state or "-"
        reason = f"  ({event.reason})" if event.reason else ""
        typer.echo(f"  {render.short_time(event.time)}  {old:>9} -> {event.new_state}{reason}")


def history(
    json_out: bool = typer.Option(False, "--json", help="Print JSON objects."),
    user: Optional[list[str]] = typer.Option(None, "-u", "--user", help="Only these users' jobs."),
    state: Optional[list[str]] = typer.Option(None, "-t", "--state", help="Only these end states."),
    csv_out: bool = typer.Option(False, "--csv", help="Print a trace for 'gq simulate'."),
) -> None:
    """Finished jobs (like sacct): wait time, run time, JCT and exit code.

    --csv writes gq's trace layout, so 'gq simulate --trace' can replay the jobs.
    """
    states = _states(state) or sorted(TERMINAL)
    with database().read() as session:
        jobs = queries.jobs(session, states=states, users=user or None)
    if csv_out:
        _write_trace(jobs)
        return
    if json_out:
        typer.echo(render.dumps([render.job_json(j) for j in jobs]))
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("JOBID", "NAME", "USER", "STATE", "EXIT", "WAIT", "RUN", "JCT", "END"):
        table.add_column(column, no_wrap=True)
    for job in jobs:
        data = render.job_json(job)
        table.add_row(str(job.id), job.name[:24], job.user, job.state,
                      "-" if job.exit_code is None else str(job.exit_code),
                      render.duration(data["wait_time"]), render.duration(data["run_time"]),
                      render.duration(data["jct"]), render.short_time(job.end_time))
    _console().print(table)


def _write_trace(jobs) -> None:
    """Device time alone is best estimated by attained time where iterations were seen."""
    from gq.sim.traces import TraceJob, write_gq_csv

    ran = [j for j in jobs if j.start_time is not None and j.end_time is not None]
    first = min((j.submit_time for j in ran), default=0.0)
    trace = [TraceJob(id=j.id, submit_time=j.submit_time - first,
                      duration=(j.attained if j.steps_done and j.attained > 0
                                else max(j.end_time - j.start_time, 1e-3)),
                      iterations=max(1, j.steps_done), gpus=max(1, j.gpus),
                      priority=j.priority, user=j.user, mem=j.mem) for j in ran]
    write_gq_csv(trace, sys.stdout)


def logs(
    job_id: str = typer.Argument(..., metavar="JOBID", help="The job id (17, or 17_3 for an array task)."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends."),
    stderr: bool = typer.Option(False, "--err", help="Show the job's stderr file instead."),
) -> None:
    """Print a job's output file (like tail; -f follows it until the job ends)."""
    with database().read() as session:
        job = resolve_one(session, job_id)
    jid = job.label
    path = Path(job.stderr_path if stderr else job.stdout_path)
    if not follow:
        if not path.exists():
            if job.state == JobState.PENDING.value:
                typer.echo(f"job {jid} is pending; it has no output yet", err=True)
                return
            raise UserError(f"job {jid}'s output file {path} does not exist")
        _copy(path, 0)
        return
    offset = 0
    while True:
        if path.exists():
            offset = _copy(path, offset)
        with database().read() as session:
            state = JobState(resolve_one(session, jid).state)
        if state.terminal:
            if path.exists():
                _copy(path, offset)
            return
        time.sleep(0.2)


def _copy(path: Path, offset: int) -> int:
    with open(path, "rb") as handle:
        handle.seek(offset)
        while chunk := handle.read(1 << 16):
            sys.stdout.buffer.write(chunk)
            offset += len(chunk)
    sys.stdout.buffer.flush()
    return offset
