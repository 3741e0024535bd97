"""Read-only queries over the queue, shared by the CLI and the daemon."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gq.queue.models import Job, JobEvent
from gq.queue.states import JobState


def jobs(session: Session, *, states: Iterable[JobState] | None = None,
         users: Iterable[str] | None = None, names: Iterable[str] | None = None,
         ids: Iterable[int] | None = None) -> Sequence[Job]:
    query = select(Job).order_by(Job.id)
    if states is not None:
        query = query.where(Job.state.in_([s.value for s in states]))
    if users is not None:
        query = query.where(Job.user.in_(list(users)))
    if names is not None:
        query = query.where(Job.name.in_(list(names)))
    if ids is not None:
        query = query.where(Job.id.in_(list(ids)))
    return session.scalars(query).all()


def job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def events(session: Session, job_id: int) -> Sequence[JobEvent]:
    return session.scalars(
        select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
    ).all()


def cancel_requested(session: Session) -> Sequence[Job]:
    return session.scalars(
        select(Job).where(Job.state == JobState.RUNNING.value, Job.cancel_requested.is_(True))
    ).all()
