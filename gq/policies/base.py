"""The policy interface: pure code over job views, shared by host, daemon and simulator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class JobView:
    """What a policy may know about a job. Times are seconds; ``now`` comes from the caller."""

    id: int
    user: str = ""
    submit_time: float = 0.0
    priority: int = 0
    steps_done: int = 0
    steps_total: int | None = None
    attained: float = 0.0  # device time used so far
    mean_iteration: float | None = None
    mean_gap: float | None = None  # idle time between a release and the next acquire
    released_at: float | None = None  # end of its last iteration; None before the first
    deadline: float | None = None  # when it must be done (seconds, the caller's clock)

    @property
    def remaining(self) -> float | None:
        """Estimated device time left, when the total is known."""
        if self.steps_total is None:
            return None
        left = max(0, self.steps_total - self.steps_done)
        return left * (self.mean_iteration or 0.0)


class Policy(Protocol):
    name: str

    def order(self, pending: Sequence[JobView]) -> list[JobView]:
        """Admission order of pending jobs, best first."""
        ...

    def pick(self, ready: Sequence[JobView], resident: Sequence[JobView],
             now: float) -> JobView | None:
        """The READY job that gets the lane's next iteration, or None to leave it idle.

        ``resident`` holds every job on the lane, ready or not (``ready`` is a subset).
        """
        ...


def by_submission(job: JobView) -> tuple[float, int]:
    return (job.submit_time, job.id)
