"""Counts and run history over the queue: how long a user's and the node's recent jobs
ran (what forecasts start from), how many jobs each user has in each state, and when the
oldest finished job still kept ended."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, func, select

from gq.queue.models import Job
from gq.queue.prepared import Prepared
from gq.queue.states import JobState

if TYPE_CHECKING:
    from gq.queue.engine import Transaction

_RECENT_RUNS = Prepared(
    select(
        Job.start_time,
        Job.end_time,
        Job.steps_done,
        Job.attained,
        Job.mean_iteration,
        Job.mean_gap,
        Job.startup,
    )
    .where(
        Job.user == bindparam("user"),
        Job.name == bindparam("name"),
        Job.end_time.is_not(None),
        Job.start_time.is_not(None),
        Job.state == JobState.COMPLETED.value,
    )
    .order_by(Job.end_time.desc())
    .limit(bindparam("limit"))
)


def recent_runs(session: Transaction, user: str, name: str, limit: int) -> list[Sequence[Any]]:
    """The user's last ``limit`` completed jobs of that name, the last ended first: start,
    end, steps done, attained device time, mean iteration and gap, and start-up (None
    where its host did not measure one)."""
    return _RECENT_RUNS.rows(session, {"user": user, "name": name, "limit": limit})


_RECENT_RUN_TIMES = Prepared(
    select(Job.end_time - Job.start_time)
    .where(
        Job.end_time.is_not(None),
        Job.start_time.is_not(None),
        Job.state == JobState.COMPLETED.value,
    )
    .order_by(Job.end_time.desc())
    .limit(bindparam("limit"))
)


def recent_run_times(session: Transaction, limit: int) -> list[float]:
    """How long the node's last ``limit`` completed jobs ran, the last ended first."""
    return [seconds for (seconds,) in _RECENT_RUN_TIMES.rows(session, {"limit": limit})]


_PENDING_COUNT = Prepared(
    select(func.count())
    .select_from(Job)
    .where(Job.user == bindparam("user"), Job.state == JobState.PENDING.value)
)


def pending_count(session: Transaction, user: str) -> int:
    return _PENDING_COUNT.scalar(session, {"user": user}) or 0


def counts_by_state_and_user(session: Transaction) -> dict[tuple[str, str], int]:
    rows = session.execute(select(Job.state, Job.user, func.count()).group_by(Job.state, Job.user))
    return {(state, user): count for state, user, count in rows}


def oldest_end(session: Transaction) -> float | None:
    """When the oldest finished job still kept ended: only finished jobs have an end time,
    and the least one is read off the end-time index (a state filter would scan them all)."""
    return session.scalar(select(func.min(Job.end_time)))
