"""What the spool keeps for each user, in the queue's database: the bytes each
submission's snapshot costs (its payload's ``spool_bytes``) and their sum for each uid
(``spool_usage``), kept up to date as jobs are submitted, their snapshots dropped and their
rows purged, so that a submit checks --max-spool in one read. (The snapshots' files are
gq.queue.spool's.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, case, func, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from gq.queue.models import Job, Payload, SpoolUsage
from gq.queue.prepared import Prepared
from gq.queue.queries import among, chunks
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.queue.engine import Transaction

_SPOOL_BYTES = Prepared(select(SpoolUsage.bytes).where(SpoolUsage.uid == bindparam("uid")))


def spool_bytes(session: Transaction, uid: int) -> int:
    """What the snapshots the spool keeps for the user's jobs cost (an array's counts
    once): one row, kept up to date by count_spool."""
    return _SPOOL_BYTES.scalar(session, {"uid": uid}) or 0


def finished_snapshots(session: Transaction, uid: int) -> Sequence[tuple[int, int]]:
    """The user's submissions whose jobs have all ended and whose snapshot is still kept,
    as (payload id, what it costs), the one that ended longest ago first."""
    terminal = [s.value for s in JobState if s.terminal]
    unfinished = func.sum(case((Job.state.in_(terminal), 0), else_=1))
    return session.execute(
        select(Payload.id, Payload.spool_bytes)
        .join(Job, Job.payload_id == Payload.id)
        .where(Job.uid == uid, Payload.spool_bytes > 0)
        .group_by(Payload.id)
        .having(unfinished == 0)
        .order_by(func.max(Job.end_time), Payload.id)
    ).all()


def drop_snapshots(session: Transaction, uid: int, payload_ids: list[int]) -> set[str]:
    """Forget the snapshots of these submissions of ``uid``'s (their jobs have all ended):
    their jobs can no longer be requeued or exported. The paths to delete once this
    commits."""
    paths: set[str] = set()
    freed = 0
    for part in chunks(payload_ids):
        freed += (
            session.scalar(
                select(func.coalesce(func.sum(Payload.spool_bytes), 0)).where(
                    among(Payload.id, part)
                )
            )
            or 0
        )
        paths.update(
            session.scalars(
                select(Job.spool_path).distinct().where(among(Job.payload_id, part))
            ).all()
        )
        session.execute(
            update(Job)
            .where(among(Job.payload_id, part))
            .values(spool_path="")
            .execution_options(synchronize_session=False)
        )
        session.execute(
            update(Payload)
            .where(among(Payload.id, part))
            .values(spool_bytes=0)
            .execution_options(synchronize_session=False)
        )
    count_spool(session, {uid: -freed})
    return {path for path in paths if path}


_ADD_TO_SPOOL = Prepared(
    sqlite_insert(SpoolUsage.__table__)
    .values(uid=bindparam("b_uid"), bytes=bindparam("b_delta"))
    .on_conflict_do_update(
        index_elements=[SpoolUsage.uid], set_={"bytes": SpoolUsage.bytes + bindparam("b_delta")}
    )
)


def count_spool(session: Transaction, change: dict[int, int]) -> None:
    """Add to (or take from) what the spool keeps for each uid."""
    for uid, delta in change.items():
        if delta:
            _ADD_TO_SPOOL.execute(session, {"b_uid": uid, "b_delta": delta})
