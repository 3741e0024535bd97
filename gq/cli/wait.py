"""gq wait: block until jobs have ended, on one connection (like sbatch --wait, pueue wait)."""

from __future__ import annotations

import math
from typing import Optional

import typer

from gq import messages
from gq.cli.common import ask, labels
from gq.errors import UserError
from gq.units import parse_seconds

_SHOWN = 20  # jobs listed one per line; more are counted by state


def wait(
    job_ids: Optional[list[str]] = typer.Argument(
        None,
        metavar="JOBID",
        help="Job ids: 17 (a job or a whole array), 17_3 (one task) [all your pending and running jobs].",
    ),
    user: Optional[str] = typer.Option(
        None,
        "-u",
        "--user",
        metavar="USER",
        help="Without ids: this user's pending and running jobs.",
    ),
    timeout: Optional[str] = typer.Option(
        None,
        "--timeout",
        metavar="PERIOD",
        help="Give up after this long (30, 30s, 5min): exit status 124.",
    ),
) -> None:
    """Wait until jobs have ended, then say how each ended. Exits with the job's exit code
    (for several, the first failed one's, in id order; 1 for a job that failed, was
    cancelled or timed out without one), 124 if --timeout passes first."""
    if job_ids and user is not None:
        raise UserError("give job ids or --user, not both")
    raise typer.Exit(until_ended(messages.Wait(labels(job_ids or []), user=user), seconds(timeout)))


def seconds(timeout: str | None) -> float:
    """--timeout as seconds (a bare number is seconds); none: as long as it takes."""
    if timeout is None:
        return math.inf
    value = parse_seconds(timeout, "--timeout")
    if value == 0:
        raise UserError("invalid --timeout 0: give a time such as 30s or 5min")
    return value


def until_ended(request: messages.Wait, timeout: float) -> int:
    """Ask, print how the jobs ended, and return the exit status to leave with."""
    answer = ask(request, wait=timeout)
    for ended in answer.jobs[:_SHOWN]:
        code = "" if ended.exit_code is None else f" (exit code {ended.exit_code})"
        typer.echo(f"Job {ended.label} {ended.state}{code}")
    if len(answer.jobs) > _SHOWN:
        counts: dict[str, int] = {}
        for ended in answer.jobs[_SHOWN:]:
            counts[ended.state] = counts.get(ended.state, 0) + 1
        typer.echo(
            f"... and {len(answer.jobs) - _SHOWN} more: "
            + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        )
    for ended in answer.jobs:
        if ended.state != "COMPLETED":
            return min(255, ended.exit_code) if ended.exit_code else 1
    return 0
