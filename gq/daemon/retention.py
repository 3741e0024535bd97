"""Forgetting old jobs: finished jobs, their events, their payloads and their snapshots are
purged once they ended longer ago than the daemon's ``--retention``, a batch at a time, so
that a node that runs for months keeps a queue (and ``gq history``) of bounded size. A
finished job that a pending job still depends on is kept."""

from __future__ import annotations

import logging
import time

from gq import defaults
from gq.errors import UserError
from gq.home import Home
from gq.queue import dependencies, purging, spool
from gq.queue.engine import Database

log = logging.getLogger("gq.daemon")


def purge(
    db: Database,
    home: Home,
    retention: float,
    now: float | None = None,
    batch: int = defaults.PURGE_BATCH,
) -> int:
    """Purge up to ``batch`` jobs that ended before ``now - retention``; how many went."""
    cutoff = (time.time() if now is None else now) - retention
    with db.write() as session:
        candidates = purging.finished_before(session, cutoff, batch)
        if not candidates:
            return 0
        needed: set[int] = set()
        for text in purging.pending_dependencies(session):
            try:
                needed |= dependencies.parse(text).job_ids
            except UserError:  # an old row's: it names no job to keep
                continue
        doomed = [(job_id, path) for job_id, path in candidates if job_id not in needed]
        purging.purge(session, [job_id for job_id, _ in doomed])
        paths = {path for _, path in doomed if path}
        kept = purging.spool_paths_in_use(session, paths)
    spool.discard_snapshots(home, paths - kept)
    if doomed:
        log.info(
            "purged %d job(s) that ended before the retention of %s", len(doomed), _days(retention)
        )
    return len(doomed)


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} days" if seconds >= 86400 else f"{seconds:g} s"
