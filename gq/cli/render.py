"""How jobs look to people (plain aligned columns, as squeue prints them) and to programs
(JSON with ISO 8601 times). Works on the daemon's answers, typed (gq.messages) or read as
plain fields (gq status, gq history: see gq/cli/listing.py), and imports what ``gq status``
does not need (json, datetime, the messages) where it is used."""

from __future__ import annotations

import time

from gq import defaults, validation
from gq.queue.state_codes import SHORT
from gq.units import format_duration, format_size

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any

    from gq.client import Fields
    from gq.messages import EventInfo, FairShare, JobInfo, RunInfo


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    from datetime import datetime

    return datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="milliseconds")


def short_time(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    from datetime import datetime

    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%dT%H:%M:%S")


def forecast_time(job: JobInfo, end: bool) -> str:
    """A job's forecast start or end as a column shows it: the time, after "~" where it is
    estimated (the start of a job whose own end is unknown is an estimate too); "?" where
    unknown; "-" where none was asked for or the job has ended. A running job's start is
    its real one."""
    if not end and job.start_time is not None:
        return short_time(job.start_time)
    if job.forecast is None:
        return "-"
    when = job.forecast_end if end else job.forecast_start
    if when is None:
        return "?"
    return ("" if job.forecast == "known" else "~") + short_time(when)


def elapsed(job: JobInfo | Fields, now: float | None = None) -> float | None:
    """Its latest run's time (squeue's TIME)."""
    if job.start_time is None:
        return None
    end = job.end_time if job.end_time is not None else (now or time.time())
    return max(0.0, end - job.start_time)


# A requeued job's totals (gq history, gq show), as sacct sums a job's steps: its latest
# run's figures and what its runs before it add up to (gq.queue.job_runs).


def wait_time(job: JobInfo, now: float | None = None) -> float:
    """Seconds it was PENDING before each of its runs (from its submission, or its
    requeue, to that run's start; a job that never started again: to its end), summed.
    Not its latest start less its submission, which counts its earlier runs as waits."""
    queued = job.queued_time if job.queued_time is not None else job.submit_time
    start = job.start_time if job.start_time is not None else (job.end_time or now or time.time())
    return max(0.0, start - queued) + job.earlier_wait


def run_time(job: JobInfo, now: float | None = None) -> float | None:
    """Seconds its runs ran, summed (None: none has started)."""
    latest = elapsed(job, now)
    if latest is None and not job.earlier_run:
        return None
    return (latest or 0.0) + job.earlier_run


def lane_time(job: JobInfo) -> float:
    """The lane time its runs were billed, summed (a requeued job's row keeps its latest
    run's figures until it starts again: counted once, among the earlier runs)."""
    return (job.attained if job.start_time is not None else 0.0) + job.earlier_attained


def charged_time(job: JobInfo) -> float:
    """Of its lane time, what its owner's fair share was charged (side by side: at the share
    of the device it got), its runs summed."""
    uncharged = (job.uncharged if job.start_time is not None else 0.0) + job.earlier_uncharged
    return max(0.0, lane_time(job) - uncharged)


def pace_side_by_side(job: JobInfo) -> float | None:
    """Its lane time's pace against taking turns, where it ran side by side (charged over
    billed; None: it never did). Side by side, a job holds its lane all the time at a part
    of the device; a job that ran partly side by side shows the mix."""
    billed = lane_time(job)
    charged = charged_time(job)
    return charged / billed if billed > 0 and charged < billed else None


def steps_reached(job: JobInfo) -> int:
    """The steps it reached in the end: its latest run's count (each run counts its own
    steps), or its total where a later run completed it (resumed from a checkpoint, a run
    counts only the steps from there on)."""
    if resumed_and_done(job) and job.run_count > 1 and job.steps_total is not None:
        return job.steps_total
    return job.steps_done


def _steps_counted(job: JobInfo) -> int:
    """Every step its runs counted, each its own (what its iterations per second go on)."""
    return (job.steps_done if job.start_time is not None else 0) + job.earlier_steps


def iteration_rate(job: JobInfo) -> float | None:
    """Iterations per second of its runs' wall time."""
    run, steps = run_time(job), _steps_counted(job)
    return steps / run if steps and run else None


def lane_share(job: JobInfo) -> float | None:
    """The share of its time resident that the job held its lane (ran iterations)."""
    run = run_time(job)
    return min(1.0, lane_time(job) / run) if _steps_counted(job) and run else None


def command_line(job: JobInfo) -> str:
    """The command line the user gave, quoted as a shell would read it; for a job submitted
    before it was kept (or given new arguments since), its script and arguments so quoted."""
    if job.command is not None:
        return job.command
    import shlex

    return shlex.join([job.script or "", *(job.args or [])])


def run_json(run: RunInfo) -> dict[str, Any]:
    """One run of a job (gq show --json's ``runs``)."""
    ran = None if run.start_time is None else (run.end_time or time.time()) - run.start_time
    waited = (run.start_time if run.start_time is not None else run.end_time) or time.time()
    return {
        "run": run.run,
        "queued_time": iso(run.queued_time),
        "start_time": iso(run.start_time),
        "end_time": iso(run.end_time),
        "ended": run.ended,
        "reason": run.reason,
        "exit_code": run.exit_code,
        "device": run.device,
        "wait_time": max(0.0, waited - run.queued_time),
        "run_time": None if ran is None else max(0.0, ran),
        "steps_done": run.steps_done,
        "steps_total": run.steps_total,
        "attained": run.attained,
    }


def job_json(job: JobInfo) -> dict[str, Any]:
    data = {
        "id": job.id,
        "job_id": job.label,
        "name": job.name,
        "user": job.user,
        "uid": job.uid,
        "state": "SUSPENDED" if job.suspended else job.state,
        "suspended": job.suspended,
        "preempted": job.preempted,
        "priority": job.priority,
        "device": job.device,
        "lane": job.lane,
        "submit_time": iso(job.submit_time),
        "start_time": iso(job.start_time),
        "end_time": iso(job.end_time),
        "exit_code": job.exit_code,
        "steps_done": steps_reached(job),
        "steps_total": job.steps_total,
        "reason": job.reason,
        "gpus": job.gpus,
        "gpu_type": job.gpu_type,
        "mem": job.mem,
        "gpu_mem": job.mem,
        "host_mem": job.host_mem,
        "cpus_per_task": job.cpus,
        "time_limit": job.time_limit,
        "begin_time": iso(job.begin_time),
        "signal": job.warn_signal,
        "nodelist": job.nodelist,
        "retries": job.retries,
        "retry_delay": job.retry_delay,
        "deadline": iso(job.deadline),
        "missed_by": deadline_miss(job),
        "exclusive": job.exclusive,
        "requeue": job.requeue,
        "worker": job.worker,
        "interactive": job.interactive,
        "idle_timeout": job.idle_timeout,
        "idle": job.idle,
        "dependency": job.dependency,
        "held": job.held,
        "array_job_id": job.array_job_id,
        "array_task_id": job.array_task_id,
        "array_max_running": job.array_max_running,
        "array_task_string": job.array_task_string,
        "array_task_count": job.array_task_count,
        "pid": job.pid,
        "run_count": job.run_count,
        "holds_lane": job.holds_lane,
        "lane_taken": job.lane_taken,
        "attained": lane_time(job),
        "charged": charged_time(job),
        "pace_side_by_side": pace_side_by_side(job),
        "mean_iteration": job.mean_iteration,
        "mean_gap": job.mean_gap,
        "mem_persistent": job.mem_persistent,
        "mem_basis": job.mem_basis,
        "on_oom": job.on_oom,
        "ooms": job.ooms,
        "mem_over": job.mem_over,
        "mem_peak": job.mem_peak,
        "host_memory": job.host_memory,
        "device_memory": {
            "place": job.memory_place or "device",
            "held_why": job.memory_held,
            "moved": job.memory_moved,
            "took": job.memory_took,
        },
        "processes": job.processes,
        "pids_current": job.pids_current,
        "pids_max": job.pids_max,
        "pids_refused": job.pids_refused,
        "iterations_per_second": iteration_rate(job),
        "lane_share": lane_share(job),
        "wait_time": wait_time(job) if job.state != "PENDING" else None,
        "run_time": run_time(job),
        "jct": (job.end_time - job.submit_time) if job.end_time is not None else None,
    }
    if job.forecast is not None:
        data["forecast"] = {
            "start": iso(job.forecast_start),
            "end": iso(job.forecast_end),
            "basis": job.forecast,
        }
    if job.script is not None:  # answers about one job carry its command and paths
        data.update(
            command=command_line(job),
            script=job.script,
            args=job.args,
            workdir=job.workdir,
            stdout=job.stdout,
            stderr=job.stderr,
        )
    if job.events is not None:
        data["events"] = [event_json(e) for e in job.events]
    if job.runs is not None:  # answers about one job carry each of its runs
        data["runs"] = [run_json(run) for run in job.runs]
    return data


_BASES = {  # by gq.messages.MemoryBasis's values (its members are these strings)
    "declared": "declared",
    "measured": f"measured: the peak of its first iterations and {defaults.MEMORY_MARGIN:.0%}",
    "raised": "raised to what it asked for when it ran out of memory",
}


def memory_figure(job: JobInfo) -> str:
    """A job's device-memory figure and where it came from (gq show)."""
    if job.mem is None:
        if not job.worker:  # a plain process: it takes no turns and is not probed
            return "- (asks for no device)" if job.gpus == 0 else "- (a plain process)"
        return "- (none declared: measured over its first iterations)"
    text = f"{size(job.mem)} ({_BASES[job.mem_basis or 'declared']})"
    if job.mem_over:
        text += f"  MEM! its worker claims {size(job.mem_peak)}, more than that"
    return text


def event_json(event: EventInfo) -> dict[str, Any]:
    return {
        "time": iso(event.time),
        "old_state": event.old_state,
        "new_state": event.new_state,
        "reason": event.reason,
    }


def dumps(value: Any) -> str:
    import json

    return json.dumps(value, indent=2)


printable = validation.printable  # what a user named, as it may reach a terminal


def table(header: list[str], rows: list[list[str]]) -> str:
    """Columns as wide as their widest cell: nothing is cut, piped or not."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = []
    for row in [header, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def progress(job: JobInfo, width: int = 10) -> str:
    if not job.steps_total:
        return str(job.steps_done) if job.steps_done else "-"
    if resumed_and_done(job):
        return f"{'█' * width} done ({job.steps_done} in run {job.run_count})"
    fraction = min(1.0, job.steps_done / job.steps_total)
    filled = int(round(fraction * width))
    return f"{'█' * filled}{'░' * (width - filled)} {job.steps_done}/{job.steps_total}"


def resumed_and_done(job: JobInfo) -> bool:
    """A job completed by a later run (resumed from a checkpoint, say), which counted only
    its own steps: fewer than the total, and done all the same."""
    return (
        job.state == "COMPLETED"
        and job.steps_total is not None
        and job.steps_done < job.steps_total
    )


def lane_state(job: JobInfo) -> str:
    """A running job's LANE: it holds its lane, waits for it, or (a plain process, which
    takes no turns on a lane) neither."""
    if job.state != "RUNNING" or job.suspended:
        return ""
    if not job.worker:
        return "-"
    return "holds" if job.holds_lane else "waits"


def name_mark(job: JobInfo) -> str:
    """gq status's NAME: an interactive job's (gq run --pty, a kernel) marked as one, with
    its idle time while it runs, as ``w`` shows a login's (from a minute on)."""
    if not job.interactive:
        return job.name
    if job.idle is not None and job.idle >= 60:
        return f"{job.name} [pty, idle {idle_time(job.idle)}]"
    return f"{job.name} [pty]"


def idle_time(seconds: float) -> str:
    """``w``'s idle spelling: ``45s``, ``12:05`` (minutes:seconds), ``3:20m`` (hours), ``2days``."""
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
    if seconds < 86400:
        return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}days"


def state_label(job: JobInfo) -> str:
    """squeue's ST: S for a suspended job (it is RUNNING, stopped in place)."""
    return "S" if job.suspended else SHORT[job.state]


def predicted_end(job: JobInfo, now: float | None = None) -> float | None:
    """When a running job will end at its measured pace, if its total steps are known."""
    if job.state != "RUNNING" or not job.steps_total or not job.mean_iteration:
        return None
    left = max(0, job.steps_total - job.steps_done)
    return (now or time.time()) + left * job.mean_iteration


def deadline_miss(job: JobInfo, now: float | None = None) -> float | None:
    """By how much a job misses (or, running, is predicted to miss) its deadline."""
    if job.deadline is None:
        return None
    if job.state == "DEADLINE":
        left = (
            (job.steps_total - job.steps_done) * job.mean_iteration
            if job.steps_total and job.mean_iteration
            else None
        )
        return left
    end = predicted_end(job, now) if job.state == "RUNNING" else job.end_time
    if end is None or end <= job.deadline:
        return None
    return end - job.deadline


def size(value: int | None) -> str:
    return format_size(value)


def duration(value: float | None) -> str:
    return format_duration(value)


def fair_share(share: FairShare | dict, shown: int = 10) -> str:
    """Users' fair-share usage in a line, most first: ``fair share (lane time, half-life
    1 day): ann 12.3s, bob 1.2s`` (``share`` typed, or as the plain path reads it)."""
    from gq.units import describe_period

    if not isinstance(share, dict):
        share = {"half_life": share.half_life, "usage": share.usage}
    half_life = share["half_life"]
    decay = "never decayed" if half_life is None else f"half-life {describe_period(half_life)}"
    users = list(share["usage"].items())
    said = ", ".join(f"{user} {seconds:.1f}s" for user, seconds in users[:shown])
    more = f", and {len(users) - shown} more" if len(users) > shown else ""
    return f"fair share (lane time used, {decay}): {said or 'nobody yet'}{more}"
