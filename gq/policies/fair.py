"""fair: least attained device time per user, then per job, so every user gets an equal
share and a user's jobs share theirs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from gq.policies.base import JobView


class Fair:
    name = "fair"
    alternates = True  # equal shares: the least served job is picked after every iteration
    waits_behind = False
    people_first = True
    quantum = 0.0  # shares count attained device time exactly

    def order(self, pending: Sequence[JobView]) -> list[JobView]:
        # Round-robin over users: each user's k-th job before anyone's (k+1)-th.
        seen: dict[str, int] = defaultdict(int)
        ranked = []
        for job in sorted(pending, key=lambda j: (j.submit_time, j.id)):
            ranked.append((seen[job.user], job.submit_time, job.id, job))
            seen[job.user] += 1
        return [entry[-1] for entry in sorted(ranked, key=lambda e: e[:3])]

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        per_user: dict[str, float] = defaultdict(float)
        for job in resident:
            per_user[job.user] += job.attained
        return min(
            ready, key=lambda j: (per_user[j.user], j.attained, j.submit_time, j.id), default=None
        )

    def sharers(self, ready: Sequence[JobView]) -> list[JobView]:
        return list(ready)

    def owner(self, job: JobView) -> object:
        return job.user

    def service(self, job: JobView) -> float:
        return job.attained
