"""What the handlers share: naming jobs by label, and a job as clients see it."""

from __future__ import annotations


from sqlalchemy.orm import Session

from gq import messages
from gq.errors import UserError
from gq.queue import queries
from gq.queue.arrays import parse_label
from gq.queue.models import Job, JobEvent

def resolve(session: Session, label: str) -> list[Job]:
    """The jobs a label names (every task of an array for its id); an error if none."""
    jobs = queries.resolve(session, parse_label(label))
    if not jobs and "_" not in label:  # an array task by its own job id, as Slurm allows
        job = queries.job(session, int(label))
        jobs = [job] if job is not None else []
    if not jobs:
        raise UserError(f"no job {label} (see 'gq status --all' for the ids in the queue)")
    return jobs


def resolve_one(session: Session, label: str) -> Job:
    """One job: 17_3, 17, or an array's first task for the array's id."""
    return resolve(session, label)[0]


def event_info(event: JobEvent) -> messages.EventInfo:
    return messages.EventInfo(time=event.time, old_state=event.old_state,
                              new_state=event.new_state, reason=event.reason)


def job_info(job: Job, events: list[JobEvent] | None = None) -> messages.JobInfo:
    return messages.JobInfo(
        id=job.id, label=job.label, name=job.name, user=job.user, uid=job.uid, state=job.state,
        reason=job.reason, priority=job.priority, gpus=job.gpus, mem=job.mem,
        time_limit=job.time_limit, deadline=job.deadline, steps_total=job.steps_total, exclusive=job.exclusive,
        requeue=job.requeue, dependency=job.dependency, held=job.held,
        array_job_id=job.array_job_id, array_task_id=job.array_task_id,
        array_max_running=job.array_max_running, script=job.script, args=list(job.args),
        workdir=job.workdir, stdout=job.stdout_path, stderr=job.stderr_path, device=job.device,
        lane=job.lane, pid=job.pid, submit_time=job.submit_time, start_time=job.start_time,
        end_time=job.end_time, exit_code=job.exit_code, run_count=job.run_count,
        steps_done=job.steps_done, attained=job.attained, mean_iteration=job.mean_iteration,
        mean_gap=job.mean_gap,
        mem_persistent=job.mem_persistent, mem_peak=job.mem_peak, holds_lane=job.holds_lane,
        events=None if events is None else [event_info(e) for e in events])
