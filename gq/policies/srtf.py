"""srtf: shortest remaining time first, preempting at iteration boundaries.

Remaining time = (steps_total − steps_done) × measured mean iteration time. A job whose
pace is not measured yet, or rests on too few iterations to rank it by, is sampled first
(as if it had none left): ranked on one noisy iteration, a job put behind would never run
again to correct it. Jobs with no known total come after all known ones, least attained
service first among them (LAS, as Tiresias does when durations are unknown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gq.policies.base import JobView


def _urgency(job: JobView) -> tuple[int, float, float, int]:
    remaining = job.remaining
    if remaining is None:
        return (1, job.attained, job.submit_time, job.id)
    return (0, remaining if job.pace_settled else 0.0, job.submit_time, job.id)


class Srtf:
    name = "srtf"
    alternates = False
    waits_behind = False
    people_first = True

    def order(
        self, pending: Sequence[JobView], usage: Mapping[str, float] | None = None
    ) -> list[JobView]:
        # Iteration times are not known before a job runs, so admit by total steps.
        def admission(job: JobView) -> tuple[int, float, float, int]:
            if job.steps_total is None:
                return (1, 0.0, job.submit_time, job.id)
            return (0, float(job.steps_total - job.steps_done), job.submit_time, job.id)

        return sorted(pending, key=admission)

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        return min(ready, key=_urgency, default=None)
