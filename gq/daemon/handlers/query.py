"""Reading the queue: status and history (anyone), a job's log and script (its owner or an
operator)."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from gq import messages
from gq.daemon.access import Caller, check_may_act
from gq.daemon.handlers.common import job_info, resolve, resolve_one
from gq.errors import UserError
from gq.queue import queries, spool
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.daemon.node import Daemon


def list_jobs(daemon: Daemon, caller: Caller, request: messages.ListJobs) -> messages.Jobs:
    """Anyone may list the queue, as squeue lets them."""
    states = None if request.states is None else [JobState.parse(s) for s in request.states]
    with daemon.db.read() as session:
        jobs = queries.jobs(session, states=states, users=request.users)
        return messages.Jobs([job_info(job) for job in jobs], stale=daemon.stale())


def show(daemon: Daemon, caller: Caller, request: messages.ShowJob) -> messages.Jobs:
    """One job with its state history; an array's id shows every task."""
    with daemon.db.read() as session:
        jobs = resolve(session, request.label)
        return messages.Jobs([job_info(job, list(queries.events(session, job.id)))
                              for job in jobs], stale=daemon.stale())


def open_log(daemon: Daemon, caller: Caller, request: messages.OpenLog):
    """Open the job's output file for the caller and pass the descriptor.

    The file is the job owner's: it must be a regular file owned by them, reached without
    following a link at its last component, so a planted link cannot make the daemon read a
    file the owner could not.
    """
    with daemon.db.read() as session:
        job = resolve_one(session, request.label)
        info = job_info(job)
    check_may_act(caller, job.uid, job.user, "read the logs of", job.label)
    path = job.stderr_path if request.stderr else job.stdout_path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return messages.LogFile(info, path, exists=False)
    except OSError as exc:
        raise UserError(f"cannot open job {job.label}'s output file {path}: "
                        f"{exc.strerror}") from None
    status = os.fstat(fd)
    owner_ok = job.uid is None or status.st_uid == job.uid or not daemon.home.system
    if not stat.S_ISREG(status.st_mode) or not owner_ok:
        os.close(fd)
        raise UserError(f"job {job.label}'s output {path} is not a file of {job.user}'s; "
                        "not opened")
    return messages.LogFile(info, path, exists=True), [fd]


def export(daemon: Daemon, caller: Caller, request: messages.ExportScript) -> messages.Script:
    with daemon.db.read() as session:
        job = resolve_one(session, request.label)
        info = job_info(job)
    check_may_act(caller, job.uid, job.user, "export", job.label)
    try:
        body = spool.read(job.spool_path)
    except OSError as exc:
        raise UserError(f"cannot read the snapshot of job {job.label}: {exc.strerror}") from None
    return messages.Script(info, body)
