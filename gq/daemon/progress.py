"""The progress execution hosts report for their jobs (steps, memory figures, whether a job
holds its lane): taken in as it comes and kept on the running job, and written to the queue
about once a second, all jobs' in one transaction (:meth:`ProgressReports.flush`), not at
every report.

:class:`ProgressReports` is a part of :class:`gq.daemon.supervision.Supervisor`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gq.daemon import admission
from gq.daemon.running import Running
from gq.exec import host_messages as wire
from gq.queue import job_updates
from gq.queue.engine import Database

log = logging.getLogger("gq.daemon")


class ProgressReports:
    """The supervisor's handling of progress reports."""

    # What it uses of the rest of the supervisor (see gq.daemon.supervision, gq.daemon.probes)
    db: Database
    running: dict[int, Running]
    progress: dict[int, wire.JobProgress]
    switches: dict[str, int]
    _plausible_footprint: Callable[[Running, wire.JobProgress], admission.Footprint]
    _check_figure: Callable[[Running, int], None]

    def _on_progress(self, name: str, message: wire.Progress) -> None:
        received = time.time()  # one moment for the whole report: its jobs' progress agrees
        for item in message.jobs:
            job = self.running.get(item.job)
            if job is None or item.run != job.run:
                continue
            progress = self.progress[job.job_id] = item
            job.latest, job.latest_at = progress, received
            job.holds_lane = progress.holds_lane
            if job.iterating_since is None and (progress.holds_lane or progress.attained):
                job.iterating_since = time.time()
            if progress.mem_persistent is not None:
                job.measured = self._plausible_footprint(job, progress)
                self._check_figure(job, item.iterations)
        if message.switches:
            self.switches[name] = sum(message.switches)

    def flush(self) -> None:
        """Write the latest progress of running jobs to the queue (about once a second)."""
        updates = {k: v for k, v in self.progress.items() if k in self.running}
        self.progress.clear()
        if not updates:
            return
        try:
            with self.db.write() as session:
                for job_id, progress in updates.items():
                    job_updates.record_progress(session, job_id, progress)
        except Exception:  # noqa: BLE001 - find the one that fails; keep the others
            log.exception("cannot record progress together; recording job by job")
            for job_id, progress in updates.items():
                try:
                    with self.db.write() as session:
                        job_updates.record_progress(session, job_id, progress)
                except Exception:  # noqa: BLE001
                    log.exception("cannot record job %d's progress %r; dropped", job_id, progress)
