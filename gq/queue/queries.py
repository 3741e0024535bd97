"""Read-only queries over the queue (the daemon is the only process that runs them)."""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Iterable, Sequence
from operator import itemgetter

from sqlalchemy import and_, bindparam, case, func, or_, select
from sqlalchemy.orm import Session, lazyload, undefer

from gq.queue.models import Job, JobEvent, Payload, SpoolUsage
from gq.queue.prepared import Prepared
from gq.queue.states import JobState

# SQLite allows 32766 bound parameters a statement: long id lists go in chunks of this.
CHUNK = 10_000


def chunks(values: Sequence[int]) -> Iterable[list[int]]:
    for start in range(0, len(values), CHUNK):
        yield list(values[start : start + CHUNK])


def jobs(
    session: Session,
    *,
    states: Iterable[JobState] | None = None,
    users: Iterable[str] | None = None,
    names: Iterable[str] | None = None,
    ids: Iterable[int] | None = None,
    held: bool | None = None,
    payloads: bool = True,
    ended_since: float | None = None,
    unstarted_tasks: bool = True,
) -> Sequence[Job]:
    """Jobs by id, filtered (``ended_since``: those that ended since then); ``payloads=False``
    leaves their arguments unread (the scheduling pass needs none); ``unstarted_tasks=False``
    leaves out pending array tasks that never started (:func:`unstarted_task_groups` lists
    them)."""
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
        return session.scalars(query).all()
    found: list[Job] = []
    for part in chunks(sorted(set(ids))):
        found += session.scalars(query.where(Job.id.in_(part))).all()
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
    session: Session, users: Iterable[str] | None = None
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
    session: Session,
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


# What the scheduling pass reads of a job: plain rows, not ORM objects, so that a queue of
# many thousands of pending jobs costs the daemon little each pass.
_SCHEDULING = (
    Job.id,
    Job.user,
    Job.name,
    Job.submit_time,
    Job.priority,
    Job.steps_total,
    Job.deadline,
    Job.time_limit,
    Job.dependency,
    Job.reason,
    Job.gpus,
    Job.mem,
    Job.exclusive,
    Job.array_job_id,
    Job.array_max_running,
    Job.stop_request,
    Job.held,
    Job.begin_time,
    Job.gpu_type,
    Job.host_mem,
    Job.cpus,
    Job.nodelist,
    Job.suspended,
    Job.steps_done,
    Job.attained,
    Job.mean_iteration,
    Job.mean_gap,
    Job.holds_lane,
    Job.interpreter,
    Job.mem_basis,
)


# Plain records of those rows: SQLAlchemy's Row reads a column by name in microseconds, and a
# pass reads a dozen of every pending job's.
SchedulingRow = namedtuple("SchedulingRow", [column.key for column in _SCHEDULING])
JobRow = namedtuple("JobRow", Job.__table__.columns.keys())
PayloadRow = namedtuple("PayloadRow", Payload.__table__.columns.keys())

# Read every pass: constructed once (constructing a statement costs more than running it).
_FOR_SCHEDULING = {
    (state, held): Prepared(
        select(*_SCHEDULING)
        .where(Job.state == state.value)
        .order_by(Job.id)
        .where(*([] if held is None else [Job.held.is_(held)]))
    )
    for state in (JobState.PENDING, JobState.RUNNING)
    for held in (None, False, True)
}
_HELD_WITH_DEADLINE = Prepared(
    select(*_SCHEDULING).where(
        Job.state == JobState.PENDING.value, Job.held.is_(True), Job.deadline.is_not(None)
    )
)


def for_scheduling(session: Session, state: JobState, held: bool | None = None) -> Sequence:
    """Rows of the jobs in ``state`` (PENDING or RUNNING; held or not) with what scheduling
    needs of them."""
    return list(map(SchedulingRow._make, _FOR_SCHEDULING[state, held].rows(session)))


_PENDING_BY_ID = Prepared(
    select(*_SCHEDULING).where(
        Job.id.in_(bindparam("ids", expanding=True)),
        Job.state == JobState.PENDING.value,
        Job.held.is_(False),
    )
)


class PendingRows:
    """The scheduling rows of the PENDING jobs that are not held, kept between passes: a
    pass reads again only the jobs a transaction changed since the last (``changed``, from
    :meth:`gq.queue.engine.Database.pending_changes`), not a queue of thousands each time;
    all of them where nothing says what changed (None), and every ``reread_after`` seconds
    (a write from outside the daemon)."""

    def __init__(self, reread_after: float):
        self.reread_after = reread_after
        self._rows: dict[int, SchedulingRow] = {}
        self._ordered: list[SchedulingRow] = []
        self._read_all_at = -math.inf
        self.drifted: list[int] = []  # jobs whose kept row the last reading of all corrected

    def read(self, session: Session, changed: set[int] | None, now: float) -> list:
        """The rows, by id. Where reading fails, the next read is of them all (the changes
        taken for it are gone)."""
        try:
            if changed is None or now - self._read_all_at >= self.reread_after:
                rows = for_scheduling(session, JobState.PENDING, held=False)
                found = {row.id: row for row in rows}
                if changed is not None:  # jobs changed since the last pass are no drift
                    self.drifted = sorted(
                        job_id
                        for job_id in self._rows.keys() | found.keys()
                        if job_id not in changed and self._rows.get(job_id) != found.get(job_id)
                    )
                self._ordered, self._rows, self._read_all_at = rows, found, now
            elif changed:
                for job_id in changed:
                    self._rows.pop(job_id, None)
                for part in chunks(sorted(changed)):
                    for row in map(
                        SchedulingRow._make, _PENDING_BY_ID.rows(session, {"ids": part})
                    ):
                        self._rows[row.id] = row
                self._ordered = sorted(self._rows.values(), key=_job_id)
        except BaseException:
            self._read_all_at = -math.inf
            raise
        return self._ordered


_job_id = itemgetter(0)


def held_with_deadline(session: Session) -> Sequence:
    """Held pending jobs that have a deadline (they are removed once they cannot meet it)."""
    return list(map(SchedulingRow._make, _HELD_WITH_DEADLINE.rows(session)))


def run_states(session: Session, job_ids: Iterable[int]) -> dict[int, list[tuple[str, bool]]]:
    """Each id's (state, started) pair, or one per task when the id names a job array: what
    a dependency on it looks at."""
    wanted = sorted(set(job_ids))
    found: dict[int, list[tuple[str, bool]]] = {job_id: [] for job_id in wanted}
    for part in chunks(wanted):
        rows = session.execute(
            select(Job.id, Job.array_job_id, Job.state, Job.start_time).where(
                Job.id.in_(part) | Job.array_job_id.in_(part)
            )
        )
        for job_id, array_id, state, start in rows:
            if array_id is not None and array_id in found:
                found[array_id].append((state, start is not None))
            elif job_id in found and array_id is None:
                found[job_id].append((state, start is not None))
    return found


def payload_jobs(session: Session, payload_id: int) -> list[tuple[int, str]]:
    """The jobs of one submission (one, or an array's tasks): id and state."""
    return [
        (job_id, state)
        for job_id, state in session.execute(
            select(Job.id, Job.state).where(Job.payload_id == payload_id)
        )
    ]


def array_task_ids(session: Session, array_job_id: int) -> list[int]:
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


def array_span(session: Session, array_job_id: int) -> tuple[int, int, int, int]:
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


def job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def payload(session: Session, payload_id: int) -> Payload:
    """A job's environment and arguments, for its launch."""
    return session.scalars(
        select(Payload).options(undefer(Payload.env)).where(Payload.id == payload_id)
    ).one()


_JOB_ROWS = Prepared(
    select(Job.__table__).where(Job.__table__.c.id.in_(bindparam("ids", expanding=True)))
)
_PAYLOAD_ROWS = Prepared(
    select(Payload.__table__).where(Payload.__table__.c.id.in_(bindparam("ids", expanding=True)))
)


def launching(
    session: Session, job_ids: Sequence[int]
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


def events(session: Session, job_ids: Iterable[int]) -> dict[int, list[JobEvent]]:
    """The state history of each job, oldest first: a few queries however many jobs."""
    found: dict[int, list[JobEvent]] = {job_id: [] for job_id in job_ids}
    for part in chunks(sorted(found)):
        for event in session.scalars(
            select(JobEvent).where(JobEvent.job_id.in_(part)).order_by(JobEvent.id)
        ):
            found[event.job_id].append(event)
    return found


def running(session: Session) -> Sequence[Job]:
    return session.scalars(
        select(Job).options(lazyload(Job.payload)).where(Job.state == JobState.RUNNING.value)
    ).all()


_RECENT_RUNS = Prepared(
    select(
        Job.start_time,
        Job.end_time,
        Job.steps_done,
        Job.attained,
        Job.mean_iteration,
        Job.mean_gap,
        Job.startup,
    )
    .where(
        Job.user == bindparam("user"),
        Job.name == bindparam("name"),
        Job.end_time.is_not(None),
        Job.start_time.is_not(None),
        Job.state == JobState.COMPLETED.value,
    )
    .order_by(Job.end_time.desc())
    .limit(bindparam("limit"))
)


def recent_runs(session: Session, user: str, name: str, limit: int) -> list[tuple]:
    """The user's last ``limit`` completed jobs of that name, the last ended first: start,
    end, steps done, attained device time, mean iteration and gap, and start-up (None
    where its host did not measure one)."""
    return list(_RECENT_RUNS.rows(session, {"user": user, "name": name, "limit": limit}))


_RECENT_RUN_TIMES = Prepared(
    select(Job.end_time - Job.start_time)
    .where(
        Job.end_time.is_not(None),
        Job.start_time.is_not(None),
        Job.state == JobState.COMPLETED.value,
    )
    .order_by(Job.end_time.desc())
    .limit(bindparam("limit"))
)


def recent_run_times(session: Session, limit: int) -> list[float]:
    """How long the node's last ``limit`` completed jobs ran, the last ended first."""
    return [seconds for (seconds,) in _RECENT_RUN_TIMES.rows(session, {"limit": limit})]


_PENDING_COUNT = Prepared(
    select(func.count())
    .select_from(Job)
    .where(Job.user == bindparam("user"), Job.state == JobState.PENDING.value)
)
_SPOOL_BYTES = Prepared(select(SpoolUsage.bytes).where(SpoolUsage.uid == bindparam("uid")))


def pending_count(session: Session, user: str) -> int:
    return _PENDING_COUNT.scalar(session, {"user": user}) or 0


def spool_bytes(session: Session, uid: int) -> int:
    """What the snapshots the spool keeps for the user's jobs cost (an array's counts
    once): one row, kept up to date by transitions.py."""
    return _SPOOL_BYTES.scalar(session, {"uid": uid}) or 0


def finished_snapshots(session: Session, uid: int) -> Sequence[tuple[int, int]]:
    """The user's submissions whose jobs have all ended and whose snapshot is still kept,
    as (payload id, what it costs), the one that ended longest ago first."""
    terminal = [s.value for s in JobState if s.terminal]
    unfinished = func.sum(case((Job.state.in_(terminal), 0), else_=1))
    return session.execute(
        select(Payload.id, Payload.spool_bytes)
        .join(Job, Job.payload_id == Payload.id)
        .where(Job.uid == uid, Payload.spool_bytes > 0)
        .group_by(Payload.id)
        .having(unfinished == 0)
        .order_by(func.max(Job.end_time), Payload.id)
    ).all()


def runs_of(session: Session, job_ids: Iterable[int]) -> dict[int, list[Job]]:
    """Each id's job, or every task when the id names a job array."""
    wanted = sorted(set(job_ids))
    found: dict[int, list[Job]] = {job_id: [] for job_id in wanted}
    for part in chunks(wanted):
        rows = session.scalars(
            select(Job).where((Job.id.in_(part)) | (Job.array_job_id.in_(part)))
        ).all()
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
        return list(
            session.scalars(
                select(Job).where(Job.array_job_id == int(array_id), Job.array_task_id == int(task))
            ).all()
        )
    return runs_of(session, [int(array_id)])[int(array_id)]


def counts_by_state_and_user(session: Session) -> dict[tuple[str, str], int]:
    rows = session.execute(select(Job.state, Job.user, func.count()).group_by(Job.state, Job.user))
    return {(state, user): count for state, user, count in rows}


def finished_before(session: Session, cutoff: float, limit: int) -> Sequence[tuple[int, str]]:
    """Ids and snapshot paths of jobs that ended before ``cutoff``, oldest first."""
    terminal = [s.value for s in JobState if s.terminal]
    return session.execute(
        select(Job.id, Job.spool_path)
        .where(Job.state.in_(terminal), Job.end_time < cutoff)
        .order_by(Job.end_time)
        .limit(limit)
    ).all()


def pending_dependencies(session: Session) -> Sequence[str]:
    return session.scalars(
        select(Job.dependency).where(
            Job.state == JobState.PENDING.value, Job.dependency.is_not(None)
        )
    ).all()


def spool_paths_in_use(session: Session, paths: Iterable[str]) -> set[str]:
    wanted = sorted(set(paths))
    used: set[str] = set()
    for start in range(0, len(wanted), CHUNK):
        used.update(
            session.scalars(
                select(Job.spool_path)
                .distinct()
                .where(Job.spool_path.in_(wanted[start : start + CHUNK]))
            ).all()
        )
    return used


def oldest_end(session: Session) -> float | None:
    """When the oldest finished job still kept ended: only finished jobs have an end time,
    and the least one is read off the end-time index (a state filter would scan them all)."""
    return session.scalar(select(func.min(Job.end_time)))
