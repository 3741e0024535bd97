"""fair: least lane time per user, then per job, so every user gets an equal share and a
user's jobs share theirs.

A user's lane time has a memory, as Slurm's fair-share has: what their jobs that ended (or
run on other devices) used, decayed with a half-life (:func:`decayed`), counts beside what
their resident jobs have attained. A chain of short jobs is one user's use, not a new
user's each time a job starts. The daemon keeps that usage in the queue and gives it to its
hosts (``JobView.user_usage``) and to admission (``order``'s ``usage``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from gq.policies.base import JobView


def decayed(value: float, elapsed: float, half_life: float) -> float:
    """``value`` seconds of use, ``elapsed`` seconds later: halved every ``half_life``
    (infinite: never decayed)."""
    if elapsed <= 0 or math.isinf(half_life):
        return value
    return value * math.pow(0.5, elapsed / half_life)


class Fair:
    name = "fair"
    alternates = True  # equal shares: the least served job is picked after every iteration
    waits_behind = False
    people_first = True
    quantum = 0.0  # shares count attained device time exactly

    def order(
        self, pending: Sequence[JobView], usage: Mapping[str, float] | None = None
    ) -> list[JobView]:
        # Round-robin over users: each user's k-th job before anyone's (k+1)-th, and among
        # the k-th jobs, the user who has used least first.
        used = usage or {}
        seen: dict[str, int] = defaultdict(int)
        ranked = []
        for job in sorted(pending, key=lambda j: (j.submit_time, j.id)):
            ranked.append((seen[job.user], used.get(job.user, 0.0), job.submit_time, job.id, job))
            seen[job.user] += 1
        return [entry[-1] for entry in sorted(ranked, key=lambda e: e[:4])]

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        # (plain comparisons, not max(): a simulation asks at every iteration of every job)
        per_user: dict[str, float] = {}
        for job in (*resident, *ready):  # each user's usage beside these jobs, once
            if job.user_usage > per_user.get(job.user, 0.0):
                per_user[job.user] = job.user_usage
        for job in resident:  # (what the daemon charges them: side by side, less)
            per_user[job.user] = per_user.get(job.user, 0.0) + job.share_used
        return min(
            ready,
            key=lambda j: (per_user.get(j.user, 0.0), j.attained, j.submit_time, j.id),
            default=None,
        )

    def sharers(self, ready: Sequence[JobView]) -> list[JobView]:
        return list(ready)

    def owner(self, job: JobView) -> object:
        return job.user

    def service(self, job: JobView) -> float:
        return job.attained
