"""gq cancel: end pending jobs now, running ones through the daemon (like scancel)."""

from __future__ import annotations

from typing import Optional

import typer

from gq import messages
from gq.cli.common import ask, labels, print_report
from gq.errors import UserError
from gq.queue.states import JobState


def cancel(
    job_ids: Optional[list[str]] = typer.Argument(
        None, metavar="JOBID", help="Job ids: 17 (a job or a whole array), 17_3 (one task)."
    ),
    state: Optional[str] = typer.Option(
        None, "-t", "--state", metavar="STATE", help="Only jobs in this state (PD or R)."
    ),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Only jobs with this name."),
    user: Optional[str] = typer.Option(
        None,
        "-u",
        "--user",
        metavar="USER",
        help="Only this user's jobs (others' need an operator).",
    ),
) -> None:
    """Cancel jobs by id, or every active job of yours matching --state/--name/--user.

    Pending jobs become CANCELLED at once; running ones get SIGTERM (SIGKILL after the
    daemon's kill wait) and become CANCELLED when they have exited. Only a job's owner or
    an operator may cancel it.
    """
    if not job_ids and state is None and name is None and user is None:
        raise UserError("nothing to cancel: give job ids or --state/--name/--user")
    if state is not None:
        state = JobState.parse(state).value
    print_report(ask(messages.Cancel(labels(job_ids or []), state=state, name=name, user=user)))
