"""Submitting: the PENDING row of a new job, or one per task of a job array, with its
payload (environment and arguments), its output paths and its first event.

Everything written here was checked on its way in (by the wire's decoding and the request
handlers), so that no row can break a query for anyone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, insert, update

from gq.queue.job_updates import HELD
from gq.queue.models import Job, Payload
from gq.queue.prepared import Prepared
from gq.queue.spool_usage import count_spool
from gq.queue.states import JobState
from gq.queue.transitions import NEW_EVENT

if TYPE_CHECKING:
    from gq.queue.engine import Transaction


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
    command: str | None = None  # the command line as the user gave it (gq show)
    submit_time: float = field(default_factory=time.time)


# resolve_output(pattern, job_id, array_id, task) -> path: fills in %j, %x, %A, %a.
# snapshot(job_id) -> path: writes the script's snapshot for the submission's first id.
def submit(
    session: Transaction,
    new: NewJob,
    resolve_output,
    snapshot: Callable[[int], str] = lambda job_id: "",
) -> list[int]:
    """Insert the PENDING row, or one per task of a job array (the first id names the array,
    and its tasks share one payload and snapshot): a few statements, however many tasks.
    Their ids."""
    tasks = new.array_tasks if new.array_tasks is not None else (None,)
    payload_id = _NEW_PAYLOAD.scalar(
        session,
        {
            "env": dict(new.env),
            "args": list(new.args),
            "spool_bytes": new.spool_bytes,
            "command": new.command,
        },
    )
    if new.uid is not None:
        count_spool(session, {new.uid: new.spool_bytes})
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
        preempted=False,
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
        lane_taken=0,
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
    NEW_EVENT.executemany(
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
