"""What a daemon does with jobs the queue says are RUNNING but no live execution host runs:
none stays RUNNING that isn't, none runs twice, and nothing of theirs is left running."""

from __future__ import annotations

import logging
import os
import signal

import psutil

from gq import defaults
from gq.exec.cgroups.job_cgroups import Cgroups
from gq.exec.host.process_groups import environ_value
from gq.queue import job_updates, queries, transitions
from gq.queue.engine import Database
from gq.queue.states import JobState

log = logging.getLogger("gq.daemon")
NODE_FAILURE = "node failure"
LAUNCH_LOST = "its launch was lost while the daemon restarted; requeued"


def kill_leftovers(
    backend: Cgroups | None, device: str, job_id: int, run: int, pid: int | None
) -> None:
    """Workers die with their host, but what they started may not: kill the run's cgroup
    (everything it started, daemonised or not) and wait for it to empty; without cgroups,
    its process group."""
    if backend is not None:
        cgroup = backend.job(device, job_id, run)
        if not cgroup.kill(defaults.CGROUP_KILL_TIMEOUT):
            log.error("job %d: processes left in %s after SIGKILL", job_id, cgroup.name)
        cgroup.remove()
    if pid is None:
        return
    for process in psutil.process_iter(["pid"]):
        if _group_of(process.pid) != pid:
            continue
        if environ_value(process.pid, b"GQ_JOB_ID") == str(job_id).encode():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            return


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def recover(
    db: Database, device: str, adopted: set[int], survived: bool, cgroups: Cgroups | None
) -> list[int]:
    """End or requeue every job RUNNING on ``device`` that its just-attached host does not
    run (is not among the ``adopted``); return their ids.

    A job that never reported its process to a host that ``survived`` (was adopted, not
    started afresh) was never started: the daemon died between recording the start and the
    host receiving it; back to the queue. Any other is a node failure: its leftovers are
    killed, then it is FAILED, or PENDING again for --requeue jobs.
    """
    with db.read() as session:
        stale = [
            (job.id, job.run_count, job.pid, job.requeue, job.stop_request)
            for job in queries.jobs(session, states=[JobState.RUNNING])
            if job.id not in adopted and (job.device or "").split(",")[0] == device
        ]
    for job_id, run, pid, requeue, stop_request in stale:
        never_started = pid is None and survived
        if not never_started:
            kill_leftovers(cgroups, device, job_id, run, pid)
        with db.write() as session:
            if never_started and stop_request == job_updates.CANCEL:
                transitions.finish(
                    session,
                    job_id,
                    JobState.CANCELLED,
                    None,
                    "cancelled before its launch reached the host",
                )
            elif never_started:
                transitions.requeue(session, job_id, LAUNCH_LOST, started=False)
            elif requeue:
                transitions.requeue(session, job_id, f"{NODE_FAILURE}; requeued")
            else:
                transitions.finish(session, job_id, JobState.FAILED, None, NODE_FAILURE)
        log.warning(
            "job %d was running on no live host: %s",
            job_id,
            "cancelled"
            if never_started and stop_request == job_updates.CANCEL
            else "requeued"
            if never_started or requeue
            else "failed",
        )
    return [job_id for job_id, *_ in stale]
