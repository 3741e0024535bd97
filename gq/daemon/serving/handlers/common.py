"""What the handlers share: naming jobs by label, a job as clients see it, and output
patterns made paths."""

from __future__ import annotations

import os
import re
import time

from gq import defaults, messages
from gq.daemon.supervision.memory_figures import over_figure
from gq.errors import UserError
from gq.exec.job import idleness
from gq.queue import dependencies, lookups, queries
from gq.queue.arrays import parse_label
from gq.queue.engine import Transaction
from gq.queue.models import Job, JobEvent, JobRun
from gq.queue.states import JobState
from gq.slurm.environment import node_name


def resolve(session: Transaction, label: str) -> list[Job]:
    """The jobs a label names (every task of an array for its id); an error if none."""
    return resolve_all(session, [label])


def resolve_all(session: Transaction, labels: list[str]) -> list[Job]:
    """The jobs the labels name, in the order named, each once; an error naming the first
    label that names none. A few queries, however many labels."""
    plain = sorted({int(parse_label(label)) for label in labels if "_" not in label})
    runs = lookups.runs_of(session, plain)
    alone = [job_id for job_id in plain if not runs[job_id]]
    by_own_id = {job.id: job for job in queries.jobs(session, ids=alone)} if alone else {}
    found: dict[int, Job] = {}
    for label in labels:
        array_id, _, task = parse_label(label).partition("_")
        if task:
            jobs = lookups.resolve(session, label)
        else:  # a job, a whole array, or an array task by its own job id (as Slurm allows)
            jobs = runs[int(array_id)] or (
                [by_own_id[int(array_id)]] if int(array_id) in by_own_id else []
            )
        if not jobs:
            raise UserError(f"no job {label} (see 'gq status --all' for the ids in the queue)")
        for job in sorted(jobs, key=lambda j: j.id):
            found.setdefault(job.id, job)
    return list(found.values())


def resolve_one(session: Transaction, label: str) -> Job:
    """One job: 17_3, 17, or an array's first task for the array's id."""
    return resolve(session, label)[0]


def event_info(event: JobEvent) -> messages.EventInfo:
    return messages.EventInfo(
        time=event.time, old_state=event.old_state, new_state=event.new_state, reason=event.reason
    )


def job_info(
    job: Job, events: list[JobEvent] | None = None, detail: bool = True
) -> messages.JobInfo:
    """A job as clients see it; ``detail=False`` (lists) leaves out its command, directory
    and output paths, and needs no payload loaded."""
    return messages.JobInfo(
        id=job.id,
        label=job.label,
        name=job.name,
        user=job.user,
        uid=job.uid,
        state=job.state,
        reason=job.reason,
        priority=job.priority,
        gpus=job.gpus,
        mem=job.mem,
        time_limit=job.time_limit,
        deadline=job.deadline,
        steps_total=job.steps_total,
        exclusive=job.exclusive,
        requeue=job.requeue,
        dependency=job.dependency,
        held=job.held,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        array_max_running=job.array_max_running,
        script=job.script if detail else None,
        args=list(job.args) if detail else None,
        command=job.payload.command if detail else None,
        workdir=job.workdir if detail else None,
        stdout=job.stdout_path if detail else None,
        stderr=job.stderr_path if detail else None,
        device=job.device,
        lane=job.lane,
        pid=job.pid,
        submit_time=job.submit_time,
        start_time=job.start_time,
        end_time=job.end_time,
        exit_code=job.exit_code,
        run_count=job.run_count,
        steps_done=job.steps_done,
        attained=job.attained,
        mean_iteration=job.mean_iteration,
        mean_gap=job.mean_gap,
        mem_persistent=job.mem_persistent,
        mem_peak=job.mem_peak,
        holds_lane=job.holds_lane,
        events=None if events is None else [event_info(e) for e in events],
        host_mem=job.host_mem,
        cpus=job.cpus,
        gpu_type=job.gpu_type,
        begin_time=job.begin_time,
        output_pattern=job.output_pattern if detail else None,
        error_pattern=job.error_pattern if detail else None,
        interpreter=job.interpreter if detail else None,
        warn_signal=job.warn_signal,
        nodelist=job.nodelist,
        retries=job.retries,
        retry_delay=job.retry_delay,
        retries_left=job.retries_left,
        ntasks=job.ntasks,
        notify=job.notify if detail else None,
        mail_type=job.mail_type,
        mail_user=job.mail_user if detail else None,
        suspended=job.suspended or bool(job.preempted),  # (ST S either way)
        preempted=bool(job.preempted),
        mem_basis=_basis(job.mem_basis, job.mem),
        on_oom=messages.OnOutOfMemory(job.on_oom or messages.OnOutOfMemory.REQUEUE),
        ooms=job.ooms or 0,
        interactive=bool(job.interactive),
        idle_timeout=job.idle_timeout,
        idle=_idle(job),
        mem_over=job.state != JobState.PENDING.value and over_figure(job.mem, job.mem_peak),
        worker=job.interpreter is not None,
        lane_taken=job.lane_taken or 0,
        queued_time=job.queued_time,
        earlier_wait=max(0.0, job.earlier_wait or 0.0),
        earlier_run=max(0.0, job.earlier_run or 0.0),
        earlier_attained=max(0.0, job.earlier_attained or 0.0),
        earlier_steps=max(0, job.earlier_steps or 0),
        uncharged=max(0.0, job.uncharged or 0.0),
        earlier_uncharged=max(0.0, job.earlier_uncharged or 0.0),
    )


def run_infos(job: Job, kept: list[JobRun]) -> list[messages.RunInfo]:
    """A job's runs as gq show lists them: those kept as they ended, and its latest from its
    row while it runs (or where its end was not kept: a job from before runs were)."""
    runs = [
        messages.RunInfo(
            run=max(0, run.run),
            queued_time=run.queued_time,
            start_time=run.start_time,
            end_time=run.end_time,
            ended=run.ended,
            reason=run.reason,
            exit_code=run.exit_code,
            device=run.device,
            steps_done=max(0, run.steps_done),
            steps_total=run.steps_total,
            attained=run.attained,
        )
        for run in kept
    ]
    latest = job.run_count
    if job.start_time is not None and latest not in {run.run for run in kept}:
        runs.append(
            messages.RunInfo(
                run=max(0, latest),
                queued_time=job.queued_time if job.queued_time is not None else job.submit_time,
                start_time=job.start_time,
                end_time=job.end_time,
                ended=None if job.state == JobState.RUNNING.value else job.state,
                reason=None if job.state == JobState.RUNNING.value else job.reason,
                exit_code=job.exit_code,
                device=job.device,
                steps_done=max(0, job.steps_done),
                steps_total=job.steps_total,
                attained=job.attained,
            )
        )
    return runs


def _idle(job: Job) -> float | None:
    """A running interactive job's idle time, from its last activity as its host reported
    it (gq.exec.job.idleness): to REPORT_STEP seconds."""
    if not job.interactive or job.state != JobState.RUNNING.value or job.start_time is None:
        return None
    return min(
        idleness.idle_for(job.active_at, job.start_time, time.time()),
        float(defaults.MAX_TIME_LIMIT),
    )


def _basis(basis: str | None, mem: int | None) -> messages.MemoryBasis | None:
    """Where a job's memory figure came from: a figure of no other basis was declared."""
    if basis is not None:
        return messages.MemoryBasis(basis)
    return messages.MemoryBasis.DECLARED if mem is not None else None


_CODE = re.compile(r"%%|%(\d?)([jxuNntAa])")


def output_resolver(name: str, user: str, workdir: str):
    """Fill in %j (job id), %x (name), %u (user), %N (node), %A (array id), %a (task), and
    %n, %t (node and task number: 0 on one node) for one row, in one pass (a name holding
    "%a" stays as it is); a digit zero-pads a number, as in sbatch's %4a."""
    node = node_name()

    def resolve(pattern: str, job_id: int, array_id: int | None, task: int | None) -> str:
        values = {
            "j": job_id,
            "x": name,
            "u": user,
            "N": node,
            "n": 0,
            "t": 0,
            "A": array_id if array_id is not None else job_id,
            "a": task if task is not None else 0,
        }

        def fill(code: re.Match) -> str:
            if code.group(0) == "%%":
                return "%"
            value = values[code.group(2)]
            width = int(code.group(1) or 0) if isinstance(value, int) else 0
            return str(value).zfill(width)

        path = os.path.join(workdir, _CODE.sub(fill, pattern))
        if len(path) > defaults.MAX_PATH:
            raise UserError(
                f"output path {pattern[:60]!r} is {len(path)} characters long once "
                f"%j, %x, %u, %N, %A and %a are filled in, over gq's limit of "
                f"{defaults.MAX_PATH}; give a shorter -o/-e"
            )
        return path

    return resolve


def check_dependency(session: Transaction, text: str | None) -> None:
    """Every job a dependency names exists (or existed: its row is kept)."""
    if text is None:
        return
    runs = lookups.runs_of(session, dependencies.parse(text).job_ids)
    missing = sorted(job_id for job_id, found in runs.items() if not found)
    if missing:
        raise UserError(
            f"dependency on job {', '.join(map(str, missing))}, which does not exist "
            "(see 'gq status --all')"
        )
