"""deadline: earliest deadline first (EDF), for admission and for every grant.

A job that can still end in time (its remaining steps at its measured pace fit before its
deadline, or its pace is not known yet) goes before one that can no longer make it, so a
lost cause does not make others miss theirs too; jobs without a deadline come last, in
submission order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gq.policies.base import JobView, by_submission


def feasible(job: JobView, now: float) -> bool:
    """Whether the job can still end by its deadline at its measured pace."""
    if job.deadline is None:
        return True
    remaining = job.remaining
    if remaining is None or job.mean_iteration is None:
        return now <= job.deadline
    return now + remaining <= job.deadline


class Deadline:
    name = "deadline"
    alternates = False
    waits_behind = False
    people_first = True

    def order(
        self, pending: Sequence[JobView], usage: Mapping[str, float] | None = None
    ) -> list[JobView]:
        return sorted(pending, key=lambda job: (_due(job), *by_submission(job)))

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        return min(
            ready,
            key=lambda job: (not feasible(job, now), _due(job), *by_submission(job)),
            default=None,
        )


def _due(job: JobView) -> float:
    return job.deadline if job.deadline is not None else math.inf
