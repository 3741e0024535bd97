"""Read-only queries over the queue (the daemon is the only process that runs them): jobs
filtered by state, user, name or id, as listings read them, and the pages of finished
jobs. Reads of one job or a few by id are gq.queue.lookups', the scheduling pass's
gq.queue.scheduling_rows', counts and run history gq.queue.stats'."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import lazyload

from gq.queue.models import Job
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.queue.engine import Transaction

# SQLite allows 32766 bound parameters a statement: long id lists go in chunks of this.
CHUNK = 10_000


def chunks(values: Sequence[int]) -> Iterable[list[int]]:
    for start in range(0, len(values), CHUNK):
        yield list(values[start : start + CHUNK])


def among(column: Any, values: Iterable[Any]) -> ColumnElement[bool]:
    """``column IN values``, the values passed as one JSON array (``IN (SELECT value FROM
    json_each(?))``). Written ``column.in_(values)``, each length of the list is a statement
    of its own, and the connection keeps the last 128 prepared: a read of whole job rows is
    about 45 KB of SQLite's memory a length, so a daemon whose listings folded 1 to 50 arrays
    held 2.5 MB of such statements, and a month of lists of every length would hold more."""
    listed = func.json_each(json.dumps(list(values))).table_valued("value")
    return column.in_(select(listed.c.value))


def jobs(
    session: Transaction,
    *,
    states: Iterable[JobState] | None = None,
    users: Iterable[str] | None = None,
    names: Iterable[str] | None = None,
    ids: Iterable[int] | None = None,
    held: bool | None = None,
    payloads: bool = True,
    ended_since: float | None = None,
    unstarted_tasks: bool = True,
    limit: int | None = None,
) -> Sequence[Job]:
    """Jobs by id, filtered (``ended_since``: those that ended since then); ``payloads=False``
    leaves their arguments unread (the scheduling pass needs none); ``unstarted_tasks=False``
    leaves out pending array tasks that never started (:func:`unstarted_task_groups` lists
    them); ``limit``: the first that many (with no ``ids``)."""
    query = select(Job).order_by(Job.id)
    if not payloads:
        query = query.options(lazyload(Job.payload))
    if not unstarted_tasks:
        query = query.where(~_UNSTARTED_TASK)
    if states is not None:
        query = query.where(Job.state.in_([s.value for s in states]))
    if users is not None:
        query = query.where(Job.user.in_(list(users)))
    if names is not None:
        query = query.where(Job.name.in_(list(names)))
    if held is not None:
        query = query.where(Job.held.is_(held))
    if ended_since is not None:
        query = query.where(Job.end_time >= ended_since)
    if ids is None:
        return session.scalars(query if limit is None else query.limit(limit)).all()
    found: list[Job] = []
    for part in chunks(sorted(set(ids))):
        found += session.scalars(query.where(among(Job.id, part))).all()
    return sorted(found, key=lambda job: job.id)


# A pending array task that has never started: what squeue folds into its array's one line.
# Nothing of a run is left on it (a run taken back leaves none: see transitions.requeue).
# (No NULL may reach the condition: its negation lists the other jobs.)
_UNSTARTED_TASK = and_(
    Job.state == JobState.PENDING.value,
    Job.array_job_id.is_not(None),
    func.coalesce(Job.run_count, 0) == 0,
    Job.start_time.is_(None),
    func.coalesce(Job.steps_done, 0) == 0,
    Job.mem_peak.is_(None),
)
# What can make such tasks of one array differ in a listing: gq update and gq hold of one
# task, the scheduler's reasons, a figure set for one. Tasks alike in these are alike in
# every field a listing shows but their ids.
_TASKS_ALIKE = (
    Job.array_job_id,
    Job.name,
    Job.reason,
    Job.priority,
    Job.held,
    Job.time_limit,
    Job.begin_time,
    Job.dependency,
    Job.mem,
    Job.mem_basis,
)


def unstarted_task_groups(
    session: Transaction, users: Iterable[str] | None = None
) -> list[tuple[int, list[int]]]:
    """The pending array tasks that never started, in groups of one array's tasks that look
    alike: each group's first job id and its task ids, in order. One grouped read, with no
    row made for each task (a queue of 10,000 tasks is a few groups)."""
    query = (
        select(func.min(Job.id), func.group_concat(Job.array_task_id))
        .where(_UNSTARTED_TASK)
        .group_by(*_TASKS_ALIKE)
    )
    if users is not None:
        query = query.where(Job.user.in_(list(users)))
    return sorted(
        (first, sorted(map(int, tasks.split(",")))) for first, tasks in session.execute(query)
    )


def finished_page(
    session: Transaction,
    states: Iterable[JobState],
    limit: int,
    *,
    users: Iterable[str] | None = None,
    before: tuple[float, int] | None = None,
    ended_since: float | None = None,
) -> tuple[list[Job], tuple[float, int] | None]:
    """Finished jobs in ``states``, the most recently ended first (then the highest id), at
    most ``limit``; and the (end time, id) to ask ``before`` for the next, older page (None:
    there is none). Walks the end-time index backwards and stops at the page's end, however
    many jobs the queue keeps."""
    query = (
        select(Job)
        .options(lazyload(Job.payload))
        .where(_state_in(states), Job.end_time.is_not(None))
        .order_by(Job.end_time.desc(), Job.id.desc())
    )
    if users is not None:
        query = query.where(Job.user.in_(list(users)))
    if before is not None:
        end, job_id = before
        query = query.where(or_(Job.end_time < end, and_(Job.end_time == end, Job.id < job_id)))
    if ended_since is not None:
        query = query.where(Job.end_time >= ended_since)
    found = list(session.scalars(query.limit(limit + 1)))
    if len(found) > limit:
        last = found[limit - 1]
        assert last.end_time is not None  # the query reads only jobs that ended
        return found[:limit], (last.end_time, last.id)
    return found, None


def _state_in(states: Iterable[JobState]):
    """The condition on a finished job's state. Asked for every finished state (as status
    --all and history are), it is written so that no index can serve it: SQLite's planner,
    which knows nothing of how the states are spread, would otherwise read every finished
    job by the state index and sort them all to return one page (a quarter of a second with
    100,000 kept), where the end-time index gives the page at once. A few states (--state
    FAILED) may be rare, and are left to the state index."""
    values = [s.value for s in states]
    if set(values) >= {s.value for s in JobState if s.terminal}:
        return Job.state.concat("").in_(values)  # an expression: no index applies
    return Job.state.in_(values)


def running(session: Transaction) -> Sequence[Job]:
    return session.scalars(
        select(Job).options(lazyload(Job.payload)).where(Job.state == JobState.RUNNING.value)
    ).all()
