"""Changes to a job that leave its state as it is: why a pending job waits, a running
job's pid, progress and stop request, its device-memory figure, holds and releases,
suspends and resumes, and gq update's changes. (A move from one state to another is
gq.queue.transitions'.)

Changes to many jobs at once (a hold of an array) are one statement per chunk of ids,
linear in their number. Everything written here was checked on its way in (by the wire's
decoding and the request handlers), so that no row can break a query for anyone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, or_, select, update

from gq.exec.host.messages import JobProgress, uncharged
from gq.messages import MemoryBasis
from gq.queue.models import Job, JobEvent, Payload
from gq.queue.prepared import Prepared
from gq.queue.queries import among, chunks
from gq.queue.states import PREEMPTED, JobState

if TYPE_CHECKING:
    from gq.queue.engine import Transaction

HELD = "JobHeldUser"  # squeue's reason for a held job
HELD_ADMIN = "JobHeldAdmin"  # held by an operator for its owner: only an operator releases it


_JOBS = Job.__table__
# The progress statements, made once for each set of fields a host reports (a statement
# costs more to construct than to run).
_kept: dict[tuple, Any] = {}


def set_pending_reasons(session: Transaction, reasons: Mapping[int, str | None]) -> None:
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


def record_pid(session: Transaction, job_id: int, pid: int) -> None:
    _RECORD_PID.execute(session, {"b_id": job_id, "b_pid": pid})


def set_memory_figure(session: Transaction, job_id: int, figure: int, basis: MemoryBasis) -> None:
    """A job's device-memory figure, and where it came from (a probe's measure); not a
    state change."""
    _SET_FIGURE.execute(session, {"b_id": job_id, "b_mem": figure, "b_basis": basis.value})


_SET_FIGURE = Prepared(
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("b_id"))
    .values(mem=bindparam("b_mem"), mem_basis=bindparam("b_basis"))
)


CANCEL, REQUEUE = "cancel", "requeue"


def request_stop(session: Transaction, job_ids: list[int], what: str) -> list[int]:
    """Ask the daemon to end RUNNING jobs: it kills them, then records CANCELLED (cancel)
    or puts them back in the queue (requeue) once they have exited. The ids asked."""
    assert what in (CANCEL, REQUEUE)
    asked: list[int] = []
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(among(Job.id, part), Job.state == JobState.RUNNING.value)
            .values(stop_request=what)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        asked += [row[0] for row in result]
    return asked


def set_held(
    session: Transaction, job_ids: list[int], held: bool, by_operator: bool = False
) -> list[int]:
    """Hold or release PENDING jobs (squeue's JobHeldUser, or JobHeldAdmin when an operator
    holds another user's job); the ids that were pending."""
    changed: list[int] = []
    for part in chunks(job_ids):
        query = update(Job).where(among(Job.id, part), Job.state == JobState.PENDING.value)
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
    session: Transaction,
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
                select(Job.id).where(among(Job.id, part), Job.state.in_(states))
            )
        return changed
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(among(Job.id, part), Job.state.in_(states))
            .values(**values)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        changed += [row[0] for row in result]
    return changed


def set_suspended(session: Transaction, job_ids: list[int], suspended: bool) -> list[int]:
    """gq suspend / gq resume: RUNNING jobs stopped in place, or let go on (their hosts
    are told by the next scheduling pass). The ids changed."""
    changed: list[int] = []
    for part in chunks(job_ids):
        result = session.execute(
            update(Job)
            .where(
                among(Job.id, part),
                Job.state == JobState.RUNNING.value,
                Job.suspended.is_(not suspended),
            )
            .values(suspended=suspended)
            .returning(Job.id)
            .execution_options(synchronize_session=False)
        )
        changed += [row[0] for row in result]
    return changed


def set_preempted(session: Transaction, job_id: int, preempted: bool, reason: str) -> bool:
    """A RUNNING job preempted by the daemon (its memory to host memory for a higher job, or
    rotated out after its turn), or brought back: the flag, the change in its state history
    (Slurm's PREEMPTED), and ``reason`` as its squeue reason while it is out. Whether it
    changed (a job that has ended meanwhile does not)."""
    changed = session.execute(
        update(Job)
        .where(
            Job.id == job_id, Job.state == JobState.RUNNING.value, Job.preempted.is_(not preempted)
        )
        .values(preempted=preempted, reason=reason if preempted else None)
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    ).first()
    if changed is not None:
        old, new = (
            (JobState.RUNNING.value, PREEMPTED)
            if preempted
            else (PREEMPTED, JobState.RUNNING.value)
        )
        session.add(
            JobEvent(job_id=job_id, time=time.time(), old_state=old, new_state=new, reason=reason)
        )
    return changed is not None


def set_args(session: Transaction, payload_id: int, args: list[str]) -> None:
    """New arguments for every (pending) job of one submission (the command line it was
    given no longer says what it runs)."""
    session.execute(
        update(Payload).where(Payload.id == payload_id).values(args=list(args), command=None)
    )


def set_outputs(session: Transaction, paths: dict[int, tuple[str, str, str, str]]) -> None:
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


def progress_values(progress: JobProgress) -> dict[str, Any]:
    values: dict[str, Any] = {
        "steps_done": progress.steps_done,
        "attained": progress.attained,
        "uncharged": uncharged(progress),
        "mean_iteration": progress.mean_iteration,
        "mean_gap": progress.mean_gap,
        "mem_persistent": progress.mem_persistent,
        "mem_peak": progress.mem_peak,
        "holds_lane": progress.holds_lane,
        "lane_taken": progress.lane_taken,
        "startup": progress.startup,
        "active_at": progress.active_at,
    }
    if progress.steps_total is not None:
        values["steps_total"] = progress.steps_total
    return values


def record_progress(session: Transaction, job_id: int, progress: JobProgress) -> None:
    values = progress_values(progress)
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
