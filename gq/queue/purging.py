"""Forgetting old jobs (the daemon's --retention): which finished jobs may go, and their
deletion with their events, their runs and the payloads no job uses any more."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import delete, select

from gq.queue.models import Job, Payload
from gq.queue.queries import CHUNK, among, chunks
from gq.queue.spool_usage import count_spool
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.queue.engine import Transaction


def finished_before(session: Transaction, cutoff: float, limit: int) -> Sequence[tuple[int, str]]:
    """Ids and snapshot paths of jobs that ended before ``cutoff``, oldest first."""
    terminal = [s.value for s in JobState if s.terminal]
    return session.execute(
        select(Job.id, Job.spool_path)
        .where(Job.state.in_(terminal), Job.end_time < cutoff)
        .order_by(Job.end_time)
        .limit(limit)
    ).all()


def pending_dependencies(session: Transaction) -> list[str]:
    found = session.scalars(
        select(Job.dependency).where(
            Job.state == JobState.PENDING.value, Job.dependency.is_not(None)
        )
    )
    return [text for text in found if text is not None]


def spool_paths_in_use(session: Transaction, paths: Iterable[str]) -> set[str]:
    wanted = sorted(set(paths))
    used: set[str] = set()
    for start in range(0, len(wanted), CHUNK):
        used.update(
            session.scalars(
                select(Job.spool_path)
                .distinct()
                .where(among(Job.spool_path, wanted[start : start + CHUNK]))
            ).all()
        )
    return used


def purge(session: Transaction, job_ids: list[int]) -> None:
    """Forget finished jobs: their rows, their events and runs (deleted with them: ON DELETE
    CASCADE), and payloads no job uses any more."""
    owners: dict[int, int | None] = {}  # payload -> its submitter's uid
    for part in chunks(job_ids):
        owners.update(
            (payload, uid)
            for payload, uid in session.execute(
                delete(Job)
                .where(among(Job.id, part))
                .returning(Job.payload_id, Job.uid)
                .execution_options(synchronize_session=False)
            )
        )
    freed: dict[int, int] = {}
    for part in chunks(sorted(owners)):
        for payload, size in session.execute(
            delete(Payload)
            .where(
                among(Payload.id, part),
                ~Payload.id.in_(
                    Job.__table__.select()
                    .with_only_columns(Job.payload_id)
                    .where(among(Job.payload_id, part))
                ),
            )
            .returning(Payload.id, Payload.spool_bytes)
            .execution_options(synchronize_session=False)
        ):
            uid = owners[payload]
            if uid is not None:
                freed[uid] = freed.get(uid, 0) - size
    count_spool(session, freed)
