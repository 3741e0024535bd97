"""gq hold, release, requeue, update: change queued or running jobs (like scontrol)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import typer

from gq.cli.common import database, resolve_jobs, the_home
from gq.errors import UserError
from gq.queue import transitions
from gq.queue.models import Job
from gq.queue.states import JobState
from gq.units import parse_duration

IDS = typer.Argument(..., metavar="JOBID", help="Job ids: 17 (a job or a whole array), 17_3 (one task).")


def _apply(labels: list[str], act: Callable[[object, Job], str | None]) -> None:
    """Resolve every label first (an unknown one changes nothing), then act on each job."""
    with database().write() as session:
        jobs = [job for label in labels for job in resolve_jobs(session, label)]
        results = [(job, act(session, job)) for job in jobs]
    from gq.daemon.control import poke

    poke(the_home())
    refused = [message for _, message in results if message and message.startswith("gq: ")]
    for _, message in results:
        if message:
            typer.echo(message, err=message in refused)
    if refused:
        raise typer.Exit(1)


def hold(job_ids: list[str] = IDS) -> None:
    """Keep pending jobs from starting until 'gq release' (reason JobHeldUser)."""
    def act(session, job: Job) -> str:
        if transitions.set_held(session, job.id, True):
            return f"Held job {job.label}"
        return f"gq: job {job.label} is {job.state}; only pending jobs can be held"

    _apply(job_ids, act)


def release(job_ids: list[str] = IDS) -> None:
    """Let held jobs run again."""
    def act(session, job: Job) -> str | None:
        if not job.held:
            return None if job.state != JobState.PENDING.value else f"Job {job.label} was not held"
        if transitions.set_held(session, job.id, False):
            return f"Released job {job.label}"
        return f"gq: job {job.label} is {job.state}; only pending jobs can be released"

    _apply(job_ids, act)


def requeue(job_ids: list[str] = IDS) -> None:
    """Put jobs back in the queue under the same id: running ones are stopped first
    (SIGTERM, then SIGKILL after the kill wait); ended ones run again."""
    def act(session, job: Job) -> str:
        state = JobState(job.state)
        if state is JobState.RUNNING:
            if transitions.request_stop(session, job.id, transitions.REQUEUE):
                return f"Requeueing job {job.label} (running; it restarts after it stops)"
        elif state.terminal and transitions.requeue_finished(session, job):
            return f"Requeued job {job.label}"
        return f"gq: job {job.label} is {job.state}; nothing to requeue"

    _apply(job_ids, act)


def update(
    job_ids: list[str] = IDS,
    priority: Optional[int] = typer.Option(None, "--priority", help="New priority (pending or running)."),
    time_limit: Optional[str] = typer.Option(None, "-t", "--time", help="New time limit (pending or running)."),
    name: Optional[str] = typer.Option(None, "-J", "--name", help="New name (pending jobs only)."),
) -> None:
    """Change a job's priority, time limit or name (like scontrol update)."""
    if priority is None and time_limit is None and name is None:
        raise UserError("nothing to update: give --priority, --time or --name")
    limit = parse_duration(time_limit) if time_limit is not None else None

    def act(session, job: Job) -> str:
        if name is not None and job.state != JobState.PENDING.value:
            return f"gq: job {job.label} is {job.state}; only a pending job can be renamed"
        if transitions.modify(session, job, name=name, priority=priority, time_limit=limit):
            return f"Updated job {job.label}"
        return f"gq: job {job.label} is {job.state}; only pending or running jobs can be updated"

    _apply(job_ids, act)
