"""The one module that writes job rows.

Every state change is a guarded ``UPDATE … WHERE id = ? AND state = <expected>`` that
records a job event in the same transaction, so two processes racing to move the same job
(a cancel and a start, say) cannot both win, and a job can never start twice. Changes to
many jobs at once (a cancel of an array) are one statement per chunk of ids, linear in
their number.

Everything written here was checked on its way in (by the wire's decoding and the request
handlers), so that no row can break a query for anyone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ClauseElement, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from gq.messages import MemoryBasis
from gq.queue.models import Job, JobEvent, Payload, SpoolUsage
from gq.queue.prepared import Prepared
from gq.queue.queries import chunks
from gq.queue.states import JobState, allowed

HELD = "JobHeldUser"  # squeue's reason for a held job
HELD_ADMIN = "JobHeldAdmin"  # held by an operator for its owner: only an operator releases it


@dataclass(frozen=True)
class NewJob:
    """A validated submission: everything needed to insert the PENDING row."""

    name: str
    user: str
    uid: int | None
    gid: int | None
    script: str
    args: list[str]
    interpreter: str | None
    workdir: str
    output_pattern: str | None  # None: its terminal's (an interactive job's, without -o)
    error_pattern: str | None
    env: dict[str, str]
    umask: int = 0o022
    gpus: int = 1
    mem: int | None = None
    host_mem: int | None = None
    cpus: int | None = None
    gpu_type: str | None = None
    time_limit: int | None = None
    deadline: float | None = None
    begin_time: float | None = None
    warn_signal: str | None = None
    nodelist: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    ntasks: int | None = None
    notify: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    on_oom: str | None = None  # --oom fail (None: requeue)
    steps_total: int | None = None
    priority: int = 0
    exclusive: bool = False
    requeue: bool = False
    dependency: str | None = None
    held: bool = False
    interactive: bool = False  # gq run --pty
    idle_timeout: int | None = None  # seconds an interactive job may sit idle
    array_tasks: tuple[int, ...] | None = None
    array_max_running: int | None = None
    spool_bytes: int = 0  # what the snapshot costs the spool (spool.footprint)
    submit_time: float = field(default_factory=time.time)


# resolve_output(pattern, job_id, array_id, task) -> path: fills in %j, %x, %A, %a.
# snapshot(job_id) -> path: writes the script's snapshot for the submission's first id.
def submit(
    session: Session,
    new: NewJob,
    resolve_output,
    snapshot: Callable[[int], str] = lambda job_id: "",
) -> list[int]:
    """Insert the PENDING row, or one per task of a job array (the first id names the array,
    and its tasks share one payload and snapshot): a few statements, however many tasks.
    Their ids."""
    tasks = new.array_tasks if new.array_tasks is not None else (None,)
    payload_id = _NEW_PAYLOAD.scalar(
        session, {"env": dict(new.env), "args": list(new.args), "spool_bytes": new.spool_bytes}
    )
    if new.uid is not None:
        _count_spool(session, {new.uid: new.spool_bytes})
    common = dict(
        name=new.name,
        user=new.user,
        uid=new.uid,
        gid=new.gid,
        umask=new.umask,
        state=JobState.PENDING.value,
        reason=HELD if new.held else None,
        priority=new.priority,
        gpus=new.gpus,
        mem=new.mem,
        host_mem=new.host_mem,
        cpus=new.cpus,
        gpu_type=new.gpu_type,
        time_limit=new.time_limit,
        deadline=new.deadline,
        begin_time=new.begin_time,
        warn_signal=new.warn_signal,
        nodelist=new.nodelist,
        retries=new.retries,
        retries_left=new.retries,
        retry_delay=new.retry_delay,
        ntasks=new.ntasks,
        notify=new.notify,
        mail_type=new.mail_type,
        mail_user=new.mail_user,
        suspended=False,
        on_oom=new.on_oom,
        ooms=0,
        steps_total=new.steps_total,
        exclusive=new.exclusive,
        requeue=new.requeue,
        dependency=new.dependency,
        held=new.held,
        interactive=new.interactive,
        idle_timeout=new.idle_timeout,
        active_at=None,
        script=new.script,
        spool_path="",
        payload_id=payload_id,
        interpreter=new.interpreter,
        workdir=new.workdir,
        stdout_path="",
        stderr_path="",
        submit_time=new.submit_time,
        output_pattern=new.output_pattern,
        error_pattern=new.error_pattern,
        stop_request=None,
        run_count=0,
        steps_done=0,
        attained=0.0,
        holds_lane=False,
        array_max_running=new.array_max_running if new.array_tasks is not None else None,
    )
    if len(tasks) == 1:
        ids = [_NEW_JOB.scalar(session, dict(common, array_task_id=tasks[0]))]
    else:  # many rows returning their ids, in order: SQLAlchemy's insertmanyvalues
        ids = list(
            session.connection()
            .execute(_NEW_JOBS, [dict(common, array_task_id=task) for task in tasks])
            .scalars()
        )
    array_id = ids[0] if new.array_tasks is not None else None
    spool_path = snapshot(ids[0])
    _SET_PATHS.executemany(
        session,
        [
            {
                "b_id": job_id,
                "b_array": array_id,
                "b_spool": spool_path,
                "b_out": _output(resolve_output, new.output_pattern, job_id, array_id, task),
                "b_err": _output(resolve_output, new.error_pattern, job_id, array_id, task),
            }
            for job_id, task in zip(ids, tasks)
        ],
    )
    _NEW_EVENT.executemany(
        session,
        [
            {
                "job_id": job_id,
                "time": new.submit_time,
                "old_state": None,
                "new_state": JobState.PENDING.value,
                "reason": "submitted",
            }
            for job_id in ids
        ],
    )
    return ids


def _output(
    resolve_output, pattern: str | None, job_id: int, array_id: int | None, task: int | None
) -> str:
    """An output file's path, or "" for none (the job's terminal)."""
    return "" if pattern is None else resolve_output(pattern, job_id, array_id, task)


_NEW_PAYLOAD = Prepared(insert(Payload.__table__).returning(Payload.__table__.c.id))
_NEW_JOBS = insert(Job.__table__).returning(Job.__table__.c.id, sort_by_parameter_order=True)
_NEW_JOB = Prepared(insert(Job.__table__).returning(Job.__table__.c.id))
_SET_PATHS = Prepared(
    update(Job.__table__)
    .where(Job.__table__.c.id == bindparam("b_id"))
    .values(
        array_job_id=bindparam("b_array"),
        spool_path=bindparam("b_spool"),
        stdout_path=bindparam("b_out"),
        stderr_path=bindparam("b_err"),
    )
)


def drop_snapshots(session: Session, uid: int, payload_ids: list[int]) -> set[str]:
    """Forget the snapshots of these submissions of ``uid``'s (their jobs have all ended):
    their jobs can no longer be requeued or exported. The paths to delete once this
    commits."""
    paths: set[str] = set()
    freed = 0
    for part in chunks(payload_ids):
        freed += (
            session.scalar(
                select(func.coalesce(func.sum(Payload.spool_bytes), 0)).where(Payload.id.in_(part))
            )
            or 0
        )
        paths.update(
            session.scalars(select(Job.spool_path).distinct().where(Job.payload_id.in_(part))).all()
        )
        session.execute(
            update(Job)
            .where(Job.payload_id.in_(part))
            .values(spool_path="")
            .execution_options(synchronize_session=False)
        )
        session.execute(
            update(Payload)
            .where(Payload.id.in_(part))
            .values(spool_bytes=0)
            .execution_options(synchronize_session=False)
        )
    _count_spool(session, {uid: -freed})
    return {path for path in paths if path}


_ADD_TO_SPOOL = Prepared(
    sqlite_insert(SpoolUsage.__table__)
    .values(uid=bindparam("b_uid"), bytes=bindparam("b_delta"))
    .on_conflict_do_update(
        index_elements=[SpoolUsage.uid], set_={"bytes": SpoolUsage.bytes + bindparam("b_delta")}
    )
)


def _count_spool(session: Session, change: dict[int, int]) -> None:
    """Add to (or take from) what the spool keeps for each uid."""
    for uid, delta in change.items():
        if delta:
            _ADD_TO_SPOOL.execute(session, {"b_uid": uid, "b_delta": delta})


def _move(
    session: Session,
    job_id: int,
    old: JobState,
    new: JobState,
    reason: str | None,
    now: float | None = None,
    guard: Any = None,
    **values: Any,
) -> bool:
    assert allowed(old, new), f"{old} -> {new} is not a job transition"
    now = time.time() if now is None else now
    if old is JobState.RUNNING:
        values.setdefault("suspended", False)  # a suspend ends with the run
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
        return False
    _NEW_EVENT.execute(
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
_AFTER_RETRY_DELAY = bindparam("b_now") + func.coalesce(Job.retry_delay, 0.0)
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
        ),
    )
)
_JOBS = Job.__table__
_NEW_EVENT = Prepared(insert(JobEvent.__table__))
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


def start(session: Session, job_id: int, device: str, lane: int, now: float | None = None) -> bool:
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
        startup=None,
        active_at=None,
    )


def set_pending_reasons(session: Session, reasons: dict[int, str | None]) -> None:
    """Why PENDING jobs are still waiting (squeue's REASON), one statement per reason and
    chunk of ids; not a state change."""
    by_reason: dict[str | None, list[int]] = {}
    for job_id, reason in reasons.items():
        by_reason.setdefault(reason, []).append(job_id)
    for reason, job_ids in by_reason.items():
        for part in chunks(job_ids):
            _SET_REASON.execute(session, {"ids": part, "b_reason": reason})


_SET_REASON = Prepared(
    update(_JOBS)
    .where(
        _JOBS.c.id.in_(bindparam("ids", expanding=True)), _JOBS.c.state == JobState.PENDING.value
    )
    .values(reason=bindparam("b_reason"))
)


_RECORD_PID = Prepared(
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("b_id"), _JOBS.c.state == JobState.RUNNING.value)
    .values(pid=bindparam("b_pid"))
)


def record_pid(session: Session, job_id: int, pid: int) -> None:
    _RECORD_PID.execute(session, {"b_id": job_id, "b_pid": pid})


def finish(
    session: Session,
    job_id: int,
    state: JobState,
    exit_code: int | None,
    reason: str | None,
    now: float | None = None,
    progress: Progress | None = None,
) -> bool:
    """End a RUNNING job in a terminal state (with its last ``progress``, in the same
    statement)."""
    now = time.time() if now is None else now
    assert state.terminal
    last = _progress_values(progress) if progress is not None else {}
    return _move(
        session,
        job_id,
        JobState.RUNNING,
        state,
        reason,
        now,
        **{**last, "end_time": now, "exit_code": exit_code, "holds_lane": False},
    )


def requeue(
    session: Session, job_id: int, reason: str, now: float | None = None, started: bool = True
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
        device=None,
        lane=None,
        pid=None,
        holds_lane=False,
        stop_request=None,
        start_time=None,
        **({} if started else {"run_count": _RUN_NOT_COUNTED}),
    )


def retry(
    session: Session, job_id: int, exit_code: int | None, reason: str, now: float | None = None
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
    session: Session,
    job_id: int,
    requeue: bool,
    figure: int,
    reason: str,
    exit_code: int | None,
    now: float | None = None,
    progress: Progress | None = None,
) -> bool:
    """A RUNNING job's run ran out of memory: it goes back to the queue (``requeue``) with
    its device-memory figure raised to what it asked for (``figure``), to start once that
    much is free; or it ends FAILED, its figure as it was (a later gq requeue must not
    bring back a figure no device offers). Whether the job was RUNNING, and so changed."""
    now = time.time() if now is None else now
    last = _progress_values(progress) if progress is not None else {}
    values = {**last, "ooms": _ONE_MORE_OOM, "exit_code": exit_code, "holds_lane": False}
    if requeue:
        return _move(
            session,
            job_id,
            JobState.RUNNING,
            JobState.PENDING,
            reason,
            now,
            **values,
            mem=figure,
            mem_basis=MemoryBasis.RAISED.value,
            device=None,
            lane=None,
            pid=None,
            stop_request=None,
            start_time=None,
        )
    return _move(
        session, job_id, JobState.RUNNING, JobState.FAILED, reason, now, **values, end_time=now
    )


def set_memory_figure(session: Session, job_id: int, figure: int, basis: MemoryBasis) -> None:
    """A job's device-memory figure, and where it came from (a probe's measure); not a
    state change."""
    _SET_FIGURE.execute(session, {"b_id": job_id, "b_mem": figure, "b_basis": basis.value})


_SET_FIGURE = Prepared(
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("b_id"))
    .values(mem=bindparam("b_mem"), mem_basis=bindparam("b_basis"))
)


def cancel_pending(
    session: Session,
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
    session: Session,
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
    moved: list[int] = []
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(Job.id.in_(part), Job.state == old.value)
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
    session: Session, job_ids: list[int], reason: str, now: float | None = None
) -> list[int]:
    """End PENDING jobs CANCELLED; the ids that were pending."""
    now = time.time() if now is None else now
    return _move_many(
        session, job_ids, JobState.PENDING, JobState.CANCELLED, reason, now, end_time=now
    )


CANCEL, REQUEUE = "cancel", "requeue"


def request_stop(session: Session, job_ids: list[int], what: str) -> list[int]:
    """Ask the daemon to end RUNNING jobs: it kills them, then records CANCELLED (cancel)
    or puts them back in the queue (requeue) once they have exited. The ids asked."""
    assert what in (CANCEL, REQUEUE)
    asked: list[int] = []
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(Job.id.in_(part), Job.state == JobState.RUNNING.value)
            .values(stop_request=what)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        asked += [row[0] for row in result]
    return asked


def requeue_finished(session: Session, job: Job, now: float | None = None) -> bool:
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


def set_held(
    session: Session, job_ids: list[int], held: bool, by_operator: bool = False
) -> list[int]:
    """Hold or release PENDING jobs (squeue's JobHeldUser, or JobHeldAdmin when an operator
    holds another user's job); the ids that were pending."""
    changed: list[int] = []
    for part in chunks(job_ids):
        query = update(Job).where(Job.id.in_(part), Job.state == JobState.PENDING.value)
        if held and not by_operator:  # an owner's hold never replaces an operator's
            query = query.where(or_(Job.reason.is_(None), Job.reason != HELD_ADMIN))
        result = session.execute(
            query.values(held=held, reason=(HELD_ADMIN if by_operator else HELD) if held else None)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        changed += [row[0] for row in result]
    return changed


def modify(
    session: Session,
    job_ids: list[int],
    *,
    name: str | None = None,
    priority: int | None = None,
    time_limit: int | None = None,
    begin: float | None = None,
    dependency: str | None = None,
    workdir: str | None = None,
    pending_only: bool = False,
) -> list[int]:
    """gq update: priority and time limit of PENDING or RUNNING jobs; the name, begin time,
    dependency ("" removes it) and working directory of PENDING ones (all of the given jobs
    must be pending then, as with ``pending_only``: what the caller changes itself). The
    ids changed."""
    values: dict[str, Any] = {}
    states = [JobState.PENDING.value, JobState.RUNNING.value]
    of_pending = {
        "name": name,
        "begin_time": begin,
        "workdir": workdir,
        "dependency": None if dependency == "" else dependency,
    }
    given = {
        key: value
        for key, value in of_pending.items()
        if value is not None or (key == "dependency" and dependency is not None)
    }
    if given or pending_only:
        states = [JobState.PENDING.value]
        values.update(given)
    if priority is not None:
        values["priority"] = priority
    if time_limit is not None:
        values["time_limit"] = time_limit
    changed: list[int] = []
    if not values:  # nothing here to change: the jobs that may be changed
        for part in chunks(job_ids):
            changed += session.scalars(
                select(Job.id).where(Job.id.in_(part), Job.state.in_(states))
            )
        return changed
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(Job.id.in_(part), Job.state.in_(states))
            .values(**values)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        changed += [row[0] for row in result]
    return changed


def set_suspended(session: Session, job_ids: list[int], suspended: bool) -> list[int]:
    """gq suspend / gq resume: RUNNING jobs stopped in place, or let go on (their hosts
    are told by the next scheduling pass). The ids changed."""
    changed: list[int] = []
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(
                Job.id.in_(part),
                Job.state == JobState.RUNNING.value,
                Job.suspended.is_(not suspended),
            )
            .values(suspended=suspended)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        changed += [row[0] for row in result]
    return changed


def set_args(session: Session, payload_id: int, args: list[str]) -> None:
    """New arguments for every (pending) job of one submission."""
    session.execute(update(Payload).where(Payload.id == payload_id).values(args=list(args)))


def set_outputs(session: Session, paths: dict[int, tuple[str, str, str, str]]) -> None:
    """Each PENDING job's output and error patterns and the paths filled in from them."""
    session.execute(
        update(Job),
        [
            {
                "id": job_id,
                "output_pattern": output,
                "error_pattern": error,
                "stdout_path": stdout,
                "stderr_path": stderr,
            }
            for job_id, (output, error, stdout, stderr) in paths.items()
        ],
    )


@dataclass(frozen=True)
class Progress:
    steps_done: int
    attained: float
    mean_iteration: float | None
    mem_persistent: int | None
    mem_peak: int | None
    holds_lane: bool
    steps_total: int | None = None
    mean_gap: float | None = None  # hosts before it was reported send none
    startup: float | None = None  # seconds from launch to its first acquire (None: not yet)
    active_at: float | None = None  # an interactive job's last activity (None: none seen)


def _progress_values(progress: Progress) -> dict[str, Any]:
    values: dict[str, Any] = {
        "steps_done": progress.steps_done,
        "attained": progress.attained,
        "mean_iteration": progress.mean_iteration,
        "mean_gap": progress.mean_gap,
        "mem_persistent": progress.mem_persistent,
        "mem_peak": progress.mem_peak,
        "holds_lane": progress.holds_lane,
        "startup": progress.startup,
        "active_at": progress.active_at,
    }
    if progress.steps_total is not None:
        values["steps_total"] = progress.steps_total
    return values


def record_progress(session: Session, job_id: int, progress: Progress) -> None:
    values = _progress_values(progress)
    statement = _kept.get(("progress", *values))
    if statement is None:
        statement = _kept["progress", *values] = Prepared(
            update(_JOBS)
            .where(_JOBS.c.id == bindparam("b_id"), _JOBS.c.state == JobState.RUNNING.value)
            .values(**{name: bindparam(f"b_{name}") for name in values})
        )
    statement.execute(
        session, {"b_id": job_id, **{f"b_{name}": value for name, value in values.items()}}
    )


def purge(session: Session, job_ids: list[int]) -> None:
    """Forget finished jobs: their rows, their events, and payloads no job uses any more."""
    owners: dict[int, int | None] = {}  # payload -> its submitter's uid
    for part in chunks(job_ids):
        owners.update(
            (payload, uid)
            for payload, uid in session.execute(
                delete(Job)
                .where(Job.id.in_(part))
                .returning(Job.payload_id, Job.uid)
                .execution_options(synchronize_session=False)
            )
        )
    freed: dict[int, int] = {}
    for part in chunks(sorted(owners)):
        for payload, size in session.execute(
            delete(Payload)
            .where(
                Payload.id.in_(part),
                ~Payload.id.in_(
                    Job.__table__.select()
                    .with_only_columns(Job.payload_id)
                    .where(Job.payload_id.in_(part))
                ),
            )
            .returning(Payload.id, Payload.spool_bytes)
            .execution_options(synchronize_session=False)
        ):
            uid = owners[payload]
            if uid is not None:
                freed[uid] = freed.get(uid, 0) - size
    _count_spool(session, freed)
