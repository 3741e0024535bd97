"""fifo: a classic queue. The earliest-submitted resident job holds the lane until it ends;
later jobs wait even while it is idle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gq.policies.base import JobView, by_submission


class Fifo:
    name = "fifo"
    alternates = False
    waits_behind = True  # a job placed behind residents waits until they have ended
    people_first = True

    def order(
        self, pending: Sequence[JobView], usage: Mapping[str, float] | None = None
    ) -> list[JobView]:
        return sorted(pending, key=by_submission)

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        if not resident:
            return None
        first = min(resident, key=by_submission)
        return first if any(job.id == first.id for job in ready) else None
