"""gq hold, release, requeue, update: change queued or running jobs (like scontrol)."""

from __future__ import annotations

import os
import shlex
import time
from typing import Optional

import typer

from gq import defaults, messages, validation
from gq.cli.common import ask, labels, print_report
from gq.errors import UserError
from gq.queue import dependencies
from gq.queue.states import JobState
from gq.units import parse_duration, parse_when

IDS = typer.Argument(
    ..., metavar="JOBID", help="Job ids: 17 (a job or a whole array), 17_3 (one task)."
)


def hold(job_ids: list[str] = IDS) -> None:
    """Keep pending jobs from starting until 'gq release' (reason JobHeldUser; an
    operator's hold on another user's job is JobHeldAdmin, which only an operator
    releases)."""
    print_report(ask(messages.Hold(labels(job_ids))))


def release(job_ids: list[str] = IDS) -> None:
    """Let held jobs run again (an operator's hold: operators only)."""
    print_report(ask(messages.Release(labels(job_ids))))


def requeue(
    job_ids: Optional[list[str]] = typer.Argument(
        None, metavar="JOBID", help="Job ids: 17 (a job or a whole array), 17_3 (one task)."
    ),
    state: Optional[str] = typer.Option(
        None,
        "-t",
        "--state",
        metavar="STATE",
        help="Every job of yours in this state (F, say), or of the given ids.",
    ),
    user: Optional[str] = typer.Option(
        None,
        "-u",
        "--user",
        metavar="USER",
        help="With --state: this user's jobs (others' need an operator).",
    ),
) -> None:
    """Put jobs back in the queue under the same id: running ones are stopped first
    (SIGTERM, then SIGKILL after the kill wait); ended ones run again
    (gq requeue --state FAILED restarts every failed job of yours)."""
    if not job_ids and state is None:
        raise UserError("nothing to requeue: give job ids or --state (FAILED, say)")
    if user is not None and state is None:
        raise UserError("--user applies with --state")
    if state is not None:
        state = JobState.parse(state).value
    print_report(ask(messages.Requeue(labels(job_ids or []), state=state, user=user)))


def update(
    job_ids: list[str] = IDS,
    priority: Optional[int] = typer.Option(
        None, "--priority", help="New priority (pending or running)."
    ),
    time_limit: Optional[str] = typer.Option(
        None, "-t", "--time", metavar="TIME", help="New time limit (pending or running)."
    ),
    name: Optional[str] = typer.Option(
        None, "-J", "--name", help="New name (pending jobs only, as the rest below)."
    ),
    begin: Optional[str] = typer.Option(
        None, "--begin", metavar="TIME", help="Start no earlier: now+1hour, 16:00, now."
    ),
    args: Optional[str] = typer.Option(
        None,
        "--args",
        metavar="ARGS",
        help="New arguments for the script, as a shell would split them: --args '--lr 3e-4'.",
    ),
    chdir: Optional[str] = typer.Option(
        None, "-D", "--chdir", metavar="DIR", help="New working directory."
    ),
    output: Optional[str] = typer.Option(
        None,
        "-o",
        "--output",
        metavar="PATTERN",
        help="New stdout file (%j, %x, ... as at submit).",
    ),
    error: Optional[str] = typer.Option(
        None, "-e", "--error", metavar="PATTERN", help="New stderr file."
    ),
    dependency: Optional[str] = typer.Option(
        None,
        "-d",
        "--dependency",
        metavar="SPEC",
        help="New dependency (afterok:17, ...); '' removes it.",
    ),
) -> None:
    """Change a job's priority or time limit (pending or running), or a pending job's name,
    begin time, arguments, directory, output files or dependency, its script staying as
    it was submitted (like scontrol update, pueue edit)."""
    if all(
        value is None
        for value in (priority, time_limit, name, begin, args, chdir, output, error, dependency)
    ):
        raise UserError(
            "nothing to update: give --priority, --time, --name, --begin, --args, "
            "--chdir, --output, --error or --dependency"
        )
    when = parse_when(begin, time.time(), "--begin") if begin is not None else None
    limit = parse_duration(time_limit) if time_limit is not None else None
    if priority is not None:
        validation.integer(priority, "--priority", -defaults.MAX_PRIORITY, defaults.MAX_PRIORITY)
    if name is not None:
        validation.job_name(name)
    words = None
    if args is not None:
        try:
            words = shlex.split(args)
        except ValueError as exc:
            raise UserError(f"invalid --args {args[:60]!r}: {exc}") from None
        validation.payload({}, words)
    workdir = None
    if chdir is not None:
        workdir = os.path.abspath(chdir)
        if not os.path.isdir(workdir):  # looked at with the caller's own rights
            raise UserError(f"--chdir {workdir} is not a directory")
    if dependency:
        dependencies.parse(dependency)
    print_report(
        ask(
            messages.Update(
                labels(job_ids),
                priority=priority,
                time_limit=limit,
                name=name,
                begin=when,
                args=words,
                workdir=workdir,
                output=output,
                error=error,
                dependency=dependency,
            )
        )
    )


def drain(
    devices: Optional[list[str]] = typer.Argument(
        None, metavar="DEVICE", help="Devices to drain (as 'gq info' names them) [the whole node]."
    ),
    reason: Optional[str] = typer.Option(
        None, "--reason", metavar="TEXT", help="Why, shown in 'gq info' and pending jobs' REASON."
    ),
) -> None:
    """Admit no new job to the node, or to some devices (like scontrol update
    state=drain); running and resident jobs go on. Operators only; 'gq resume' undoes it."""
    typer.echo(ask(messages.Drain(list(devices or []), reason=reason)).message)


def suspend(job_ids: list[str] = IDS) -> None:
    """Stop running jobs in place (SIGSTOP, or their cgroup's freezer), as scontrol
    suspend: they hold no lane, and their time limit stops; ST shows S. On a GPU a job's
    device memory goes to host memory at its next iteration boundary (the CUDA driver's
    checkpoint API), freeing the device for others; where it cannot, the job keeps it and
    'gq show' says why. 'gq resume JOBID' lets them go on, once their memory fits again.
    Operators only, as in Slurm."""
    print_report(ask(messages.Suspend(labels(job_ids), suspended=True)))


def resume(
    targets: Optional[list[str]] = typer.Argument(
        None,
        metavar="JOBID|DEVICE",
        help="Suspended jobs to go on, or drained devices [the node and every device].",
    ),
) -> None:
    """Let suspended jobs go on (gq resume 17), or undo 'gq drain' (gq resume, gq resume
    gpu1). Operators only."""
    targets = list(targets or [])
    if targets and all(_is_label(target) for target in targets):
        print_report(ask(messages.Suspend(labels(targets), suspended=False)))
    elif any(_is_label(target) for target in targets):
        raise UserError("give job ids or device names, not both")
    else:
        typer.echo(ask(messages.ResumeDevices(targets)).message)


def _is_label(text: str) -> bool:
    return text.replace("_", "", 1).isdigit()
