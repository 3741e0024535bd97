"""The one module that writes job rows.

Every state change is a guarded ``UPDATE … WHERE id = ? AND state = <expected>`` that
records a job event in the same transaction, so two processes racing to move the same job
(a cancel and a start, say) cannot both win, and a job can never start twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from gq.queue.models import Job, JobEvent
from gq.queue.states import JobState, allowed


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
    output_pattern: str
    error_pattern: str
    env: dict[str, str]
    umask: int = 0o022
    gpus: int = 1
    mem: int | None = None
    time_limit: int | None = None
    deadline: float | None = None
    steps_total: int | None = None
    priority: int = 0
    exclusive: bool = False
    requeue: bool = False
    dependency: str | None = None
    held: bool = False
    array_tasks: tuple[int, ...] | None = None
    array_max_running: int | None = None
    submit_time: float = field(default_factory=time.time)


# resolve_output(pattern, job) -> path: fills in %j, %x, %A, %a for one row.
def submit(session: Session, new: NewJob, resolve_output) -> list[Job]:
    """Insert the PENDING row, or one per task of a job array (the first id names the array)."""
    tasks = new.array_tasks if new.array_tasks is not None else (None,)
    jobs = []
    for task in tasks:
        job = Job(
            name=new.name, user=new.user, uid=new.uid, gid=new.gid, umask=new.umask, state=JobState.PENDING.value, priority=new.priority,
            gpus=new.gpus, mem=new.mem, time_limit=new.time_limit, deadline=new.deadline,
            steps_total=new.steps_total,
            exclusive=new.exclusive, requeue=new.requeue, dependency=new.dependency,
            held=new.held, script=new.script, spool_path="", args=list(new.args),
            interpreter=new.interpreter, workdir=new.workdir, stdout_path="", stderr_path="",
            env=dict(new.env), submit_time=new.submit_time, stop_request=None, run_count=0,
            steps_done=0, attained=0.0, holds_lane=False, array_task_id=task,
            array_max_running=new.array_max_running if task is not None else None,
        )
        session.add(job)
        session.flush()
        if task is not None:
            job.array_job_id = jobs[0].id if jobs else job.id
        job.stdout_path = resolve_output(new.output_pattern, job)
        job.stderr_path = resolve_output(new.error_pattern, job)
        session.add(JobEvent(job_id=job.id, time=new.submit_time, old_state=None,
                             new_state=JobState.PENDING.value, reason="submitted"))
        jobs.append(job)
    return jobs


def set_spool_path(session: Session, job_ids: list[int], path: str) -> None:
    session.execute(update(Job).where(Job.id.in_(job_ids)).values(spool_path=path))


def _move(session: Session, job_id: int, old: JobState, new: JobState, reason: str | None,
          now: float | None = None, guard: Any = None, **values: Any) -> bool:
    assert allowed(old, new), f"{old} -> {new} is not a job transition"
    now = time.time() if now is None else now
    query = update(Job).where(Job.id == job_id, Job.state == old.value)
    if guard is not None:
        query = query.where(guard)
    result = session.execute(query.values(state=new.value, reason=reason, **values))
    if result.rowcount != 1:
        return False
    session.add(JobEvent(job_id=job_id, time=now, old_state=old.value, new_state=new.value,
                         reason=reason))
    return True


def start(session: Session, job_id: int, device: str, lane: int,
          now: float | None = None) -> bool:
    """PENDING to RUNNING, unless the job was held (or cancelled) since admission read it."""
    now = time.time() if now is None else now
    return _move(session, job_id, JobState.PENDING, JobState.RUNNING, None, now,
                 guard=Job.held.is_(False), device=device, lane=lane, pid=None,
                 stop_request=None, start_time=now, end_time=None, exit_code=None,
                 run_count=Job.run_count + 1, steps_done=0, attained=0.0)


def set_pending_reason(session: Session, job_id: int, reason: str | None) -> None:
    """Why a PENDING job is still waiting (squeue's REASON); not a state change."""
    session.execute(
        update(Job).where(Job.id == job_id, Job.state == JobState.PENDING.value).values(reason=reason)
    )


def record_pid(session: Session, job_id: int, pid: int) -> None:
    session.execute(
        update(Job).where(Job.id == job_id, Job.state == JobState.RUNNING.value).values(pid=pid)
    )


def finish(session: Session, job_id: int, state: JobState, exit_code: int | None,
           reason: str | None, now: float | None = None) -> bool:
    """End a RUNNING job in a terminal state."""
    now = time.time() if now is None else now
    assert state.terminal
    return _move(session, job_id, JobState.RUNNING, state, reason, now,
                 end_time=now, exit_code=exit_code, holds_lane=False)


def requeue(session: Session, job_id: int, reason: str, now: float | None = None,
            started: bool = True) -> bool:
    """Put a RUNNING job back in the queue (its run was lost, not its submission).

    ``started=False``: its process never started (the launch was lost), so the run it was
    counted for is taken back."""
    return _move(session, job_id, JobState.RUNNING, JobState.PENDING, reason, now,
                 device=None, lane=None, pid=None, holds_lane=False, stop_request=None,
                 start_time=None, **({} if started else {"run_count": Job.run_count - 1}))


def cancel_pending(session: Session, job_id: int, reason: str, now: float | None = None,
                   state: JobState = JobState.CANCELLED) -> bool:
    """End a PENDING job that will never run: CANCELLED, or DEADLINE when it cannot end in
    time."""
    now = time.time() if now is None else now
    return _move(session, job_id, JobState.PENDING, state, reason, now, end_time=now)


CANCEL, REQUEUE = "cancel", "requeue"


def request_stop(session: Session, job_id: int, what: str) -> bool:
    """Ask the daemon to end a RUNNING job: it kills it, then records CANCELLED (cancel) or
    puts it back in the queue (requeue) once it has exited."""
    assert what in (CANCEL, REQUEUE)
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.RUNNING.value)
        .values(stop_request=what)
    )
    return result.rowcount == 1


def requeue_finished(session: Session, job: Job, now: float | None = None) -> bool:
    """Run an ended job again under the same id."""
    state = JobState(job.state)
    if not state.terminal:
        return False
    return _move(session, job.id, state, JobState.PENDING, "requeued by user", now,
                 device=None, lane=None, pid=None, start_time=None, end_time=None,
                 exit_code=None, holds_lane=False, stop_request=None)


def set_held(session: Session, job_id: int, held: bool) -> bool:
    """Hold or release a PENDING job (squeue's JobHeldUser)."""
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.state == JobState.PENDING.value)
        .values(held=held, reason="JobHeldUser" if held else None)
    )
    return result.rowcount == 1


def modify(session: Session, job: Job, *, name: str | None = None, priority: int | None = None,
           time_limit: int | None = None) -> bool:
    """gq update: anything on a PENDING job; time limit and priority on a RUNNING one too."""
    values: dict[str, Any] = {}
    if name is not None:
        if job.state != JobState.PENDING.value:
            return False
        values["name"] = name
    if priority is not None:
        values["priority"] = priority
    if time_limit is not None:
        values["time_limit"] = time_limit
    result = session.execute(
        update(Job).where(Job.id == job.id, Job.state == job.state,
                          Job.state.in_([JobState.PENDING.value, JobState.RUNNING.value]))
        .values(**values)
    )
    return result.rowcount == 1


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


def record_progress(session: Session, job_id: int, progress: Progress) -> None:
    values: dict[str, Any] = {
        "steps_done": progress.steps_done, "attained": progress.attained,
        "mean_iteration": progress.mean_iteration, "mean_gap": progress.mean_gap,
        "mem_persistent": progress.mem_persistent,
        "mem_peak": progress.mem_peak, "holds_lane": progress.holds_lane,
    }
    if progress.steps_total is not None:
        values["steps_total"] = progress.steps_total
    session.execute(
        update(Job).where(Job.id == job_id, Job.state == JobState.RUNNING.value).values(**values)
    )
