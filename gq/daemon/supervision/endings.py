"""How a run ends: what a host's exit report means for its job (:func:`_ending`: why it was
stopped, if it was, else its exit status), a run that ran out of memory (requeued with its
figure raised, or failed: see :mod:`gq.daemon.supervision.memory_figures`), and recording
runs' ends in the queue, several in one transaction, before the host is told to forget them.

:class:`Endings` is a part of :class:`gq.daemon.supervision.supervisor.Supervisor`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gq import messages
from gq.daemon.devices import Device, context_memory
from gq.daemon.scheduling import admission
from gq.daemon.scheduling.fair_share import Ledger
from gq.daemon.supervision import memory_figures
from gq.daemon.supervision.host_handles import HostSettings
from gq.daemon.supervision.running import Running
from gq.exec.host import messages as wire
from gq.exec.host.messages import JobProgress, StopWhy
from gq.queue import job_updates, lookups, transitions
from gq.queue.engine import Database
from gq.queue.states import JobState
from gq.units import format_duration

if TYPE_CHECKING:  # prometheus-client is an extra: the exporter is imported where asked for
    from gq.daemon.monitoring.metrics import Metrics

log = logging.getLogger("gq.daemon")
_SIGNALS = {s.value for s in signal.Signals}


@dataclass(frozen=True)
class RanOut:
    """A run that ran out of memory: what it held and asked for (None: unknown), what its
    lane had free beside its neighbours, what the largest lane of an empty device offers."""

    held: int
    wanted: int | None
    free: int
    largest: int


@dataclass(frozen=True)
class Ending:
    """How a run ends in the queue."""

    state: JobState
    exit_code: int | None
    reason: str | None
    requeue: bool = False  # back to the queue, PENDING
    counted: bool = True  # False: a run that ran no iteration, not counted among its runs
    ran_out: RanOut | None = None  # it ran out of memory: the verdict is made as recorded


def _ending(job: Running, report: wire.Exited) -> Ending:
    """What a host's exit report means for the job: why it was stopped, if it was; else its
    exit status."""
    code, signum = report.code, report.signal
    exit_code = code if signum is None else 128 + signum
    why = report.kill_why or job.kill_why
    if why is StopWhy.PROTOCOL:
        return Ending(JobState.FAILED, exit_code, f"protocol error: {report.detail}")
    if why is StopWhy.LAUNCH:
        return Ending(JobState.FAILED, None, report.detail or "its process could not be started")
    if why is StopWhy.CANCEL:
        return Ending(JobState.CANCELLED, exit_code, "cancelled by user")
    if why is StopWhy.TIMEOUT:
        return Ending(
            JobState.TIMEOUT, exit_code, f"time limit {format_duration(job.time_limit)} reached"
        )
    if why is StopWhy.DEADLINE:
        return Ending(JobState.DEADLINE, exit_code, "deadline reached")
    if why is StopWhy.IDLE:  # as Jupyter's culler ends an idle kernel
        return Ending(
            JobState.TIMEOUT,
            exit_code,
            f"idle timeout: {report.detail or 'no activity for its --idle-timeout'}",
        )
    if why is StopWhy.REQUEUE:
        return Ending(JobState.PENDING, exit_code, "requeued by user", requeue=True)
    if why is StopWhy.YIELD:
        idle = format_duration(job.yielded) if job.yielded is not None else "--idle-resident"
        return Ending(
            JobState.PENDING,
            exit_code,
            f"gave its slot back to a waiting job: its lane idle for {idle} (--idle-resident)",
            requeue=True,
        )
    if why is StopWhy.MOVE:
        return Ending(
            JobState.PENDING,
            exit_code,
            "moved: another device starts it sooner",
            requeue=True,
            counted=False,
        )
    if why is StopWhy.RESTORE:
        return Ending(JobState.FAILED, exit_code, report.detail or "its device memory was lost")
    if why is StopWhy.HOST_MEMORY:
        return Ending(JobState.FAILED, exit_code, report.detail or "over its --host-mem")
    if why is StopWhy.HANGUP:  # as a login shell's end when its terminal closes
        return Ending(
            JobState.FAILED, exit_code, f"hung up: {report.detail or 'its terminal was closed'}"
        )
    if why is StopWhy.SHUTDOWN:
        return Ending(JobState.FAILED, exit_code, "daemon stopped", requeue=job.requeue)
    if signum is not None:
        name = signal.Signals(signum).name if signum in _SIGNALS else str(signum)
        return Ending(JobState.FAILED, exit_code, f"killed by signal {name}")
    if code == 0:
        return Ending(JobState.COMPLETED, 0, None)
    return Ending(JobState.FAILED, code, f"exit code {code}")


class Endings:
    """The supervisor's recording of runs' ends."""

    # What it uses of the rest of the supervisor (supervisor.py, probes.py)
    db: Database
    devices: list[Device]
    settings: HostSettings
    running: dict[int, Running]
    progress: dict[int, JobProgress]
    metrics: Callable[[], Metrics | None]
    wake: Callable[[], None]
    send: Callable[[str, object], None]
    _this_run: Callable[[wire.Exited], Running | None]
    _lane_memory: Callable[[Running], int]
    ledger: Ledger

    def _reported_end(
        self, job: Running, report: wire.Exited
    ) -> tuple[Running, Ending, float | None, JobProgress]:
        """A run's end as its host reported it, as :meth:`_record_ends` takes it: a run that
        ran out of memory with what its lane had free beside its neighbours."""
        ending = _ending(job, report)
        shortage = report.shortage
        why = report.kill_why or job.kill_why
        if (
            shortage is not None
            and (report.code or report.signal)
            and why in (None, StopWhy.MEMORY)
        ):
            # What a job could get at most: a lane of an empty device of the kind and
            # model it runs on (its words are believed no further).
            largest = (
                max(
                    d.memory_total
                    for d in self.devices
                    if (d.whole, d.model) == (job.devices[0].whole, job.devices[0].model)
                )
                // self.settings.lanes
            )
            ending = Ending(
                JobState.FAILED,
                ending.exit_code,
                None,
                ran_out=RanOut(
                    min(shortage.held, largest + 1),
                    None if shortage.wanted is None else min(shortage.wanted, largest + 1),
                    self.free_beside(job),
                    largest,
                ),
            )
        return job, ending, report.end_time or None, report

    def free_beside(self, job: Running, extra: admission.Footprint | None = None) -> int:
        """What the job's lane had free beside the other jobs there (and ``extra``, counted
        as the lane counts a job, its context included): not those whose
        memory is in host memory and not yet told to come back (resumed jobs come back
        one by one, each counting those told before it), a probed one as its whole lane."""
        lane = admission.LaneLoad(
            self._lane_memory(job), overhead=max(map(context_memory, job.devices))
        )
        names = {d.name for d in job.devices}
        lane.footprints = [
            admission.Footprint(lane.capacity) if other.probing else other.footprint_now()
            for other in self.running.values()
            if other is not job
            and not (other.memory_moved_out and other.suspended)
            and other.lane == job.lane
            and names & {d.name for d in other.devices}
        ]
        return lane.headroom(extra)

    def _on_exit(self, name: str, report: wire.Exited) -> None:
        """Record how a run ended (why it was killed, if it was), then acknowledge it so
        the host forgets it; a report about a run already recorded is only acknowledged.
        A report that cannot be recorded fails its job instead; only when even that fails
        is it kept unacknowledged (the host repeats it to the next daemon)."""
        job = self._this_run(report)
        if job is not None:
            try:
                self._record_ends([self._reported_end(job, report)])
            except Exception:  # noqa: BLE001 - recorded as a failure below
                log.exception(
                    "cannot record the exit of job %d (run %d): %r", job.job_id, job.run, report
                )
                self.progress.pop(job.job_id, None)
                self.end(
                    job,
                    None,
                    JobState.FAILED,
                    "its exit could not be recorded; see the daemon's log",
                )
        self.send(name, wire.Ack(report.job, report.run))

    def _on_exits(self, name: str, reports: list[wire.Exited]) -> None:
        """Several exits in one transaction, acknowledged once it has committed."""
        self._record_ends(
            [
                self._reported_end(job, report)
                for report in reports
                if (job := self._this_run(report)) is not None
            ]
        )
        for report in reports:
            self.send(name, wire.Ack(report.job, report.run))

    def end(
        self,
        job: Running,
        exit_code: int | None,
        state: JobState,
        reason: str | None,
        requeue: bool = False,
        end: float | None = None,
        counted: bool = True,
    ) -> None:
        """Record the run's end: the job's end state, or back to the queue (``requeue``;
        ``counted=False``: a run that ran no iteration, not counted among its runs)."""
        self._record_ends([(job, Ending(state, exit_code, reason, requeue, counted), end, None)])

    def _record_ends(
        self, ends: list[tuple[Running, Ending, float | None, JobProgress | None]]
    ) -> None:
        """Record runs' ends (each with its end time, and its last progress if its exit
        report carried one) in one transaction; forget the runs once it has committed."""
        requeued, verdicts = set(), {}
        now = time.time()
        with self.db.write() as session:
            for job, ending, end, last in ends:
                progress = last or self.progress.get(job.job_id)
                if progress is not None:  # (in this transaction: saved below)
                    self.ledger.charge(job.user, job.charged, wire.charged(progress), now)
                reason = ending.reason
                if ending.ran_out is not None:
                    verdict = verdicts[job.job_id] = self._ran_out(
                        session, job, ending, end, progress
                    )
                    if verdict is not None and verdict.requeue:
                        requeued.add(job.job_id)
                    continue
                if not ending.requeue and ending.state is not JobState.FAILED:
                    transitions.finish(
                        session,
                        job.job_id,
                        ending.state,
                        ending.exit_code,
                        reason,
                        now=end,
                        progress=progress,
                    )
                    continue  # the common case: one statement and its event
                if progress is not None:
                    job_updates.record_progress(session, job.job_id, progress)
                if ending.requeue:
                    transitions.requeue(
                        session,
                        job.job_id,
                        # (an ending that requeues gives a reason: "requeued" is a fallback)
                        (reason or "requeued")
                        if ending.state is JobState.PENDING
                        else f"{reason or 'ended'}; requeued",
                        now=end,
                        started=ending.counted,
                    )
                    requeued.add(job.job_id)
                elif transitions.retry(
                    session, job.job_id, ending.exit_code, f"{reason or 'failed'}; retried", now=end
                ):
                    requeued.add(job.job_id)  # --retries: it had runs left
                else:
                    transitions.finish(
                        session, job.job_id, ending.state, ending.exit_code, reason, now=end
                    )
            self.ledger.save(session)
        metrics = self.metrics()
        for job, ending, end, _ in ends:
            self.running.pop(job.job_id, None)
            self.progress.pop(job.job_id, None)
            again = job.job_id in requeued
            if metrics is not None:
                metrics.run_time.labels("REQUEUED" if again else ending.state.value).observe(
                    max(0.0, (end or time.time()) - job.started)
                )
            verdict = verdicts.get(job.job_id)
            reason = verdict.reason if verdict is not None else ending.reason
            log.info(
                "job %d %s%s",
                job.job_id,
                "requeued" if again else ending.state.value,
                f" ({reason})" if reason else "",
            )
        self.wake()

    def _ran_out(
        self, session, job: Running, ending: Ending, end: float | None, progress: JobProgress | None
    ) -> memory_figures.Verdict | None:
        """Record a run that ran out of memory: back to the queue with its figure raised, or
        FAILED (see memory_figures.py); the verdict (None: the job was no longer
        RUNNING, and nothing changed)."""
        row = lookups.job(session, job.job_id)
        if row is None:
            return None
        ran_out = ending.ran_out
        assert ran_out is not None
        verdict = memory_figures.after_shortage(
            ran_out.held,
            ran_out.wanted,
            row.mem,
            messages.OnOutOfMemory(row.on_oom or messages.OnOutOfMemory.REQUEUE),
            row.ooms or 0,
            row.retries,
            ran_out.free,
            ran_out.largest,
        )
        changed = transitions.ran_out_of_memory(
            session,
            job.job_id,
            verdict.requeue,
            verdict.figure,
            verdict.reason,
            ending.exit_code,
            now=end,
            progress=progress,
        )
        return verdict if changed else None
