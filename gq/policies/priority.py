"""priority: the highest ``--priority`` among READY jobs gets the lane; lower ones fill the
idle time of higher ones (after FIKIT). Jobs of equal priority share by attained time.

Fill modes decide what a lower job may do while a higher one is resident but idle:
``always`` runs it (work-conserving); ``never`` leaves the lane idle; ``gapfit`` runs it
only if its measured iteration fits in the higher job's measured idle gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gq.policies.base import JobView, expected_back, fits_before

FILL_MODES = ("always", "gapfit", "never")


def _rank(job: JobView) -> tuple[int, float, int]:
    return (-job.priority, job.submit_time, job.id)


def _grant_rank(job: JobView) -> tuple[int, float, float, int]:
    # Within one priority level jobs share: least attained device time first.
    return (-job.priority, job.attained, job.submit_time, job.id)


class Priority:
    name = "priority"
    alternates = False
    waits_behind = False
    people_first = False  # --priority alone decides, interactive or not
    quantum = 0.0  # equal priorities take turns by attained time exactly

    def __init__(self, fill: str = "always"):
        if fill not in FILL_MODES:
            raise ValueError(f"unknown fill mode {fill!r}; use one of {', '.join(FILL_MODES)}")
        self.fill = fill

    def order(
        self, pending: Sequence[JobView], usage: Mapping[str, float] | None = None
    ) -> list[JobView]:
        return sorted(pending, key=_rank)

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        best = min(ready, key=_grant_rank, default=None)
        if best is None or self.fill == "always":
            return best
        ready_ids = {job.id for job in ready}
        idle_higher = [j for j in resident if j.priority > best.priority and j.id not in ready_ids]
        if not idle_higher:
            return best
        if self.fill == "never":
            return None
        return best if all(self._fits(best, high, now) for high in idle_higher) else None

    def sharers(self, ready: Sequence[JobView]) -> list[JobView]:
        """The highest priority's ready jobs: they share by attained time (``_grant_rank``)."""
        top = max((job.priority for job in ready), default=0)
        return [job for job in ready if job.priority == top]

    def owner(self, job: JobView) -> object:
        return job.id

    def service(self, job: JobView) -> float:
        return job.attained

    @staticmethod
    def _fits(low: JobView, high: JobView, now: float) -> bool:
        back = expected_back(high)
        if low.mean_iteration is None or back is None:
            return True  # nothing measured yet: run once to learn
        if now > back:
            return True  # the higher job is idle longer than usual; don't waste the lane
        return fits_before(low, back, now)
