"""Reads of one job or a few, by id: a job, its payload, its array's tasks, its history,
the jobs a user names, what launching them reads, and the states a dependency on them
looks at."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import undefer

from gq.queue.models import Job, JobEvent, Payload
from gq.queue.prepared import Prepared
from gq.queue.queries import among, chunks
from gq.queue.states import PREEMPTED

if TYPE_CHECKING:
    from gq.queue.engine import Transaction


def run_states(session: Transaction, job_ids: Iterable[int]) -> dict[int, list[tuple[str, bool]]]:
    """Each id's (state, started) pair, or one per task when the id names a job array: what
    a dependency on it looks at."""
    wanted = sorted(set(job_ids))
    found: dict[int, list[tuple[str, bool]]] = {job_id: [] for job_id in wanted}
    for part in chunks(wanted):
        rows = session.execute(
            select(Job.id, Job.array_job_id, Job.state, Job.start_time).where(
                among(Job.id, part) | among(Job.array_job_id, part)
            )
        )
        for job_id, array_id, state, start in rows:
            if array_id is not None and array_id in found:
                found[array_id].append((state, start is not None))
            elif job_id in found and array_id is None:
                found[job_id].append((state, start is not None))
    return found


def payload_jobs(session: Transaction, payload_id: int) -> list[tuple[int, str]]:
    """The jobs of one submission (one, or an array's tasks): id and state."""
    return [
        (job_id, state)
        for job_id, state in session.execute(
            select(Job.id, Job.state).where(Job.payload_id == payload_id)
        )
    ]


def array_task_ids(session: Transaction, array_job_id: int) -> list[int]:
    """The task ids of a job array, in order."""
    return list(
        session.scalars(
            select(Job.array_task_id)
            .where(Job.array_job_id == array_job_id)
            .order_by(Job.array_task_id)
        )
    )


_TASK = Job.array_task_id
# Read at the launch of every array task: constructed once, run on the connection itself (a
# statement built and run through a session each time cost more than the task's launch).
_ARRAY_SPAN = Prepared(
    select(
        func.count(), func.min(_TASK), func.max(_TASK), func.sum(_TASK), func.sum(_TASK * _TASK)
    ).where(Job.array_job_id == bindparam("array"))
)


def array_span(session: Transaction, array_job_id: int) -> tuple[int, int, int, int]:
    """How many tasks a job array has, its lowest task id, its highest, and its step: the
    spacing of an evenly spaced array (0-20:5), else 1 (one row read, however large)."""
    count, low, high, total, squares = _ARRAY_SPAN.rows(session, {"array": array_job_id})[0]
    count, low, high = int(count), int(low or 0), int(high or 0)
    if count <= 1:
        return count, low, high, 1
    step, rest = divmod(high - low, count - 1)
    # Evenly spaced ids have these sums (of ids, of their squares); ids that merely share
    # the ends and the count with such an array (1,2,5 and 1,3,5) do not.
    n, pairs = count, count * (count - 1) // 2
    even_total = n * low + step * pairs
    even_squares = (
        n * low * low + 2 * low * step * pairs + step * step * (n - 1) * n * (2 * n - 1) // 6
    )
    if rest or step == 0 or (total, squares) != (even_total, even_squares):
        step = 1
    return count, low, high, step


def job(session: Transaction, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def payload(session: Transaction, payload_id: int) -> Payload:
    """A job's environment and arguments, for its launch."""
    return session.scalars(
        select(Payload).options(undefer(Payload.env)).where(Payload.id == payload_id)
    ).one()


# Plain records of a launch's rows, as the scheduling pass reads its own
# (gq.queue.scheduling_rows): SQLAlchemy's Row reads a column by name in microseconds. Each
# has its table's columns as attributes, named and typed as the model's: type checkers read
# it as the model.
if TYPE_CHECKING:

    class JobRow(Job):
        @classmethod
        def _make(cls, values: Iterable[Any]) -> JobRow: ...

    class PayloadRow(Payload):
        @classmethod
        def _make(cls, values: Iterable[Any]) -> PayloadRow: ...

else:
    JobRow = namedtuple("JobRow", Job.__table__.columns.keys())
    PayloadRow = namedtuple("PayloadRow", Payload.__table__.columns.keys())


_JOB_ROWS = Prepared(
    select(Job.__table__).where(Job.__table__.c.id.in_(bindparam("ids", expanding=True)))
)
_PAYLOAD_ROWS = Prepared(
    select(Payload.__table__).where(Payload.__table__.c.id.in_(bindparam("ids", expanding=True)))
)


def launching(
    session: Transaction, job_ids: Sequence[int]
) -> tuple[dict[int, JobRow], dict[int, PayloadRow]]:
    """What launching these jobs reads: their rows, and their payloads' rows (environment and
    arguments) by payload id. Plain records, with the columns as attributes: a pass that
    starts many short jobs costs the daemon little."""
    jobs = {
        row.id: row
        for part in chunks(list(job_ids))
        for row in map(JobRow._make, _JOB_ROWS.rows(session, {"ids": part}))
    }
    wanted = sorted({row.payload_id for row in jobs.values()})
    payloads = {
        row.id: row
        for part in chunks(wanted)
        for row in map(PayloadRow._make, _PAYLOAD_ROWS.rows(session, {"ids": part}))
    }
    return jobs, payloads


def events(session: Transaction, job_ids: Iterable[int]) -> dict[int, list[JobEvent]]:
    """The state history of each job, oldest first: a few queries however many jobs."""
    found: dict[int, list[JobEvent]] = {job_id: [] for job_id in job_ids}
    for part in chunks(sorted(found)):
        for event in session.scalars(
            select(JobEvent).where(among(JobEvent.job_id, part)).order_by(JobEvent.id)
        ):
            found[event.job_id].append(event)
    return found


def preemption_times(
    session: Transaction, job_ids: Iterable[int]
) -> dict[int, tuple[float | None, float | None]]:
    """When each job last went out (RUNNING to PREEMPTED) and last came back (PREEMPTED to
    RUNNING), from its state history: None where it never did."""
    found: dict[int, tuple[float | None, float | None]] = {}
    for part in chunks(sorted(set(job_ids))):
        for job_id, old, latest in session.execute(
            select(JobEvent.job_id, JobEvent.old_state, func.max(JobEvent.time))
            .where(
                among(JobEvent.job_id, part),
                (JobEvent.new_state == PREEMPTED) | (JobEvent.old_state == PREEMPTED),
            )
            .group_by(JobEvent.job_id, JobEvent.old_state)
        ):
            out, back = found.get(job_id, (None, None))
            found[job_id] = (out, latest) if old == PREEMPTED else (latest, back)
    return found


def runs_of(session: Transaction, job_ids: Iterable[int]) -> dict[int, list[Job]]:
    """Each id's job, or every task when the id names a job array."""
    wanted = sorted(set(job_ids))
    found: dict[int, list[Job]] = {job_id: [] for job_id in wanted}
    for part in chunks(wanted):
        rows = session.scalars(
            select(Job).where(among(Job.id, part) | among(Job.array_job_id, part))
        ).all()
        for job in rows:
            if job.array_job_id is not None and job.array_job_id in found:
                found[job.array_job_id].append(job)
            elif job.id in found and job.array_job_id is None:
                found[job.id].append(job)
    return found


def resolve(session: Transaction, label: str) -> list[Job]:
    """Jobs a user names: ``17`` (a job, or a whole array), ``17_3`` (one task)."""
    array_id, _, task = label.partition("_")
    if task:
        return list(
            session.scalars(
                select(Job).where(Job.array_job_id == int(array_id), Job.array_task_id == int(task))
            ).all()
        )
    return runs_of(session, [int(array_id)])[int(array_id)]
