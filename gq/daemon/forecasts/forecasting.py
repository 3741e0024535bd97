"""Forecasts of the live queue, made off the daemon's loop.

After a scheduling pass, at most once a second (and no sooner than ten times the CPU time the
last one took after it), when the queue or the running jobs' progress changed, the daemon
takes a snapshot of the node (:meth:`gq.daemon.scheduling.scheduler.Scheduler.snapshot`) and
forks a child that runs the simulator on it (:func:`gq.sim.forecast.forecast`) at a low CPU
priority, within a time budget, and sends the result back over a pipe. The loop never
simulates: it reads the pipe when it is ready, as it reads a host's reports, and requests
read the last result. A ``gq submit --test-only`` (:class:`WhatIf`) waits, parked like a
``gq wait``, for the next child, which simulates the queue once as it is and once with the
job added.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import selectors
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gq import defaults, messages
from gq.errors import UserError
from gq.queue import dependencies, lookups, stats
from gq.queue.engine import Database
from gq.queue.scheduling_rows import SchedulingRow
from gq.queue.states import JobState
from gq.sim import forecast, work_estimates

if TYPE_CHECKING:
    from gq.daemon.scheduling.scheduler import Scheduler
    from gq.daemon.serving.server import Connection
    from gq.queue.submissions import NewJob

log = logging.getLogger("gq.daemon")
_READ = 1 << 16


@dataclass
class WhatIf:
    """A ``gq submit --test-only``: the job it would queue (its tasks, with ids below every
    real job's), answered once a forecast with and without it is made."""

    uid: int
    jobs: tuple[forecast.Pending, ...]


@dataclass
class _Child:
    pid: int
    pipe: int
    started: float
    deadline: float  # monotonic: killed after it
    asked: dict[Connection, WhatIf]
    data: bytearray


class Forecaster:
    def __init__(
        self,
        db: Database,
        scheduler: Scheduler,
        selector: selectors.BaseSelector,
        reply: Callable[[Connection, bytes], None],
        alive: Callable[[Connection], bool],
    ):
        self.db = db
        self.scheduler = scheduler
        self.selector = selector
        self.reply = reply  # answers a parked connection
        self.alive = alive  # whether a parked connection's client is still there
        self.current = forecast.Forecasts(0.0)  # the last one made
        self.parked: dict[Connection, WhatIf] = {}
        self.child: _Child | None = None
        self.next_at = 0.0  # monotonic: no forecast before
        self.last_end = -math.inf  # monotonic: when the last child ended
        self.reads_left = defaults.FORECAST_HISTORY_READS  # for the snapshot being made
        self.signature: tuple | None = None  # what the last forecast was made from
        self._past: dict[tuple[str, str], tuple[float, work_estimates.Past | None]] = {}
        self._running: dict[int, tuple[str, str]] = {}  # id -> (user, name), at the last tick
        self._typical: tuple[float, float | None] = (-math.inf, None)  # read at, seconds

    # ----- what handlers use -----------------------------------------------------------
    def check_room(self, uid: int) -> None:
        """Refuse a --test-only beyond what one user, and all, may have waiting."""
        mine = sum(1 for what in self.parked.values() if what.uid == uid)
        if mine >= defaults.MAX_TEST_ONLY_PER_USER or len(self.parked) >= defaults.MAX_TEST_ONLY:
            raise UserError(
                f"uid {uid} (or the node) has as many gq submit --test-only "
                "requests waiting as it may; try again in a few seconds",
                1,
            )

    def what_if(self, new: NewJob, uid: int) -> WhatIf:
        """A --test-only's job (each task of an array) as the next forecast adds it."""
        self.check_room(uid)
        if new.held:
            raise UserError(
                "a held job (--hold) starts only once released; there is no start "
                "to forecast: submit with --test-only but without --hold"
            )
        now = time.time()
        rows = [
            SchedulingRow(
                id=-index,
                user=new.user,
                name=new.name,
                submit_time=now,
                priority=new.priority,
                steps_total=new.steps_total,
                deadline=new.deadline,
                time_limit=new.time_limit,
                dependency=new.dependency,
                reason=None,
                gpus=new.gpus,
                mem=new.mem,
                exclusive=new.exclusive,
                array_job_id=None,
                array_max_running=None,
                stop_request=None,
                held=False,
                begin_time=new.begin_time,
                gpu_type=new.gpu_type,
                host_mem=new.host_mem,
                cpus=new.cpus,
                nodelist=new.nodelist,
                suspended=False,
                preempted=False,
                steps_done=0,
                attained=0.0,
                mean_iteration=None,
                mean_gap=None,
                holds_lane=False,
                interpreter=new.interpreter,
                mem_basis=None,
            )
            for index in range(1, len(new.array_tasks or [None]) + 1)
        ]
        needs, runs = {}, {}
        self.reads_left = max(self.reads_left, 1)  # its own name's runs, whatever is left
        if new.dependency:
            need = dependencies.parse(new.dependency)
            needs = {row.id: need for row in rows}
            with self.db.read() as session:
                runs = {
                    job_id: [(JobState(state), started) for state, started in states]
                    for job_id, states in lookups.run_states(session, need.job_ids).items()
                }
        return WhatIf(
            uid,
            tuple(self.scheduler.forecast_pending(rows, needs, runs, self.history, self.typical())),
        )

    def park(self, connection: Connection, what_if: WhatIf) -> None:
        self.parked[connection] = what_if
        # Answered by the next forecast, as soon as one may be made: a user who asks again
        # and again gets no more forecasts than one a second.
        self.next_at = min(self.next_at, self.last_end + defaults.FORECAST_PERIOD)

    def history(self, user: str, name: str) -> work_estimates.Past | None:
        """The user's recent completed jobs of that name, summarised (kept a while)."""
        now = time.monotonic()
        kept = self._past.get((user, name))
        if kept is not None and now - kept[0] < defaults.FORECAST_HISTORY_TTL:
            return kept[1]
        if self.reads_left <= 0:
            return None  # read for a later forecast: a queue of many names costs little each
        self.reads_left -= 1
        if len(self._past) > 10_000:
            self._past.clear()
        with self.db.read() as session:
            rows = stats.recent_runs(session, user, name, defaults.FORECAST_HISTORY)
        summary = work_estimates.past(
            [
                work_estimates.Ended(end - start, steps, attained, iteration, gap, startup)
                for start, end, steps, attained, iteration, gap, startup in rows
            ]
        )
        self._past[(user, name)] = (now, summary)
        return summary

    def typical(self) -> float | None:
        """The median run of the node's recent completed jobs (kept a while; None: none)."""
        now = time.monotonic()
        if now - self._typical[0] >= defaults.FORECAST_HISTORY_TTL:
            with self.db.read() as session:
                runs = stats.recent_run_times(session, defaults.FORECAST_TYPICAL)
            self._typical = (now, statistics.median(runs) if runs else None)
        return self._typical[1]

    # ----- the loop's side -------------------------------------------------------------
    def tick(self) -> None:
        """After a scheduling pass: start a forecast if one is due; end one that overran."""
        now = time.monotonic()
        for connection in [c for c in self.parked if not self.alive(c)]:
            del self.parked[connection]  # its client went away
        if self.child is not None:
            if now > self.child.deadline:
                log.warning("forecast child %d overran its budget; killed", self.child.pid)
                self._end_child(None)
            return
        if now < self.next_at:
            return
        self._forget_ended()
        self.reads_left = defaults.FORECAST_HISTORY_READS
        snapshot = self.scheduler.snapshot(self.history, self.typical())
        signature = _signature(snapshot)
        if signature == self.signature and not self.parked:
            self.next_at = now + defaults.FORECAST_PERIOD  # looked: not again for a while
            return
        self.signature = signature
        self._start(snapshot, now)

    def _forget_ended(self) -> None:
        """A job that ran has ended since the last look: its owner's estimate for its name
        is read again, with it."""
        last = self.scheduler.last_pass
        running = {row.id: (row.user, row.name) for row in (last.running if last else ())}
        for job_id in self._running.keys() - running.keys():
            self._past.pop(self._running[job_id], None)
        self._running = running

    def receive(self) -> None:
        """The child's pipe is readable: take what it wrote; at its end, the forecast."""
        child = self.child
        assert child is not None
        try:
            chunk = os.read(child.pipe, _READ)
        except BlockingIOError:
            return
        if chunk:
            child.data += chunk
            return
        try:
            made = pickle.loads(bytes(child.data)) if child.data else None
        except Exception:  # noqa: BLE001 - a child that died mid-write sent a torn result
            made = None
        if made is None:
            log.warning("forecast child %d failed; no forecast made this time", child.pid)
        self._end_child(made)

    def close(self) -> None:
        """The daemon stops: a child at work is killed, which is no failure to log."""
        if self.child is not None:
            self._end_child(None)

    # ----- the child -------------------------------------------------------------------
    def _start(self, snapshot: forecast.Snapshot, now: float) -> None:
        asked = dict(self.parked)
        self.parked.clear()
        budget = defaults.FORECAST_BUDGET * (1 + len(asked))
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: simulate, write, leave without running any clean-up
            code = 1
            try:
                os.close(read_end)
                os.nice(defaults.FORECAST_NICE)
                made = _simulate(snapshot, [what.jobs for what in asked.values()])
                with os.fdopen(write_end, "wb") as pipe:
                    pipe.write(pickle.dumps(made, protocol=pickle.HIGHEST_PROTOCOL))
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        os.set_blocking(read_end, False)
        self.child = _Child(pid, read_end, now, now + budget + 1.0, asked, bytearray())
        self.selector.register(read_end, selectors.EVENT_READ, self)

    def _end_child(self, made: tuple | None) -> None:
        """Take the child's result (None: it failed or was killed), collect it, answer the
        --test-only requests it was asked."""
        child = self.child
        assert child is not None
        self.child = None
        self.selector.unregister(child.pipe)
        os.close(child.pipe)
        if made is None:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, _, usage = os.wait4(child.pid, 0)
        self.last_end = time.monotonic()
        # Its cost is the CPU it took, not its wall time: a child that yields the CPUs to
        # the jobs (its nice) takes seconds of wall on a busy node for milliseconds of work,
        # and spacing by those seconds left forecasts stale for tens of seconds.
        cost = usage.ru_utime + usage.ru_stime
        self.next_at = self.last_end + max(
            defaults.FORECAST_PERIOD, defaults.FORECAST_SPACING * cost
        )
        if made is not None:
            self.current, answers = made
            slow = self.current.seconds >= defaults.FORECAST_PERIOD / 4
            log.log(
                logging.INFO if slow or not self.current.complete else logging.DEBUG,
                "forecast of %d jobs made in %.3f s%s",
                len(self.current.jobs),
                self.current.seconds,
                "" if self.current.complete else " (its budget ran out: later jobs are unknown)",
            )
        else:  # (its caller said why, where that is worth a line)
            answers = [None] * len(child.asked)
        for (connection, what), answer in zip(child.asked.items(), answers):
            if self.alive(connection):
                self.reply(connection, messages.encode(_test_only(what, self.current, answer)))


def _simulate(snapshot: forecast.Snapshot, asked: list[tuple[forecast.Pending, ...]]):
    """In the child: the forecast, and each --test-only job's (the queue with it added),
    each simulation within the budget."""

    def budget() -> Callable[[], bool]:
        deadline = time.monotonic() + defaults.FORECAST_BUDGET
        return lambda: time.monotonic() > deadline

    began = time.monotonic()
    base = forecast.forecast(snapshot, budget())
    base.seconds = time.monotonic() - began
    answers = [
        forecast.forecast(replace(snapshot, pending=snapshot.pending + jobs), budget())
        for jobs in asked
    ]
    return base, answers


def _signature(snapshot: forecast.Snapshot) -> tuple:
    """What a forecast depends on that changes: the jobs, their progress, the devices."""
    return (
        snapshot.policy,
        tuple((job.view.id, job.view.steps_done, job.devices) for job in snapshot.running),
        tuple(
            (job.view.id, job.view.priority, job.after, job.begin_time) for job in snapshot.pending
        ),
        tuple((device.name, device.held) for device in snapshot.devices),
        snapshot.packing,  # (how the hosts say their jobs share the devices)
    )


def _test_only(
    what: WhatIf, base: forecast.Forecasts, made: forecast.Forecasts | None
) -> messages.TestOnly | messages.Error:
    """The answer to a --test-only: where and when its job would start and end, and whom
    it would delay."""
    if made is None:
        return messages.Error(
            "no forecast could be made for this job now (see the daemon's log); try again", 1
        )
    ids = [job.view.id for job in what.jobs]
    own = [made.jobs.get(job_id) for job_id in ids]
    known = [(f.start, f) for f in own if f is not None and f.start is not None]
    first = min(known, key=lambda pair: pair[0])[1] if len(known) == len(own) else None
    ends = [f.end for f in own if f is not None and f.end is not None]
    worst = max((f.basis for f in own if f is not None), default=work_estimates.Basis.UNKNOWN)
    delayed = forecast.delays(base, made)
    return messages.TestOnly(
        tasks=len(ids),
        start=first.start if first else None,
        end=max(ends) if first and len(ends) == len(own) else None,
        device=first.device if first else None,
        basis=(worst if first else work_estimates.Basis.UNKNOWN).name.lower(),
        delays=[messages.Delay(job_id, by) for job_id, by in sorted(delayed.items())],
    )
