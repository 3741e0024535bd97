"""Changing jobs: cancel, hold, release, requeue, update (like scancel and scontrol).

Every label is resolved and every named job's owner checked before anything changes, so an
unknown id or someone else's job refuses the whole request and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from gq import messages
from gq.daemon.access import Caller, check_may_act, check_priority
from gq.daemon.handlers.common import resolve
from gq.errors import Refused, UserError
from gq.messages import REFUSED, WARNING, Line
from gq.queue import queries, transitions
from gq.queue.models import Job
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.daemon.node import Daemon


def _named(session: Session, caller: Caller, labels: list[str], verb: str) -> list[Job]:
    jobs = [job for label in labels for job in resolve(session, label)]
    for job in jobs:
        check_may_act(caller, job.uid, job.user, verb, job.label)
    return jobs


def cancel(daemon: Daemon, caller: Caller, request: messages.Cancel) -> messages.Report:
    """Pending jobs end at once; running ones are stopped by the daemon (SIGTERM, then
    SIGKILL after the kill wait) and end CANCELLED once they have exited."""
    if not request.labels and request.state is None and request.name is None \
            and request.user is None:
        raise UserError("nothing to cancel: give job ids or --state/--name/--user")
    wanted = JobState.parse(request.state) if request.state else None
    if wanted is not None and wanted.terminal:
        raise UserError(f"--state {request.state}: only PENDING or RUNNING jobs can be cancelled")
    if request.user is not None and request.user != caller.name and not caller.operator:
        raise Refused(f"only an operator may cancel {request.user}'s jobs; "
                      f"{caller.name} is not one")
    lines = []
    with daemon.db.write() as session:
        named = _named(session, caller, request.labels, "cancel")
        ended = [job for job in named if JobState(job.state).terminal]
        candidates = queries.jobs(
            session, ids=[job.id for job in named] if request.labels else None,
            states=[wanted] if wanted else [JobState.PENDING, JobState.RUNNING],
            users=[request.user] if request.user else None,
            names=[request.name] if request.name else None)
        if not caller.operator:  # filters alone reach only the caller's own jobs
            candidates = [job for job in candidates if job.uid == caller.uid]
        for job in candidates:
            if job.state == JobState.PENDING.value:
                if transitions.cancel_pending(session, job.id, "cancelled by user"):
                    lines.append(Line(f"Cancelled job {job.label}"))
            elif transitions.request_stop(session, job.id, transitions.CANCEL):
                lines.append(Line(f"Cancelling job {job.label} (running; it ends after SIGTERM)"))
    lines += [Line(f"job {job.label} already ended ({job.state}); nothing to cancel", WARNING)
              for job in ended]
    daemon.wake = True
    return messages.Report(lines)


def _each(daemon: Daemon, caller: Caller, labels: list[str], verb: str,
          act: Callable[[Session, Job], Line | None],
          check: Callable[[Job], None] | None = None) -> messages.Report:
    """Resolve and authorize every job (and ``check`` each, which may refuse the whole
    request) before acting on any, in one transaction."""
    with daemon.db.write() as session:
        jobs = _named(session, caller, labels, verb)
        if check is not None:
            for job in jobs:
                check(job)
        lines = [line for job in jobs if (line := act(session, job)) is not None]
    daemon.wake = True
    return messages.Report(lines)


def hold(daemon: Daemon, caller: Caller, request: messages.Hold) -> messages.Report:
    def act(session: Session, job: Job) -> Line:
        if transitions.set_held(session, job.id, True):
            return Line(f"Held job {job.label}")
        return Line(f"job {job.label} is {job.state}; only pending jobs can be held", REFUSED)

    return _each(daemon, caller, request.labels, "hold", act)


def release(daemon: Daemon, caller: Caller, request: messages.Release) -> messages.Report:
    def act(session: Session, job: Job) -> Line | None:
        if job.state != JobState.PENDING.value:
            return Line(f"job {job.label} is {job.state}; only pending jobs can be released",
                        REFUSED)
        if not job.held:
            return Line(f"Job {job.label} was not held")
        transitions.set_held(session, job.id, False)
        return Line(f"Released job {job.label}")

    return _each(daemon, caller, request.labels, "release", act)


def requeue(daemon: Daemon, caller: Caller, request: messages.Requeue) -> messages.Report:
    """Running jobs are stopped first and go back to the queue; ended ones run again."""
    def act(session: Session, job: Job) -> Line:
        state = JobState(job.state)
        if state is JobState.RUNNING:
            if transitions.request_stop(session, job.id, transitions.REQUEUE):
                return Line(f"Requeueing job {job.label} (running; it restarts after it stops)")
        elif state.terminal and transitions.requeue_finished(session, job):
            return Line(f"Requeued job {job.label}")
        return Line(f"job {job.label} is {job.state}; nothing to requeue", REFUSED)

    return _each(daemon, caller, request.labels, "requeue", act)


def update(daemon: Daemon, caller: Caller, request: messages.Update) -> messages.Report:
    """Priority and time limit of pending or running jobs; the name of pending ones."""
    if request.priority is None and request.time_limit is None and request.name is None:
        raise UserError("nothing to update: give --priority, --time or --name")
    if request.time_limit is not None and request.time_limit <= 0:
        raise UserError(f"invalid --time {request.time_limit}: must be greater than zero")

    def check(job: Job) -> None:
        if request.priority is not None:
            check_priority(daemon.rules, caller, request.priority, job.priority, job.label)

    def act(session: Session, job: Job) -> Line:
        if request.name is not None and job.state != JobState.PENDING.value:
            return Line(f"job {job.label} is {job.state}; only a pending job can be renamed",
                        REFUSED)
        if transitions.modify(session, job, name=request.name, priority=request.priority,
                              time_limit=request.time_limit):
            return Line(f"Updated job {job.label}")
        return Line(f"job {job.label} is {job.state}; only pending or running jobs can be "
                    "updated", REFUSED)

    return _each(daemon, caller, request.labels, "update", act, check)
