"""gq hold, release, requeue, update: change queued or running jobs (like scontrol)."""

from __future__ import annotations

from typing import Optional

import typer

from gq import defaults, messages, validation
from gq.cli.common import ask, labels, print_report
from gq.errors import UserError
from gq.units import parse_duration

IDS = typer.Argument(..., metavar="JOBID", help="Job ids: 17 (a job or a whole array), 17_3 (one task).")


def hold(job_ids: list[str] = IDS) -> None:
    """Keep pending jobs from starting until 'gq release' (reason JobHeldUser; an
    operator's hold on another user's job is JobHeldAdmin, which only an operator
    releases)."""
    print_report(ask(messages.Hold(labels(job_ids))))


def release(job_ids: list[str] = IDS) -> None:
    """Let held jobs run again (an operator's hold: operators only)."""
    print_report(ask(messages.Release(labels(job_ids))))


def requeue(job_ids: list[str] = IDS) -> None:
    """Put jobs back in the queue under the same id: running ones are stopped first
    (SIGTERM, then SIGKILL after the kill wait); ended ones run again."""
    print_report(ask(messages.Requeue(labels(job_ids))))


def update(
    job_ids: list[str] = IDS,
    priority: Optional[int] = typer.Option(None, "--priority", help="New priority (pending or running)."),
    time_limit: Optional[str] = typer.Option(None, "-t", "--time", metavar="TIME", help="New time limit (pending or running)."),
    name: Optional[str] = typer.Option(None, "-J", "--name", help="New name (pending jobs only)."),
) -> None:
    """Change a job's priority, time limit or name (like scontrol update)."""
    if priority is None and time_limit is None and name is None:
        raise UserError("nothing to update: give --priority, --time or --name")
    limit = parse_duration(time_limit) if time_limit is not None else None
    if priority is not None:
        validation.integer(priority, "--priority", -defaults.MAX_PRIORITY, defaults.MAX_PRIORITY)
    if name is not None:
        validation.job_name(name)
    print_report(ask(messages.Update(labels(job_ids), priority=priority, time_limit=limit,
                                     name=name)))
