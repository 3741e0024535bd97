"""Reading the queue: status and history (anyone), a job's log and script (its owner or an
operator)."""

from __future__ import annotations

import math
import os
import pwd
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gq import defaults, messages
from gq.daemon.forecasts import first_guess
from gq.daemon.serving import ownerfiles, waiting
from gq.daemon.serving.access import Caller, check_may_act
from gq.daemon.serving.handlers.common import job_info, resolve, resolve_all, resolve_one, run_infos
from gq.daemon.serving.listings import Listing
from gq.daemon.serving.waiting import Waiting
from gq.errors import UserError
from gq.queue import arrays, job_runs, lookups, queries, spool, stats
from gq.queue.engine import Database, Transaction
from gq.queue.models import Job
from gq.queue.states import JobState
from gq.sim.work_estimates import Basis

if TYPE_CHECKING:
    from gq.daemon.serving.handlers.node_view import NodeView


def list_jobs(
    daemon: NodeView, caller: Caller, request: messages.ListJobs
) -> messages.Jobs | Listing:
    """Anyone may list the queue, as squeue lets them: every pending and running job, and
    finished ones a page at a time, newest first. A listing of more than
    ``defaults.LIST_INLINE`` records is made off the loop (:mod:`gq.daemon.serving.listings`): the
    loop reads no more of it than it takes to know."""
    with daemon.db.read() as session:
        listed = _listed(daemon, session, _Asked(request), defaults.LIST_INLINE)
    return Listing(caller.uid, request) if listed is None else listed


def listed_apart(daemon: NodeView, request: messages.ListJobs) -> bytes:
    """:func:`list_jobs`' answer line, however big, made on a connection to the queue of its
    own (a listing child's: a connection must not cross a fork)."""
    db = Database(daemon.home)
    try:
        with db.read() as session:
            listed = _listed(daemon, session, _Asked(request), None)
            assert listed is not None
            return messages.encode(listed)
    finally:
        db.close()


class _Asked:
    """What a ListJobs asks for, as the queue's reads take it."""

    def __init__(self, request: messages.ListJobs):
        states = (
            list(JobState)
            if request.states is None
            else [JobState.parse(s) for s in request.states]
        )
        self.request = request
        self.active = [state for state in states if not state.terminal]
        self.finished = [state for state in states if state.terminal]
        self.limit = min(request.limit or defaults.LIST_PAGE, defaults.LIST_PAGE)
        self.fold = (
            not request.array_tasks
            and JobState.PENDING in self.active
            and request.ended_since is None
        )  # (a pending job has not ended)
        self.before = (
            None
            if request.before_end is None or request.before is None
            else (request.before_end, request.before)
        )


def _listed(
    daemon: NodeView, session: Transaction, asked: _Asked, bound: int | None
) -> messages.Jobs | None:
    """The listing; None if it would hold more than ``bound`` records (an array's folded
    tasks count one), found reading at most one row past it."""
    request = asked.request
    groups = queries.unstarted_task_groups(session, request.users) if asked.fold else []
    room = math.inf if bound is None else bound - len(groups)
    if room < 0:
        return None
    jobs = (
        list(
            queries.jobs(
                session,
                states=asked.active,
                users=request.users,
                payloads=False,
                ended_since=request.ended_since,
                unstarted_tasks=not asked.fold,
                limit=None if bound is None else int(room) + 1,
            )
        )
        if asked.active
        else []
    )
    if len(jobs) > room:
        return None
    older = None
    if asked.finished:
        left = room - len(jobs)
        # A page that may not fit is asked for one job past the room: if that one comes,
        # it does not; if not, what came is every job the full page would have held.
        page, older = queries.finished_page(
            session,
            asked.finished,
            asked.limit if asked.limit <= left else int(left) + 1,
            users=request.users,
            before=asked.before,
            ended_since=request.ended_since,
        )
        if len(page) > left:
            return None
        jobs += reversed(page)
    kept_since = stats.oldest_end(session) if asked.finished else None
    infos = [job_info(job, detail=False) for job in jobs]
    if groups:
        infos = sorted(infos + _folded(session, groups), key=lambda info: info.id)
    made = _forecast(daemon, infos) if request.forecast else None
    shares = fair_share(daemon, {info.user for info in infos}) if request.fair_share else None
    return messages.Jobs(
        infos,
        stale=daemon.stale(),
        forecast_made=made,
        retention=None if math.isinf(daemon.options.retention) else daemon.options.retention,
        kept_since=kept_since,
        older_end=older[0] if older else None,
        older=older[1] if older else None,
        fair_share=shares,
    )


def fair_share(daemon: NodeView, users: set[str] | None = None) -> messages.FairShare:
    """Users' fair-share usage now (``users``: those alone), most first."""
    usage = daemon.ledger.usages()
    shown = {u: v for u, v in usage.items() if users is None or u in users}
    half_life = daemon.ledger.half_life
    return messages.FairShare(
        half_life=None if math.isinf(half_life) else half_life,
        usage=dict(list(shown.items())[: defaults.MAX_SHARED_USERS]),
    )


def _folded(session, groups: list[tuple[int, list[int]]]) -> list[messages.JobInfo]:
    """One record for each group of an array's unstarted tasks (squeue's 17_[5-99%8]): its
    first task's, the task ids its own; a group of one is that task's own record."""
    first = {
        job.id: job for job in queries.jobs(session, ids=[g[0] for g in groups], payloads=False)
    }
    infos = []
    for job_id, tasks in groups:
        info = job_info(first[job_id], detail=False)
        if len(tasks) > 1:
            info.array_task_string = arrays.ranges(tasks)
            info.array_task_count = len(tasks)
            info.array_task_id = None
            info.label = (
                f"{info.array_job_id}_"
                f"{arrays.bracketed(info.array_task_string, info.array_max_running)}"
            )
        infos.append(info)
    return infos


def wait(daemon: NodeView, caller: Caller, request: messages.Wait) -> messages.WaitOver | Waiting:
    """The jobs named (a whole array for its id), or the caller's (``user``'s) pending and
    running ones: how they ended, now or once the last has (anyone may wait, as anyone may
    list the queue)."""
    with daemon.db.read() as session:
        jobs: Sequence[Job]
        if request.labels:
            jobs = resolve_all(session, request.labels)
        else:
            jobs = queries.jobs(
                session,
                states=[JobState.PENDING, JobState.RUNNING],
                users=[request.user or caller.name],
                payloads=False,
            )
            if not jobs:
                raise UserError(
                    f"{request.user or caller.name} has no pending or running job to wait for"
                )
        if len(jobs) > defaults.MAX_WAITED:
            raise UserError(
                f"{len(jobs)} jobs is more than one gq wait waits for "
                f"({defaults.MAX_WAITED}); wait for fewer"
            )
        ids = [job.id for job in jobs]
        unfinished = {job.id for job in jobs if not JobState(job.state).terminal}
        if not unfinished:
            return waiting.ended(session, ids)
    daemon.waiters.check_room(caller.uid, len(unfinished))
    return Waiting(ids, unfinished, caller.uid)


def show(daemon: NodeView, caller: Caller, request: messages.ShowJob) -> messages.Jobs:
    """One job with its state history (and, running, its processes and host memory); an
    array's id shows its first tasks (``defaults.MAX_SHOWN_JOBS``), and says how many more
    there are: each carries its arguments, so all of a big array's would be a huge answer."""
    with daemon.db.read() as session:
        jobs = resolve(session, request.label)
        shown = jobs[: defaults.MAX_SHOWN_JOBS]
        history = lookups.events(session, [job.id for job in shown])
        kept = job_runs.runs(session, [job.id for job in shown])
        infos = []
        summed = defaults.USAGE_PROCESSES  # for the whole request: an array's tasks share it
        for job in shown:
            info = job_info(job, history[job.id])
            info.runs = run_infos(job, kept[job.id])
            if (memory := daemon.device_memory(job.id)) is not None:
                info.memory_place, info.memory_held = memory.place, memory.held_why
                info.memory_moved, info.memory_took = memory.moved, memory.took
            usage = daemon.usage(job, summed)
            if usage is not None:
                info.host_memory, info.processes = usage.memory, usage.processes
                if usage.tasks is not None:
                    tasks = usage.tasks
                    info.pids_current, info.pids_max = tasks.current, tasks.limit
                    info.pids_refused = tasks.refused
                summed -= usage.summed
            infos.append(info)
        return messages.Jobs(
            infos,
            stale=daemon.stale(),
            more=len(jobs) - len(shown),
            forecast_made=_forecast(daemon, infos),
        )


def _forecast(daemon: NodeView, infos: list[messages.JobInfo]) -> float | None:
    """Each pending and running job's forecast, from the last one the daemon made (a job
    it has not forecast yet: a first guess from time limits, else unknown); when that was
    made."""
    made = daemon.forecaster.current
    loads = None
    for info in infos:
        if JobState(info.state).terminal:
            continue
        found = made.jobs.get(info.id)
        if found is None:  # new since the last forecast: a first guess from time limits
            loads = daemon.loads() if loads is None else loads
            if first_guess.guess(info, loads, time.time()):
                continue
        info.forecast = (found.basis if found is not None else Basis.UNKNOWN).name.lower()
        if found is not None:
            info.forecast_start, info.forecast_end = found.start, found.end
        if info.start_time is not None:  # it has started: when it did, not a prediction
            info.forecast_start = info.start_time  # (a forecast made as it started)
    return made.made_at or None


def open_log(daemon: NodeView, caller: Caller, request: messages.OpenLog):
    """A job's output file. Its owner opens it themselves (the answer names it); for an
    operator the daemon opens it with the owner's rights, never its own, and passes the
    descriptor (see :mod:`gq.daemon.serving.ownerfiles`)."""
    with daemon.db.read() as session:
        job = resolve_one(session, request.label)
        info = job_info(job)
    check_may_act(caller, job.uid, job.user, "read the logs of", job.label)
    path = job.stderr_path if request.stderr else job.stdout_path
    if not path:
        raise UserError(
            f"job {job.label} is interactive: its output went to its terminal "
            "(gq run --pty -o FILE keeps it in a file)"
        )
    if caller.uid == job.uid:
        return messages.LogFile(info, path, exists=True, opened=False)
    try:
        fd = ownerfiles.open_as(path, _owner(daemon, job))
    except FileNotFoundError:
        return messages.LogFile(info, path, exists=False)
    except OSError as exc:
        raise UserError(
            f"cannot open job {job.label}'s output file {path} as {job.user}: {exc.strerror}"
        ) from None
    return messages.LogFile(info, path, exists=True), [fd]


def export(daemon: NodeView, caller: Caller, request: messages.ExportScript) -> messages.Script:
    """A job's snapshot, read with its owner's rights and at most the script size limit; for
    a whole job array, its task ids too."""
    with daemon.db.read() as session:
        job = resolve_one(session, request.label)
        info = job_info(job)
        tasks = None
        if job.array_job_id is not None and request.label == str(job.array_job_id):
            tasks = list(lookups.array_task_ids(session, job.array_job_id))
    check_may_act(caller, job.uid, job.user, "export", job.label)
    if not job.spool_path:
        raise UserError(
            f"job {job.label}'s script was dropped from the spool to make room "
            "for newer ones (the daemon's --max-spool); nothing to export"
        )
    try:
        body = spool.read(job.spool_path, defaults.MAX_SCRIPT)
    except ValueError:
        raise UserError(
            f"the snapshot of job {job.label} has grown past "
            f"{defaults.MAX_SCRIPT >> 20} MiB since it was submitted; not "
            "exported"
        ) from None
    except OSError as exc:
        raise UserError(f"cannot read the snapshot of job {job.label}: {exc.strerror}") from None
    return messages.Script(info, body, tasks)


def _owner(daemon: NodeView, job: Job) -> ownerfiles.Owner:
    """Whose rights open the job's files: its submitter's (a personal daemon's own)."""
    if not daemon.home.system:
        return ownerfiles.Owner(os.geteuid(), os.getegid(), ())
    if job.uid is None or job.gid is None:
        raise UserError(f"job {job.label} names no owner uid; its files are not opened")
    try:
        name = pwd.getpwuid(job.uid).pw_name
        groups = tuple(os.getgrouplist(name, job.gid))
    except KeyError:
        groups = (job.gid,)
    return ownerfiles.Owner(job.uid, job.gid, groups)
