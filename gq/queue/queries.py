"""Read-only queries over the queue, shared by the CLI and the daemon."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import func, select
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


def running(session: Session) -> Sequence[Job]:
    return session.scalars(select(Job).where(Job.state == JobState.RUNNING.value)).all()


def runs_of(session: Session, job_ids: Iterable[int]) -> dict[int, list[Job]]:
    """Each id's job, or every task when the id names a job array."""
    wanted = list(job_ids)
    found: dict[int, list[Job]] = {job_id: [] for job_id in wanted}
    rows = session.scalars(select(Job).where(
        (Job.id.in_(wanted)) | (Job.array_job_id.in_(wanted)))).all()
    for job in rows:
        if job.array_job_id is not None and job.array_job_id in found:
            found[job.array_job_id].append(job)
        elif job.id in found and job.array_job_id is None:
            found[job.id].append(job)
    return found


def resolve(session: Session, label: str) -> list[Job]:
    """Jobs a user names: ``17`` (a job, or a whole array), ``17_3`` (one task)."""
    array_id, _, task = label.partition("_")
    if task:
        return list(session.scalars(select(Job).where(
            Job.array_job_id == int(array_id), Job.array_task_id == int(task))).all())
    return runs_of(session, [int(array_id)])[int(array_id)]


def counts_by_state_and_user(session: Session) -> dict[tuple[str, str], int]:
    rows = session.execute(select(Job.state, Job.user, func.count()).group_by(Job.state, Job.user))
    return {(state, user): count for state, user, count in rows}
