"""The progress execution hosts report for their jobs (steps, memory figures, whether a job
holds its lane): taken in as it comes and kept on the running job, and written to the queue
about once a second, all jobs' in one transaction (:meth:`ProgressReports.flush`), not at
every report; the lane time they attained meanwhile is charged to their owners' fair-share
usage in the same transaction (:mod:`gq.daemon.scheduling.fair_share`), and each host is told its
residents' owners' usage again.

:class:`ProgressReports` is a part of :class:`gq.daemon.supervision.supervisor.Supervisor`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gq.codec import MessageError, checked
from gq.daemon.scheduling import admission
from gq.daemon.scheduling.fair_share import Ledger
from gq.daemon.supervision.running import Running
from gq.exec.host import messages as wire
from gq.queue import job_updates
from gq.queue.engine import Database

log = logging.getLogger("gq.daemon")


class ProgressReports:
    """The supervisor's handling of progress reports."""

    # What it uses of the rest of the supervisor (supervisor.py, probes.py)
    db: Database
    running: dict[int, Running]
    progress: dict[int, wire.JobProgress]
    switches: dict[str, int]
    packing: dict[str, wire.PackingReport]
    ledger: Ledger
    shared: dict[str, dict[str, float]]  # what each host was last told of its users' usage
    send: Callable[[str, object], None]
    hosts: dict
    _plausible_footprint: Callable[[Running, wire.JobProgress], admission.Footprint]
    _check_figure: Callable[[Running, int], None]

    def _on_progress(self, name: str, message: wire.Progress) -> None:
        received = time.time()  # one moment for the whole report: its jobs' progress agrees
        for item in message.jobs:
            job = self.running.get(item.job)
            if job is None or item.run != job.run:
                continue
            progress = self.progress[job.job_id] = item
            job.note_use(progress.attained, received)  # (an idle resident gives its slot back)
            job.latest, job.latest_at = progress, received
            job.holds_lane = progress.holds_lane
            if job.iterating_since is None and (progress.holds_lane or progress.attained):
                job.iterating_since = time.time()
            if progress.mem_persistent is not None:
                job.measured = self._plausible_footprint(job, progress)
                self._check_figure(job, item.iterations)
        if message.switches:
            self.switches[name] = sum(message.switches)
        if message.packing is not None:
            self.packing[name] = message.packing

    def flush(self) -> None:
        """Write the latest progress of running jobs to the queue (about once a second),
        their owners charged what they attained meanwhile; then tell the hosts."""
        updates = {k: v for k, v in self.progress.items() if k in self.running}
        self.progress.clear()
        now = time.time()
        try:
            if updates:
                with self.db.write() as session:
                    for job_id, progress in updates.items():
                        self._record(session, job_id, progress, now)
                    self.ledger.save(session)
        except Exception:  # noqa: BLE001 - find the one that fails; keep the others
            log.exception("cannot record progress together; recording job by job")
            for job_id, progress in updates.items():
                try:
                    with self.db.write() as session:
                        self._record(session, job_id, progress, now)
                        self.ledger.save(session)
                except Exception:  # noqa: BLE001
                    log.exception("cannot record job %d's progress %r; dropped", job_id, progress)
        self.share_out(now)

    def _record(self, session, job_id: int, progress: wire.JobProgress, now: float) -> None:
        job_updates.record_progress(session, job_id, progress)
        job = self.running[job_id]
        self.ledger.charge(job.user, job.charged, wire.charged(progress), now)

    def share_out(self, now: float) -> None:
        """Tell each host its residents' owners' usage beside them, where it has changed
        (by a millisecond of lane time or more)."""
        for name, host in self.hosts.items():
            runs = [(job.user, job.charged) for job in self.running.values() if job.host == name]
            if not runs or not host.current:
                continue
            shares = self.ledger.beside(runs, now)
            told = self.shared.get(name)
            if (
                told is not None
                and told.keys() == shares.keys()
                and all(abs(told[user] - value) < 1e-3 for user, value in shares.items())
            ):
                continue
            try:
                message = checked(wire.Shares(shares))
            except MessageError as exc:  # (more users than a message names: none told)
                log.warning("cannot tell %s its users' fair-share usage: %s", name, exc)
                continue
            self.shared[name] = shares
            self.send(name, message)
