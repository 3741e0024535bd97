"""gq cancel: end pending jobs now, running ones through the daemon (like scancel)."""

from __future__ import annotations

from typing import Optional

import typer

from gq.cli.common import database, parse_job_id, the_home
from gq.errors import UserError
from gq.queue import queries, transitions
from gq.queue.states import JobState


def cancel(
    job_ids: Optional[list[str]] = typer.Argument(None, help="Job ids to cancel."),
    state: Optional[str] = typer.Option(None, "-t", "--state", help="Only jobs in this state (PD or R)."),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Only jobs with this name."),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="Only this user's jobs."),
) -> None:
    """Cancel jobs by id, or every active job matching --state/--name/--user.

    Pending jobs become CANCELLED at once; running ones get SIGTERM (SIGKILL after the
    daemon's kill wait) and become CANCELLED when they have exited.
    """
    ids = [parse_job_id(text) for text in job_ids or []]
    if not ids and state is None and name is None and user is None:
        raise UserError("nothing to cancel: give job ids or --state/--name/--user")
    wanted_state = JobState.parse(state) if state else None
    if wanted_state is not None and wanted_state.terminal:
        raise UserError(f"--state {state}: only PENDING or RUNNING jobs can be cancelled")
    with database().write() as session:
        if ids:
            found = {job.id: job for job in queries.jobs(session, ids=ids)}
            missing = [i for i in ids if i not in found]
            if missing:
                raise UserError(f"no job {', '.join(map(str, missing))}; nothing was cancelled "
                                "(see 'gq status --all')")
        candidates = queries.jobs(
            session, ids=ids or None,
            states=[wanted_state] if wanted_state else [JobState.PENDING, JobState.RUNNING],
            users=[user] if user else None, names=[name] if name else None)
        outcome = []
        for job in candidates:
            if job.state == JobState.PENDING.value:
                done = transitions.cancel_pending(session, job.id, "cancelled by user")
                outcome.append((job.id, "cancelled" if done else None))
            elif job.state == JobState.RUNNING.value:
                done = transitions.request_cancel(session, job.id)
                outcome.append((job.id, "cancelling" if done else None))
        finished = [job for job in (found.values() if ids else []) if JobState(job.state).terminal]
    from gq.daemon.control import poke

    poke(the_home())
    for job_id, what in outcome:
        if what == "cancelled":
            typer.echo(f"Cancelled job {job_id}")
        elif what == "cancelling":
            typer.echo(f"Cancelling job {job_id} (running; it ends after SIGTERM)")
    for job in finished:
        typer.echo(f"gq: job {job.id} already ended ({job.state}); nothing to cancel", err=True)
