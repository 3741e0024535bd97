"""What runs when jobs change state: a job's ``--notify CMD``, the daemon's ``--on-finish
CMD`` (both once the job has ended) and sbatch's ``--mail-type``/``--mail-user`` (through the
node's ``mail``), each run as the job's owner, with what happened in ``GQ_*`` variables,
for at most ``defaults.HOOK_TIMEOUT`` seconds, a bounded number at once.

The job events are the outbox: each pass reads the events after the last one it handled
(kept in the queue's settings, so a restarted daemon neither repeats nor skips any), so
every way a job ends (its process exits, a cancel while pending, a deadline, a dependency
never met) is seen in one place. A hook that fails is logged; it never changes the job.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections import deque
from dataclasses import dataclass

from sqlalchemy import bindparam, func, or_, select

from gq import defaults
from gq.daemon.supervision.launch_specs import account
from gq.errors import LaunchError
from gq.exec.host.messages import LaunchSpec
from gq.exec.host.process_groups import kill_group
from gq.exec.host.spawn import JobProcess, start_as_submitter
from gq.home import Home
from gq.queue import lookups
from gq.queue import settings as queue_settings
from gq.queue.engine import Database
from gq.queue.models import Job, JobEvent
from gq.queue.prepared import Prepared
from gq.queue.states import JobState

log = logging.getLogger("gq.daemon")
_NEWEST_EVENT = Prepared(select(func.max(JobEvent.id)))
FAILURES = frozenset({JobState.FAILED.value, JobState.TIMEOUT.value, JobState.DEADLINE.value})
MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL")
SBATCH_ONLY_MAIL_TYPES = (
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
)
_MAIL = 'printf "%s\\n" "$GQ_MAIL_BODY" | "$GQ_MAIL_PROGRAM" -s "$GQ_MAIL_SUBJECT" "$GQ_MAIL_USER"'


@dataclass(frozen=True)
class Hook:
    job_id: int
    what: str  # for the log: "--notify", "--on-finish", "mail"
    spec: LaunchSpec


@dataclass
class Running:
    hook: Hook
    process: JobProcess
    deadline: float


def mail_events(mail_type: str | None, old: str | None, new: str) -> bool:
    """Whether a change from ``old`` to ``new`` is one the job asked mail for."""
    wanted = set((mail_type or "NONE").split(","))
    if "ALL" in wanted:
        wanted |= {"BEGIN", "END", "FAIL", "REQUEUE"}
    terminal = JobState(new).terminal
    return (
        ("BEGIN" in wanted and new == JobState.RUNNING.value)
        or ("END" in wanted and terminal)
        or ("FAIL" in wanted and new in FAILURES)
        or ("REQUEUE" in wanted and old == JobState.RUNNING.value and new == JobState.PENDING.value)
    )


class Notifier:
    def __init__(self, db: Database, home: Home, on_finish: str | None):
        self.db = db
        self.home = home
        self.on_finish = on_finish
        self.mail = shutil.which("mail")
        self.queued: deque[Hook] = deque()
        self.queued_by_user: dict[str, int] = {}
        self.running: list[Running] = []
        self.last_event: int | None = None
        self.writes_seen = -1  # the queue's write count at the last look
        self.next_look = 0.0  # monotonic: no look before (many passes a second may run)
        self.saved: int | None = None  # the position last written to the queue
        self.next_save = 0.0  # monotonic: the position is written again no sooner
        self._events = self._events_worth_reading()  # read each pass: constructed once

    def look(self) -> None:
        """Queue the hooks of the events since the last look, and start what may start.
        Only the events that can set a hook off are read (most jobs have none), and the
        position is written to the queue only when hooks were queued: a restarted daemon
        that reads a stretch again finds no hook in it."""
        now = time.monotonic()
        if (
            self.db.writes == self.writes_seen or now < self.next_look
        ) and self.last_event is not None:
            self.tend()  # no transaction since the last look (no new event), or too soon
            return
        self.next_look = now + defaults.HOOK_LOOK_PERIOD
        self.writes_seen = self.db.writes
        with self.db.read() as session:
            newest = _NEWEST_EVENT.scalar(session) or 0
            if self.last_event is None:
                self.last_event = self.saved = queue_settings.get(session, queue_settings.NOTIFIED)
                if self.last_event is None:  # a new queue, or one from before: from now on
                    self.last_event = newest
            if newest <= self.last_event:
                self.tend()
                return
            rows = session.execute(self._events, {"after": self.last_event, "newest": newest}).all()
            for event, job in rows:
                for hook in self._hooks(session, event, job):
                    mine = self.queued_by_user.get(job.user, 0)
                    if mine >= defaults.MAX_QUEUED_HOOKS_PER_USER:
                        log.warning(
                            "job %d: %s not run: %d hooks of %s's wait already",
                            job.id,
                            hook.what,
                            mine,
                            job.user,
                        )
                        continue
                    self.queued.append(hook)
                    self.queued_by_user[job.user] = mine + 1
        self.last_event = rows[-1][0].id if len(rows) == defaults.HOOK_EVENTS_PER_PASS else newest
        if rows or now >= self.next_save:
            self.save_position()
        self.tend()

    def close(self) -> None:
        """At stop: move the position over the events since the last look that set no hook
        off, up to the first that would (its hooks are the next daemon's to run), and write
        it."""
        if self.last_event is None:
            return
        with self.db.read() as session:
            newest = _NEWEST_EVENT.scalar(session) or 0
            first = session.execute(
                self._events, {"after": self.last_event, "newest": newest}
            ).first()
        self.last_event = first[0].id - 1 if first is not None else max(newest, self.last_event)
        self.save_position()

    def save_position(self) -> None:
        """Write how far the events have been read: at once when hooks were queued (so that
        a restarted daemon does not run them again), else at most every
        ``defaults.HOOK_SAVE_PERIOD`` and when the daemon stops (so that one restarted with
        another --on-finish does not take a stretch read under this one for unread)."""
        if self.last_event is None or self.last_event == self.saved:
            return
        with self.db.write() as session:
            queue_settings.put(session, queue_settings.NOTIFIED, self.last_event)
        self.saved = self.last_event
        self.next_save = time.monotonic() + defaults.HOOK_SAVE_PERIOD

    def _events_worth_reading(self):
        """The events after one and up to another that may set off a hook: of jobs that
        asked for one, or any job's end when the daemon has --on-finish."""
        wanted = or_(Job.notify.is_not(None), Job.mail_type.is_not(None))
        if self.on_finish:
            terminal = [state.value for state in JobState if state.terminal]
            wanted = or_(wanted, JobEvent.new_state.in_(terminal))
        return (
            select(JobEvent, Job)
            .join(Job, Job.id == JobEvent.job_id)
            .where(JobEvent.id > bindparam("after"), JobEvent.id <= bindparam("newest"), wanted)
            .order_by(JobEvent.id)
            .limit(defaults.HOOK_EVENTS_PER_PASS)
        )

    def tend(self) -> None:
        """Collect hooks that ended, kill those past their time, start queued ones: at most
        ``defaults.MAX_RUNNING_HOOKS`` at once, and of those at most
        ``defaults.MAX_RUNNING_HOOKS_PER_USER`` of one user's, taken in turn."""
        now = time.monotonic()
        for running in list(self.running):
            status = running.process.poll()
            if status is None and now < running.deadline:
                continue
            if status is None:
                kill_group(running.process.pid, signal.SIGKILL)
                running.process.wait(1.0)
                log.warning(
                    "job %d: its %s hook ran past %g s; killed",
                    running.hook.job_id,
                    running.hook.what,
                    defaults.HOOK_TIMEOUT,
                )
            running.process.read_setup()  # closes its set-up pipe, whatever the outcome
            if status not in (None, 0):
                why = running.process.setup_failure or f"exit status {status}"
                log.warning(
                    "job %d: its %s hook failed (%s)", running.hook.job_id, running.hook.what, why
                )
            self.running.remove(running)
        busy: dict[str, int] = {}
        for running in self.running:
            busy[running.hook.spec.user] = busy.get(running.hook.spec.user, 0) + 1
        waiting: deque[Hook] = deque()
        while self.queued and len(self.running) < defaults.MAX_RUNNING_HOOKS:
            hook = self.queued.popleft()
            user = hook.spec.user
            if busy.get(user, 0) >= defaults.MAX_RUNNING_HOOKS_PER_USER:
                waiting.append(hook)  # its user's turn comes again when one of theirs ends
                continue
            self.queued_by_user[user] -= 1
            try:
                process = start_as_submitter(hook.spec, dict(hook.spec.env), {})
            except LaunchError as exc:
                log.warning("job %d: cannot run its %s hook: %s", hook.job_id, hook.what, exc)
                continue
            busy[user] = busy.get(user, 0) + 1
            self.running.append(Running(hook, process, now + defaults.HOOK_TIMEOUT))
        self.queued.extendleft(reversed(waiting))

    def _hooks(self, session, event: JobEvent, job: Job) -> list[Hook]:
        """The hooks one state change sets off."""
        hooks = []
        ended = JobState(event.new_state).terminal
        if ended and job.notify:
            hooks.append(("--notify", job.notify))
        if ended and self.on_finish:
            hooks.append(("--on-finish", self.on_finish))
        if job.mail_type and mail_events(job.mail_type, event.old_state, event.new_state):
            if self.mail is None:
                log.warning("job %d: no mail command on this node; its mail is not sent", job.id)
            else:
                hooks.append(("mail", _MAIL))
        if not hooks:
            return []
        identity: dict[str, str] = {}
        groups: list[int] = []
        if self.home.system:
            try:
                identity, groups = account(job)
            except ValueError as exc:
                log.warning("job %d: its hooks are not run: %s", job.id, exc)
                return []
        env = {**self._environment(session, job, event), **identity}
        return [
            Hook(job.id, what, self._spec(job, command, env, groups)) for what, command in hooks
        ]

    def _environment(self, session, job: Job, event: JobEvent) -> dict[str, str]:
        env = {
            key: value
            for key, value in lookups.payload(session, job.payload_id).env.items()
            if key == "PATH" or key.startswith("LANG") or key.startswith("LC_")
        }
        ran = (job.end_time or event.time) - job.start_time if job.start_time else 0.0
        state = event.new_state
        env.update(
            GQ_JOB_ID=str(job.id),
            GQ_JOB_NAME=job.name,
            GQ_JOB_STATE=state,
            GQ_JOB_USER=job.user,
            GQ_JOB_EXIT_CODE=""
            if job.exit_code is None or not JobState(state).terminal
            else str(job.exit_code),
            GQ_JOB_RUN_TIME=f"{max(0.0, ran):.0f}",
            GQ_JOB_OUTPUT=job.stdout_path,
            GQ_JOB_ERROR=job.stderr_path,
            GQ_MAIL_PROGRAM=self.mail or "mail",
            GQ_MAIL_USER=job.mail_user or job.user,
            GQ_MAIL_SUBJECT=f"gq job {job.label} ({job.name}) {state}",
            GQ_MAIL_BODY=(
                f"gq job {job.label} ({job.name}) of {job.user}: {state}"
                f"{'' if job.exit_code is None else f', exit code {job.exit_code}'}"
                f", run time {max(0.0, ran):.0f} s; output {job.stdout_path}"
            ),
        )
        env.setdefault("PATH", os.defpath)
        return env

    def _spec(self, job: Job, command: str, env: dict[str, str], groups: list[int]) -> LaunchSpec:
        return LaunchSpec(
            id=job.id,
            run=max(1, job.run_count),
            argv=["/bin/sh", "-c", command],
            worker=False,
            cwd=job.workdir if os.path.isabs(job.workdir) else "/",
            env=env,
            stdout="/dev/null",
            stderr="/dev/null",
            user=job.user,
            submit_time=job.submit_time,
            uid=job.uid,
            gid=job.gid,
            groups=groups,
            umask=job.umask,
        )
