"""Recovery after a daemon crash: no job stays RUNNING that isn't, none runs twice."""

from __future__ import annotations

import logging
import os
import signal

import psutil

from gq.queue import queries, transitions
from gq.queue.engine import Database
from gq.queue.states import JobState

log = logging.getLogger("gq.daemon")
NODE_FAILURE = "node failure"


def _kill_leftovers(job_id: int, pid: int | None) -> None:
    """Workers die with their host, but their own children may not: end the job's group."""
    if pid is None:
        return
    for process in psutil.process_iter(["pid"]):
        if _group_of(process.pid) != pid:
            continue
        try:
            if process.environ().get("GQ_JOB_ID") == str(job_id):
                os.killpg(pid, signal.SIGKILL)
                return
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def recover(db: Database) -> list[int]:
    """End or requeue every job a dead daemon left RUNNING; return their ids."""
    with db.read() as session:
        stale = [(job.id, job.pid, job.requeue)
                 for job in queries.jobs(session, states=[JobState.RUNNING])]
    for job_id, pid, requeue in stale:
        _kill_leftovers(job_id, pid)
        with db.write() as session:
            if requeue:
                transitions.requeue(session, job_id, f"{NODE_FAILURE}; requeued")
            else:
                transitions.finish(session, job_id, JobState.FAILED, None, NODE_FAILURE)
        log.warning("job %d was running when the daemon died: %s", job_id,
                    "requeued" if requeue else "failed")
    return [job_id for job_id, _, _ in stale]
