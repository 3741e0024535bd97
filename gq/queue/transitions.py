"""Who changes a job's state: every move of a job from one state to another (its start,
its end, a requeue, a retry, a cancel). Its submission is gq.queue.submissions', changes
that leave its state as it is gq.queue.job_updates', and its deletion gq.queue.purging's.

Every state change is a guarded ``UPDATE … WHERE id = ? AND state = <expected>`` that
records a job event in the same transaction, so two processes racing to move the same job
(a cancel and a start, say) cannot both win, and a job can never start twice. Changes to
many jobs at once (a cancel of an array) are one statement per chunk of ids, linear in
their number.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import ClauseElement, ColumnElement, bindparam, delete, func, insert, update

from gq.exec.host.messages import JobProgress
from gq.messages import MemoryBasis
from gq.queue.job_runs import INTO_EARLIER, keep_run
from gq.queue.job_updates import progress_values, record_progress
from gq.queue.models import Job, JobEvent, JobRun
from gq.queue.prepared import Prepared
from gq.queue.queries import among, chunks
from gq.queue.states import JobState, allowed

if TYPE_CHECKING:
    from gq.queue.engine import Transaction


def _move(
    session: Transaction,
    job_id: int,
    old: JobState,
    new: JobState,
    reason: str | None,
    now: float | None = None,
    guard: Any = None,
    ends_run: bool = False,
    **values: Any,
) -> bool:
    """``ends_run``: the move ends a RUNNING job's run, which is kept (gq.queue.job_runs)."""
    assert allowed(old, new), f"{old} -> {new} is not a job transition"
    now = time.time() if now is None else now
    if old is JobState.RUNNING:
        values.setdefault("suspended", False)  # a suspend ends with the run
        values.setdefault("preempted", False)
    if new is JobState.PENDING and (ends_run or old.terminal):
        values.update(INTO_EARLIER)  # its latest run becomes one of its earlier runs
    kept = ends_run and keep_run(session, job_id, new, reason, now, guard, values)
    statement, plain = _state_change(old, new, guard, values)
    changed = statement.execute(
        session,
        {
            "b_id": job_id,
            "b_reason": reason,
            "b_now": now,
            **{f"b_{name}": values[name] for name in plain},
        },
    )
    if changed.rowcount != 1:
        if kept:  # (not reached: the run was kept on the same conditions)
            session.execute(delete(JobRun).where(JobRun.id == kept))
        return False
    NEW_EVENT.execute(
        session,
        {
            "job_id": job_id,
            "time": now,
            "old_state": old.value,
            "new_state": new.value,
            "reason": reason,
        },
    )
    return True


# A statement costs more to construct than to run: the common ones are kept, their values
# bound as parameters. Expressions in them must be these, made once (``b_now``: the time
# of the change).
_NOT_HELD = Job.held.is_(False)
_NEXT_RUN = Job.run_count + 1
_RUN_NOT_COUNTED = Job.run_count - 1
_HAS_RETRIES = Job.retries_left > 0
_ONE_RETRY_LESS = Job.retries_left - 1
_AFTER_RETRY_DELAY: ColumnElement[float] = bindparam("b_now") + func.coalesce(Job.retry_delay, 0.0)
_ONE_MORE_OOM = func.coalesce(Job.ooms, 0) + 1
_SHARED = frozenset(
    map(
        id,
        (
            _NOT_HELD,
            _NEXT_RUN,
            _RUN_NOT_COUNTED,
            _HAS_RETRIES,
            _ONE_RETRY_LESS,
            _AFTER_RETRY_DELAY,
            _ONE_MORE_OOM,
            *INTO_EARLIER.values(),
        ),
    )
)
_JOBS = Job.__table__
NEW_EVENT = Prepared(insert(JobEvent.__table__))  # a submission's first event too
_kept: dict[tuple, Any] = {}


def _state_change(
    old: JobState, new: JobState, guard: Any, values: dict[str, Any]
) -> tuple[Prepared, list[str]]:
    """The UPDATE that moves a job from ``old`` to ``new`` setting ``values``, and the names
    of the values it takes as parameters (``b_<name>``, with ``b_id`` and ``b_reason``)."""
    plain = sorted(name for name, value in values.items() if not isinstance(value, ClauseElement))
    expressions = tuple(
        sorted(
            (name, id(value)) for name, value in values.items() if isinstance(value, ClauseElement)
        )
    )
    reusable = (guard is None or id(guard) in _SHARED) and all(
        identity in _SHARED for _, identity in expressions
    )
    key = (old, new, id(guard), tuple(plain), expressions)
    statement = _kept.get(key) if reusable else None
    if statement is None:
        statement = (
            update(_JOBS)
            .where(_JOBS.c.id == bindparam("b_id"), _JOBS.c.state == old.value)
            .values(
                state=new.value,
                reason=bindparam("b_reason"),
                **{
                    name: bindparam(f"b_{name}") if name in plain else value
                    for name, value in values.items()
                },
            )
        )
        if guard is not None:
            statement = statement.where(guard)
        statement = Prepared(statement)
        if reusable:
            _kept[key] = statement
    return statement, plain


def start(
    session: Transaction, job_id: int, device: str, lane: int, now: float | None = None
) -> bool:
    """PENDING to RUNNING, unless the job was held (or cancelled) since admission read it."""
    now = time.time() if now is None else now
    return _move(
        session,
        job_id,
        JobState.PENDING,
        JobState.RUNNING,
        None,
        now,
        guard=_NOT_HELD,
        device=device,
        lane=lane,
        pid=None,
        stop_request=None,
        start_time=now,
        end_time=None,
        exit_code=None,
        run_count=_NEXT_RUN,
        steps_done=0,
        attained=0.0,
        uncharged=0.0,
        lane_taken=0,
        startup=None,
        active_at=None,
    )


def finish(
    session: Transaction,
    job_id: int,
    state: JobState,
    exit_code: int | None,
    reason: str | None,
    now: float | None = None,
    progress: JobProgress | None = None,
) -> bool:
    """End a RUNNING job in a terminal state (with its last ``progress``, in the same
    statement)."""
    now = time.time() if now is None else now
    assert state.terminal
    last = progress_values(progress) if progress is not None else {}
    return _move(
        session,
        job_id,
        JobState.RUNNING,
        state,
        reason,
        now,
        ends_run=True,
        **{**last, "end_time": now, "exit_code": exit_code, "holds_lane": False},
    )


def requeue(
    session: Transaction, job_id: int, reason: str, now: float | None = None, started: bool = True
) -> bool:
    """Put a RUNNING job back in the queue (its run was lost, not its submission).

    ``started=False``: its process never started (the launch was lost), so the run it was
    counted for is taken back."""
    return _move(
        session,
        job_id,
        JobState.RUNNING,
        JobState.PENDING,
        reason,
        now,
        ends_run=started,
        device=None,
        lane=None,
        pid=None,
        holds_lane=False,
        stop_request=None,
        start_time=None,
        **({} if started else {"run_count": _RUN_NOT_COUNTED}),
    )


def retry(
    session: Transaction, job_id: int, exit_code: int | None, reason: str, now: float | None = None
) -> bool:
    """Put a RUNNING job whose run failed back in the queue when it has retries left
    (``--retries N``: N more runs, counted again from a ``gq requeue``), to start no earlier
    than its ``--retry-delay`` from now.
    False (nothing changed) when it has none left."""
    now = time.time() if now is None else now
    return _move(
        session,
        job_id,
        JobState.RUNNING,
        JobState.PENDING,
        reason,
        now,
        guard=_HAS_RETRIES,
        ends_run=True,
        retries_left=_ONE_RETRY_LESS,
        device=None,
        lane=None,
        pid=None,
        holds_lane=False,
        stop_request=None,
        start_time=None,
        exit_code=exit_code,
        begin_time=_AFTER_RETRY_DELAY,
    )


def ran_out_of_memory(
    session: Transaction,
    job_id: int,
    requeue: bool,
    figure: int,
    reason: str,
    exit_code: int | None,
    now: float | None = None,
    progress: JobProgress | None = None,
) -> bool:
    """A RUNNING job's run ran out of memory: it goes back to the queue (``requeue``) with
    its device-memory figure raised to what it asked for (``figure``), to start once that
    much is free; or it ends FAILED, its figure as it was (a later gq requeue must not
    bring back a figure no device offers). Whether the job was RUNNING, and so changed."""
    now = time.time() if now is None else now
    if requeue:
        # Its last progress first: what its run is kept with and added to its earlier runs.
        if progress is not None:
            record_progress(session, job_id, progress)
        return _move(
            session,
            job_id,
            JobState.RUNNING,
            JobState.PENDING,
            reason,
            now,
            ends_run=True,
            ooms=_ONE_MORE_OOM,
            exit_code=exit_code,
            holds_lane=False,
            mem=figure,
            mem_basis=MemoryBasis.RAISED.value,
            device=None,
            lane=None,
            pid=None,
            stop_request=None,
            start_time=None,
        )
    last = progress_values(progress) if progress is not None else {}
    values = {**last, "ooms": _ONE_MORE_OOM, "exit_code": exit_code, "holds_lane": False}
    return _move(
        session,
        job_id,
        JobState.RUNNING,
        JobState.FAILED,
        reason,
        now,
        ends_run=True,
        **values,
        end_time=now,
    )


def cancel_pending(
    session: Transaction,
    job_id: int,
    reason: str,
    now: float | None = None,
    state: JobState = JobState.CANCELLED,
) -> bool:
    """End a PENDING job that will never run: CANCELLED, or DEADLINE when it cannot end in
    time."""
    now = time.time() if now is None else now
    return _move(session, job_id, JobState.PENDING, state, reason, now, end_time=now)


def _move_many(
    session: Transaction,
    job_ids: list[int],
    old: JobState,
    new: JobState,
    reason: str | None,
    now: float | None = None,
    **values: Any,
) -> list[int]:
    """:func:`_move` for many jobs: one guarded UPDATE per chunk, the events in one insert.
    Returns the ids that moved."""
    assert allowed(old, new), f"{old} -> {new} is not a job transition"
    now = time.time() if now is None else now
    if old is JobState.RUNNING:
        values.setdefault("suspended", False)  # a suspend ends with the run
        values.setdefault("preempted", False)
    moved: list[int] = []
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(among(Job.id, part), Job.state == old.value)
            .values(state=new.value, reason=reason, **values)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        moved += [row[0] for row in result]
    if moved:
        session.execute(
            insert(JobEvent),
            [
                {
                    "job_id": job_id,
                    "time": now,
                    "old_state": old.value,
                    "new_state": new.value,
                    "reason": reason,
                }
                for job_id in moved
            ],
        )
    return moved


def cancel_pending_many(
    session: Transaction, job_ids: list[int], reason: str, now: float | None = None
) -> list[int]:
    """End PENDING jobs CANCELLED; the ids that were pending."""
    now = time.time() if now is None else now
    return _move_many(
        session, job_ids, JobState.PENDING, JobState.CANCELLED, reason, now, end_time=now
    )


def requeue_finished(session: Transaction, job: Job, now: float | None = None) -> bool:
    """Run an ended job again under the same id."""
    state = JobState(job.state)
    if not state.terminal:
        return False
    return _move(
        session,
        job.id,
        state,
        JobState.PENDING,
        "requeued by user",
        now,
        device=None,
        lane=None,
        pid=None,
        start_time=None,
        end_time=None,
        exit_code=None,
        holds_lane=False,
        stop_request=None,
        retries_left=job.retries,
    )  # its --retries count again
