"""gq cancel: end pending jobs now, running ones through the daemon (like scancel)."""

from __future__ import annotations

from typing import Optional

import typer

from gq.cli.common import database, resolve_jobs, the_home
from gq.errors import UserError
from gq.queue import queries, transitions
from gq.queue.states import JobState


def cancel(
    job_ids: Optional[list[str]] = typer.Argument(None, metavar="JOBID", help="Job ids: 17 (a job or a whole array), 17_3 (one task)."),
    state: Optional[str] = typer.Option(None, "-t", "--state", help="Only jobs in this state (PD or R)."),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Only jobs with this name."),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="Only this user's jobs."),
) -> None:
    """Cancel jobs by id, or every active job matching --state/--name/--user.

    Pending jobs become CANCELLED at once; running ones get SIGTERM (SIGKILL after the
    daemon's kill wait) and become CANCELLED when they have exited.
    """
    if not job_ids and state is None and name is None and user is None:
        raise UserError("nothing to cancel: give job ids or --state/--name/--user")
    wanted_state = JobState.parse(state) if state else None
    if wanted_state is not None and wanted_state.terminal:
        raise UserError(f"--state {state}: only PENDING or RUNNING jobs can be cancelled")
    outcome, finished = [], []
    with database().write() as session:
        named = [job for label in job_ids or [] for job in resolve_jobs(session, label)]
        candidates = queries.jobs(
            session, ids=[job.id for job in named] if job_ids else None,
            states=[wanted_state] if wanted_state else [JobState.PENDING, JobState.RUNNING],
            users=[user] if user else None, names=[name] if name else None)
        for job in candidates:
            if job.state == JobState.PENDING.value:
                if transitions.cancel_pending(session, job.id, "cancelled by user"):
                    outcome.append(f"Cancelled job {job.label}")
            elif transitions.request_stop(session, job.id, transitions.CANCEL):
                outcome.append(f"Cancelling job {job.label} (running; it ends after SIGTERM)")
        finished = [job for job in named if JobState(job.state).terminal]
    from gq.daemon.control import poke

    poke(the_home())
    for line in outcome:
        typer.echo(line)
    for job in finished:
        typer.echo(f"gq: job {job.label} already ended ({job.state}); nothing to cancel",
                   err=True)
