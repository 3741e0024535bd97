"""A job's runs: each run kept as it ends (``job_runs``), what its earlier runs add up to
on its row (``jobs.earlier_*``), and the runs of a job as ``gq show`` lists them. A job
requeued (by gq requeue, scontrol requeue, an out-of-memory requeue or --retries) keeps its
id and runs again: sacct lists such a job's runs, and sums them, as gq does here.

Written by gq.queue.transitions, in the transaction of the move that ends a run or puts a
job back in the queue; deleted with their job (ON DELETE CASCADE, gq.queue.purging).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Float, Integer, String, Text, bindparam, case, func, insert, select

from gq.queue.models import Job, JobRun
from gq.queue.prepared import Prepared
from gq.queue.queries import among, chunks
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.queue.engine import Transaction

REQUEUED = "REQUEUED"  # how a run ended that went back to the queue

# A job put back in the queue adds its latest run to its earlier ones (see Job.queued_time):
# its wait before it (a run that never started, a job cancelled while pending: its wait to
# its end), its run time, lane time and steps; and it waits again from now. (An UPDATE's
# values read the row as it was.)
_STARTED = Job.start_time.is_not(None)
INTO_EARLIER = {
    "earlier_wait": Job.earlier_wait
    + func.coalesce(Job.start_time, Job.end_time, bindparam("b_now"))
    - func.coalesce(Job.queued_time, Job.submit_time),
    "earlier_run": Job.earlier_run
    + func.coalesce(func.coalesce(Job.end_time, bindparam("b_now")) - Job.start_time, 0.0),
    "earlier_attained": Job.earlier_attained + case((_STARTED, Job.attained), else_=0.0),
    "earlier_steps": Job.earlier_steps + case((_STARTED, Job.steps_done), else_=0),
    "earlier_uncharged": Job.earlier_uncharged + case((_STARTED, Job.uncharged), else_=0.0),
    "queued_time": bindparam("b_now"),
}
_kept: dict[tuple, Prepared] = {}


def _run_row(guard: Any) -> Prepared:
    """The INSERT that keeps a RUNNING job's run as it ends, read from its row (before the
    move clears its start and device), its last progress bound over the row's where given
    (``r_steps``, ``r_total``, ``r_attained``; None: the row's)."""
    statement = _kept.get(("run", id(guard)))
    if statement is None:
        jobs = Job.__table__.c
        query = select(
            jobs.id,
            jobs.run_count,
            func.coalesce(jobs.queued_time, jobs.submit_time),
            jobs.start_time,
            bindparam("r_end", type_=Float),
            bindparam("r_ended", type_=String),
            bindparam("r_reason", type_=Text),
            bindparam("r_exit", type_=Integer),
            jobs.device,
            func.coalesce(bindparam("r_steps", type_=Integer), jobs.steps_done),
            func.coalesce(bindparam("r_total", type_=Integer), jobs.steps_total),
            func.coalesce(bindparam("r_attained", type_=Float), jobs.attained),
        ).where(jobs.id == bindparam("r_id"), jobs.state == JobState.RUNNING.value)
        if guard is not None:
            query = query.where(guard)
        columns = ["job_id", "run", "queued_time", "start_time", "end_time", "ended", "reason"]
        columns += ["exit_code", "device", "steps_done", "steps_total", "attained"]
        statement = _kept["run", id(guard)] = Prepared(insert(JobRun).from_select(columns, query))
    return statement


def keep_run(
    session: Transaction,
    job_id: int,
    new: JobState,
    reason: str | None,
    now: float,
    guard: Any,
    values: dict[str, Any],
) -> int | None:
    """Keep the run a move of a RUNNING job to ``new`` ends, as the move's ``values`` leave
    it (on the move's own conditions: kept only if the job moves); the row's id."""
    kept = _run_row(guard).execute(
        session,
        {
            "r_id": job_id,
            "r_end": now,
            "r_ended": new.value if new.terminal else REQUEUED,
            "r_reason": reason,
            "r_exit": values.get("exit_code"),
            "r_steps": values.get("steps_done"),
            "r_total": values.get("steps_total"),
            "r_attained": values.get("attained"),
        },
    )
    return kept.lastrowid if kept.rowcount == 1 else None


def runs(session: Transaction, job_ids: Iterable[int]) -> dict[int, list[JobRun]]:
    """Each job's ended runs, the first first."""
    found: dict[int, list[JobRun]] = {job_id: [] for job_id in job_ids}
    for part in chunks(sorted(found)):
        for run in session.scalars(
            select(JobRun).where(among(JobRun.job_id, part)).order_by(JobRun.id)
        ):
            found[run.job_id].append(run)
    return found
