"""gq logs: a job's output (or error) file printed, and followed until the job ends (-f); the
file opened by the daemon, with its owner's rights, or by the owner's own client."""

from __future__ import annotations

import os
import stat
import sys
import time

import typer

from gq import messages
from gq.cli.common import ask, labels
from gq.errors import UserError
from gq.queue.states import JobState


def logs(
    job_id: str = typer.Argument(
        ..., metavar="JOBID", help="The job id (17, or 17_3 for an array task)."
    ),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends."),
    stderr: bool = typer.Option(False, "--err", help="Show the job's stderr file instead."),
) -> None:
    """Print a job's output file (like tail; -f follows it until the job ends).

    The daemon opens the file for you if you own the job (or are an operator).
    """
    label = labels([job_id])[0]
    fd, answer = _open_log(label, stderr)
    if not follow:
        if fd is None:
            if answer.job.state == JobState.PENDING.value:
                print(
                    f"gq: job {answer.job.label} is pending; it has no output yet", file=sys.stderr
                )
                return
            raise UserError(f"job {answer.job.label}'s output file {answer.path} does not exist")
        with os.fdopen(fd, "rb") as whole:
            _copy(whole)
        return
    handle = None if fd is None else os.fdopen(fd, "rb")
    try:
        while True:
            if handle is None:
                fd, answer = _open_log(label, stderr)
                handle = None if fd is None else os.fdopen(fd, "rb")
            if handle is not None:
                _copy(handle)
            if JobState(ask(messages.ShowJob(label)).jobs[0].state).terminal:
                if handle is not None:
                    _copy(handle)
                return
            time.sleep(0.2)
    finally:
        if handle is not None:
            handle.close()


def _open_log(label: str, stderr: bool) -> tuple[int | None, messages.LogFile]:
    """The job's output file, open: passed by the daemon (opened with the owner's rights),
    or, for the owner, opened here with their own."""
    from gq import client

    answer, fds = client.ask_with_fds(messages.OpenLog(label, stderr))
    if answer.opened:
        return (fds[0] if fds else None), answer
    for fd in fds:
        os.close(fd)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(answer.path, flags)
    except FileNotFoundError:
        return None, answer
    except OSError as exc:
        raise UserError(
            f"cannot open job {answer.job.label}'s output file {answer.path}: {exc.strerror}"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(
            f"job {answer.job.label}'s output {answer.path} is not a regular file; not read"
        )
    os.set_blocking(fd, True)
    return fd, answer


def _copy(handle) -> None:
    while chunk := handle.read(1 << 16):
        sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
