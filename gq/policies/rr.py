"""rr: resident jobs take turns, a quantum each (time slicing at iteration boundaries).

Stateless, so the host, the daemon and the simulator agree: a job's turn number is its
attained device time (or its iterations) divided by the quantum; the ready job with the
lowest turn runs, earliest submitted first. So a job keeps the lane until it has used up
its quantum, then each other job gets its quantum before it runs again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gq.policies.base import JobView, by_submission, turn_of

_QUANTUM = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|it)\s*$")
DEFAULT_QUANTUM = "100ms"


def parse_quantum(text: str) -> tuple[float, bool]:
    """``100ms``, ``2s`` (device time) or ``10it`` (iterations): the amount (seconds or
    iterations) and whether it counts iterations."""
    match = _QUANTUM.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"invalid quantum {text!r}: use a positive time such as 100ms or 2s, "
            "or iterations such as 10it"
        )
    amount, unit = float(match.group(1)), match.group(2)
    return (amount / 1000 if unit == "ms" else amount), unit == "it"


class RoundRobin:
    name = "rr"
    alternates = False
    waits_behind = False
    people_first = True

    def __init__(self, quantum: str = DEFAULT_QUANTUM):
        self.amount, self.in_iterations = parse_quantum(quantum)

    @property
    def quantum(self) -> float:
        return self.amount

    def turn(self, job: JobView) -> float:
        return turn_of(self.service(job), self.amount)

    def service(self, job: JobView) -> float:
        return float(job.steps_done) if self.in_iterations else job.attained

    def sharers(self, ready: Sequence[JobView]) -> list[JobView]:
        return list(ready)

    def owner(self, job: JobView) -> object:
        return job.id

    def order(
        self, pending: Sequence[JobView], usage: Mapping[str, float] | None = None
    ) -> list[JobView]:
        return sorted(pending, key=by_submission)

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        return min(ready, key=lambda job: (self.turn(job), *by_submission(job)), default=None)
