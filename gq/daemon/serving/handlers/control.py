"""Changing jobs: cancel, hold, release, requeue, update (like scancel and scontrol).

Every label is resolved and every named job's owner checked before anything changes, so an
unknown id or someone else's job refuses the whole request and changes nothing. Each verb
is then one statement per chunk of jobs, linear in their number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gq import defaults, messages, validation
from gq.daemon.serving.access import Caller, check_may_act, check_may_raise
from gq.daemon.serving.handlers.common import check_dependency, output_resolver, resolve_all
from gq.errors import Refused, UserError
from gq.messages import REFUSED, Line
from gq.queue import dependencies, job_updates, lookups, queries, transitions
from gq.queue.engine import Transaction
from gq.queue.models import Job
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.daemon.serving.handlers.node_view import NodeView


def _named(session: Transaction, caller: Caller, labels: list[str], verb: str) -> list[Job]:
    jobs = resolve_all(session, labels)
    for job in jobs:
        check_may_act(caller, job.uid, job.user, verb, job.label)
    return jobs


def cancel(daemon: NodeView, caller: Caller, request: messages.Cancel) -> messages.Report:
    """Pending jobs end at once; running ones are stopped by the daemon (SIGTERM, then
    SIGKILL after the kill wait) and end CANCELLED once they have exited."""
    if (
        not request.labels
        and request.state is None
        and request.name is None
        and request.user is None
    ):
        raise UserError("nothing to cancel: give job ids or --state/--name/--user")
    wanted = JobState.parse(request.state) if request.state else None
    if wanted is not None and wanted.terminal:
        raise UserError(f"--state {request.state}: only PENDING or RUNNING jobs can be cancelled")
    if request.user is not None and request.user != caller.name and not caller.operator:
        raise Refused(
            f"only an operator may cancel {request.user}'s jobs; {caller.name} is not one"
        )
    with daemon.db.write() as session:
        named = _named(session, caller, request.labels, "cancel")
        candidates = queries.jobs(
            session,
            ids=[job.id for job in named] if request.labels else None,
            states=[wanted] if wanted else [JobState.PENDING, JobState.RUNNING],
            users=[request.user] if request.user else None,
            names=[request.name] if request.name else None,
            payloads=False,
        )
        if not caller.operator:  # filters alone reach only the caller's own jobs
            candidates = [job for job in candidates if job.uid == caller.uid]
        pending = [job for job in candidates if job.state == JobState.PENDING.value]
        running = [job for job in candidates if job.state == JobState.RUNNING.value]
        cancelled = set(
            transitions.cancel_pending_many(session, [j.id for j in pending], "cancelled by user")
        )
        stopping = set(
            job_updates.request_stop(session, [j.id for j in running], job_updates.CANCEL)
        )
    lines = [Line(f"Cancelled job {job.label}") for job in pending if job.id in cancelled]
    lines += [
        Line(f"Cancelling job {job.label} (running; it ends after SIGTERM)")
        for job in running
        if job.id in stopping
    ]
    lines += _already_ended(request.labels, named)
    daemon.rescan()
    return messages.Report(lines)


def _already_ended(labels: list[str], named: list[Job]) -> list[Line]:
    """A refusal for each named job that had ended, as scancel's "already completed" error
    (the others named are cancelled all the same). An array named by its id is refused
    once, and only when every task of it had ended: its finished tasks are no error while
    others still wait or run, as in Slurm."""
    whole_arrays = {int(label) for label in labels if "_" not in label}
    live_arrays = {
        job.array_job_id
        for job in named
        if job.array_job_id is not None and not JobState(job.state).terminal
    }
    lines, refused_arrays = [], set()
    for job in named:
        if not JobState(job.state).terminal:
            continue
        array = job.array_job_id
        if array is None or array not in whole_arrays:
            lines.append(
                Line(f"job {job.label} already ended ({job.state}); nothing to cancel", REFUSED)
            )
        elif array not in live_arrays and array not in refused_arrays:
            refused_arrays.add(array)
            lines.append(
                Line(
                    f"job {array} already ended (every task of the array); nothing to cancel",
                    REFUSED,
                )
            )
    return lines


def _outcome(jobs: list[Job], done: list[int], success: str, failure: str) -> list[Line]:
    """A line per job: ``success`` where it changed, else ``failure`` (refused)."""
    changed = set(done)
    return [
        Line(success.format(label=job.label))
        if job.id in changed
        else Line(failure.format(label=job.label, state=job.state), REFUSED)
        for job in jobs
    ]


def hold(daemon: NodeView, caller: Caller, request: messages.Hold) -> messages.Report:
    """An operator's hold on another user's job is an admin hold (JobHeldAdmin), which its
    owner cannot release, as in Slurm."""
    with daemon.db.write() as session:
        jobs = _named(session, caller, request.labels, "hold")
        theirs = [job.id for job in jobs if job.uid != caller.uid]
        held = job_updates.set_held(
            session, [job.id for job in jobs if job.uid == caller.uid], True
        )
        held += job_updates.set_held(session, theirs, True, by_operator=True)
    admin = {job.id for job in jobs if job.reason == job_updates.HELD_ADMIN}
    daemon.rescan()
    return messages.Report(
        _outcome(
            jobs,
            held + [j for j in admin if j not in held],
            "Held job {label}",
            "job {label} is {state}; only pending jobs can be held",
        )
    )


def release(daemon: NodeView, caller: Caller, request: messages.Release) -> messages.Report:
    with daemon.db.write() as session:
        jobs = _named(session, caller, request.labels, "release")
        admin = {
            job.id for job in jobs if job.reason == job_updates.HELD_ADMIN and not caller.operator
        }
        pending = [
            job for job in jobs if job.state == JobState.PENDING.value and job.id not in admin
        ]
        released = set(job_updates.set_held(session, [j.id for j in pending if j.held], False))
    lines = []
    for job in jobs:
        if job.id in admin:
            lines.append(
                Line(
                    f"job {job.label} was held by an operator (JobHeldAdmin); only "
                    "an operator may release it",
                    REFUSED,
                )
            )
        elif job.state != JobState.PENDING.value:
            lines.append(
                Line(f"job {job.label} is {job.state}; only pending jobs can be released", REFUSED)
            )
        elif job.id in released:
            lines.append(Line(f"Released job {job.label}"))
        else:
            lines.append(Line(f"Job {job.label} was not held"))
    daemon.rescan()
    return messages.Report(lines)


def requeue(daemon: NodeView, caller: Caller, request: messages.Requeue) -> messages.Report:
    """Running jobs are stopped first and go back to the queue; ended ones run again. By
    ``--state`` (and ``--user``): every such job of the caller's (of that user's: operators)."""
    if not request.labels and request.state is None:
        raise UserError("nothing to requeue: give job ids or --state (FAILED, say)")
    if request.user is not None and request.user != caller.name and not caller.operator:
        raise Refused(
            f"only an operator may requeue {request.user}'s jobs; {caller.name} is not one"
        )
    lines = []
    with daemon.db.write() as session:
        jobs = _named(session, caller, request.labels, "requeue")
        if request.state is not None:
            chosen = queries.jobs(
                session,
                ids=[job.id for job in jobs] if jobs else None,
                states=[JobState.parse(request.state)],
                users=[request.user or caller.name],
            )
            jobs = [job for job in chosen if caller.operator or job.uid == caller.uid]
            if not jobs:
                raise UserError(
                    f"no {request.state} job of {request.user or caller.name}'s to requeue"
                )
        for job in [job for job in jobs if job.interactive]:
            lines.append(
                Line(
                    f"job {job.label} ran on its submitter's terminal (gq run "
                    "--pty), which no later run could have; run it again with gq "
                    "run --pty",
                    REFUSED,
                )
            )
        jobs = [job for job in jobs if not job.interactive]
        running = [job for job in jobs if job.state == JobState.RUNNING.value]
        stopping = set(
            job_updates.request_stop(session, [j.id for j in running], job_updates.REQUEUE)
        )
        for job in jobs:
            state = JobState(job.state)
            if job.id in stopping:
                lines.append(
                    Line(f"Requeueing job {job.label} (running; it restarts after it stops)")
                )
            elif state.terminal and not job.spool_path:
                lines.append(
                    Line(
                        f"job {job.label}'s script was dropped from the spool to "
                        "make room for newer ones (the daemon's --max-spool); "
                        "submit the script again",
                        REFUSED,
                    )
                )
            elif state.terminal and transitions.requeue_finished(session, job):
                lines.append(Line(f"Requeued job {job.label}"))
            else:
                lines.append(Line(f"job {job.label} is {job.state}; nothing to requeue", REFUSED))
    daemon.rescan()
    return messages.Report(lines)


def suspend(daemon: NodeView, caller: Caller, request: messages.Suspend) -> messages.Report:
    """Running jobs are stopped in place (they hold no lane, their time limit stops, their
    device memory goes to host memory where it can: gq.exec.host.memory_moves), or go on again;
    their hosts are told by the next scheduling pass."""
    verb = "suspend" if request.suspended else "resume"
    with daemon.db.write() as session:
        jobs = _named(session, caller, request.labels, verb)
        changed = job_updates.set_suspended(session, [job.id for job in jobs], request.suspended)
    daemon.rescan()
    done = "Suspended job {label}" if request.suspended else "Resumed job {label}"
    failure = (
        "job {label} is {state}; only a running job can be suspended"
        if request.suspended
        else "job {label} is not suspended; nothing to resume"
    )
    return messages.Report(_outcome(jobs, changed, done, failure))


def signal_job(daemon: NodeView, caller: Caller, request: messages.SignalJob) -> messages.Report:
    """A running job's main process group gets the signal (its owner's or an operator's)."""
    signum = messages.SIGNALS_TO_JOBS.get(request.signal)
    if signum is None:
        raise UserError(
            f"cannot send SIG{request.signal} to a job; give one of "
            + ", ".join(messages.SIGNALS_TO_JOBS)
        )
    with daemon.db.write() as session:
        job = _named(session, caller, [request.label], "signal")[0]
    if not daemon.signal_job(job.id, signum):
        raise UserError(f"job {job.label} is {job.state}; only a running job can be signalled")
    return messages.Report([Line(f"Sent SIG{request.signal} to job {job.label}")])


def update(daemon: NodeView, caller: Caller, request: messages.Update) -> messages.Report:
    """Priority and time limit of pending or running jobs; name, begin time, arguments,
    working directory, output paths and dependency of pending ones (the script snapshot
    stays, as pueue edit keeps it). Only operators raise a limit or a priority (a user may
    lower their own): a job backfilled on a short limit keeps the promise it was admitted on."""
    edits = [key for key in _PENDING_ONLY if getattr(request, key) is not None]
    if request.priority is None and request.time_limit is None and not edits:
        raise UserError(
            "nothing to update: give --priority, --time, --name, --begin, --args, "
            "--chdir, --output, --error or --dependency"
        )
    if request.name is not None:
        validation.job_name(request.name)
    if request.workdir is not None and not request.workdir.startswith("/"):
        raise UserError("the working directory must be an absolute path")
    dependency = _dependency(request.dependency)
    with daemon.db.write() as session:
        jobs = _named(session, caller, request.labels, "update")
        for job in jobs:
            if request.priority is not None:
                check_may_raise(
                    daemon.rules, caller, "--priority", request.priority, job.priority, job.label
                )
            if request.time_limit is not None:
                check_may_raise(
                    daemon.rules, caller, "--time", request.time_limit, job.time_limit, job.label
                )
        if dependency:
            check_dependency(session, dependency)
            named = {job.id for job in jobs} | {job.array_job_id for job in jobs}
            if set(dependencies.parse(dependency).job_ids) & named:
                raise UserError("a job cannot depend on itself (nor an array's task on its array)")
        if request.args is not None:
            _check_whole_payloads(session, jobs)
        changed = set(
            job_updates.modify(
                session,
                [job.id for job in jobs],
                name=request.name,
                priority=request.priority,
                time_limit=request.time_limit,
                begin=request.begin,
                dependency=dependency,
                workdir=request.workdir,
                pending_only=bool(edits),
            )
        )
        pending = [job for job in jobs if job.id in changed]
        if request.args is not None:
            _set_args(session, pending, list(request.args))
        if request.output is not None or request.error is not None or request.workdir is not None:
            _set_outputs(session, pending, request)
    failure = (
        "job {label} is {state}; only a pending job can have its "
        f"{', '.join(_PENDING_ONLY[key] for key in edits)} changed"
        if edits
        else "job {label} is {state}; only pending or running jobs can be updated"
    )
    daemon.rescan()
    return messages.Report(_outcome(jobs, list(changed), "Updated job {label}", failure))


_PENDING_ONLY = {
    "name": "name",
    "begin": "begin time",
    "args": "arguments",
    "workdir": "working directory",
    "output": "output",
    "error": "error output",
    "dependency": "dependency",
}


def _dependency(text: str | None) -> str | None:
    """The new dependency in sbatch's spelling; "" to remove it; None: unchanged."""
    if text is None:
        return None
    return str(dependencies.parse(text)) if text.strip() else ""


def _check_whole_payloads(session: Transaction, jobs: list[Job]) -> None:
    """New arguments go to every job that shares them (an array's tasks), all pending, or
    to none: a task that runs, or will run again, must not take arguments it was told it
    kept."""
    named = {job.id for job in jobs}
    for payload_id in {job.payload_id for job in jobs}:
        label = next(job.label for job in jobs if job.payload_id == payload_id)
        sharing = lookups.payload_jobs(session, payload_id)
        if not {job_id for job_id, _ in sharing} <= named:
            raise UserError(
                f"job {label} shares its arguments with the rest of its array; "
                "give the array's id to update them all"
            )
        if len(sharing) > 1 and any(state != JobState.PENDING.value for _, state in sharing):
            raise UserError(
                f"job {label}'s arguments are shared with tasks that are not "
                "pending; they can change only while every task is pending"
            )


def _set_args(session: Transaction, jobs: list[Job], args: list[str]) -> None:
    for payload_id in {job.payload_id for job in jobs}:
        validation.payload(lookups.payload(session, payload_id).env, args)
        job_updates.set_args(session, payload_id, args)


def _set_outputs(session: Transaction, jobs: list[Job], request: messages.Update) -> None:
    """Output paths filled in again for each job, as at submit (%j, %x, %A_%a, ...): from
    new patterns, or the old ones in a new working directory."""
    for flag, value in (("--output", request.output), ("--error", request.error)):
        if value is not None:
            validation.text(value, f"{flag} {value[:60]!r}", defaults.MAX_PATH)
    paths = {}
    for job in jobs:
        # The name and directory as this very update leaves them (the rows were read before).
        resolve = output_resolver(
            request.name or job.name, job.user, request.workdir or job.workdir
        )
        output = request.output or job.output_pattern
        separate = job.error_pattern is not None and job.error_pattern != job.output_pattern
        error = request.error or (
            job.error_pattern if separate or request.output is None else output
        )
        if output is None or error is None:  # a job from before patterns were kept
            continue
        paths[job.id] = (
            output,
            error,
            resolve(output, job.id, job.array_job_id, job.array_task_id),
            resolve(error, job.id, job.array_job_id, job.array_task_id),
        )
    job_updates.set_outputs(session, paths)
