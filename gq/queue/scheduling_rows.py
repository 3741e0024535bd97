"""What the scheduling pass reads of the queue: the rows of the pending and running jobs
(and of held ones with a deadline), as plain records, and the pending ones kept between
passes so that a pass reads again only what changed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import bindparam, select

from gq.queue.models import Job
from gq.queue.prepared import Prepared
from gq.queue.queries import chunks
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.queue.engine import Transaction

# What the scheduling pass reads of a job: plain rows, not ORM objects, so that a queue of
# many thousands of pending jobs costs the daemon little each pass.
SCHEDULING_COLUMNS = (
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
    Job.preempted,
    Job.steps_done,
    Job.attained,
    Job.mean_iteration,
    Job.mean_gap,
    Job.holds_lane,
    Job.interpreter,
    Job.mem_basis,
)


class SchedulingRow(NamedTuple):
    """One such row as a plain record: SQLAlchemy's Row reads a column by name in
    microseconds, and a pass reads a dozen of every pending job's. Its fields are the
    columns above, in their order (a test holds them to that)."""

    id: int
    user: str
    name: str
    submit_time: float
    priority: int
    steps_total: int | None
    deadline: float | None
    time_limit: int | None
    dependency: str | None
    reason: str | None
    gpus: int
    mem: int | None
    exclusive: bool
    array_job_id: int | None
    array_max_running: int | None
    stop_request: str | None
    held: bool
    begin_time: float | None
    gpu_type: str | None
    host_mem: int | None
    cpus: int | None
    nodelist: str | None
    suspended: bool
    preempted: bool
    steps_done: int
    attained: float
    mean_iteration: float | None
    mean_gap: float | None
    holds_lane: bool
    interpreter: str | None
    mem_basis: str | None


# Read every pass: constructed once (constructing a statement costs more than running it).
_FOR_SCHEDULING = {
    (state, held): Prepared(
        select(*SCHEDULING_COLUMNS)
        .where(Job.state == state.value)
        .order_by(Job.id)
        .where(*([] if held is None else [Job.held.is_(held)]))
    )
    for state in (JobState.PENDING, JobState.RUNNING)
    for held in (None, False, True)
}
_HELD_WITH_DEADLINE = Prepared(
    select(*SCHEDULING_COLUMNS).where(
        Job.state == JobState.PENDING.value, Job.held.is_(True), Job.deadline.is_not(None)
    )
)


def for_scheduling(
    session: Transaction, state: JobState, held: bool | None = None
) -> list[SchedulingRow]:
    """Rows of the jobs in ``state`` (PENDING or RUNNING; held or not) with what scheduling
    needs of them."""
    return list(map(SchedulingRow._make, _FOR_SCHEDULING[state, held].rows(session)))


_PENDING_BY_ID = Prepared(
    select(*SCHEDULING_COLUMNS).where(
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

    def read(self, session: Transaction, changed: set[int] | None, now: float) -> list:
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


def held_with_deadline(session: Transaction) -> Sequence:
    """Held pending jobs that have a deadline (they are removed once they cannot meet it)."""
    return list(map(SchedulingRow._make, _HELD_WITH_DEADLINE.rows(session)))
