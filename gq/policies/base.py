"""The policy interface: pure code over job views, shared by host, daemon and simulator."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gq import defaults


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
    # Of it, what its owner's fair share is charged (side by side: at the share of the
    # device it got; gq.exec.lane.packing.lane_share); None: all of it.
    charged: float | None = None
    mean_iteration: float | None = None
    # Whether mean_iteration rests on enough iterations to rank it by (srtf samples a job
    # whose pace does not first; gq.exec.lane.paces.SETTLED). A simulated job's is known.
    pace_settled: bool = True
    mean_gap: float | None = None  # idle time between a release and the next acquire
    released_at: float | None = None  # end of its last iteration; None before the first
    deadline: float | None = None  # when it must be done (seconds, the caller's clock)
    # An interactive job (a terminal, a notebook) within its burst: a person waits on its
    # iterations (the lane rule's people-first turn; gq.exec.lane.rule.within_burst).
    person_waits: bool = False
    # Its owner's fair-share usage beside what the jobs a policy is shown have attained:
    # lane seconds of their jobs that ended, or run elsewhere, decayed with a half-life.
    user_usage: float = 0.0

    @property
    def share_used(self) -> float:
        """The lane time its owner's fair share counts for it."""
        return self.attained if self.charged is None else min(self.attained, self.charged)

    @property
    def remaining(self) -> float | None:
        """Estimated device time left, when the total is known."""
        if self.steps_total is None:
            return None
        left = max(0, self.steps_total - self.steps_done)
        return left * (self.mean_iteration or 0.0)


def expected_back(job: JobView) -> float | None:
    """When a job in the gap after its iteration is expected to ask for the lane again: its
    release plus its measured gap (None until both are known)."""
    if job.released_at is None or job.mean_gap is None:
        return None
    return job.released_at + job.mean_gap


def fits_before(job: JobView, back: float | None, now: float) -> bool:
    """Whether ``job``'s iteration, begun ``now``, is expected to end by ``back`` (False
    where either is unknown)."""
    return back is not None and job.mean_iteration is not None and now + job.mean_iteration <= back


def time_left(job: JobView, ran: float, time_limit: float | None) -> float:
    """How long a running job will still hold its lane at most, as far as anyone can tell:
    its steps left at its measured pace (iteration and gap), capped by what its time limit
    leaves; infinity where neither is known."""
    left = math.inf
    if time_limit is not None and math.isfinite(time_limit):
        left = max(0.0, time_limit - ran)
    if job.steps_total is not None and job.mean_iteration is not None:
        steps = max(0, job.steps_total - job.steps_done)
        left = min(left, steps * (job.mean_iteration + (job.mean_gap or 0.0)))
    return left


class Policy(Protocol):
    name: str
    # Whether its pick may pass from one job to another after every iteration while nothing
    # else changes (jobs sharing by attained time): a simulator may then batch turns.
    alternates: bool
    # Whether a job placed on a lane gets no iteration until the residents before it have
    # ended (fifo), rather than within their idle time or by its turn: admission then places
    # a job where those residents end soonest.
    waits_behind: bool
    # Whether a ready interactive job goes before batch jobs every other grant (the lane
    # rule's people-first turn); priority leaves that to --priority.
    people_first: bool

    def order(
        self, pending: Sequence[JobView], usage: Mapping[str, float] | None = None
    ) -> list[JobView]:
        """Admission order of pending jobs, best first (``usage``: each user's fair-share
        usage, decayed lane seconds, where the caller keeps it)."""
        ...

    def pick(
        self, ready: Sequence[JobView], resident: Sequence[JobView], now: float
    ) -> JobView | None:
        """The READY job that gets the lane's next iteration, or None to leave it idle.

        ``resident`` holds every job on the lane, ready or not (``ready`` is a subset).
        """
        ...


@runtime_checkable
class TakesTurns(Protocol):
    """A policy whose grants, while every resident job is ready, go among some of the ready jobs
    (its ``sharers``) to the least served: first the *owner* (the job itself, or fair's user)
    whose resident jobs' turns add up to least, then that owner's job on the lowest turn, ties
    to the earliest submitted (:func:`turn_key`). A job's service grows by a fixed amount per
    iteration, whatever its measured pace, and its turn is its service in whole quanta
    (:func:`turn_of`). A simulator can then settle every grant up to a level at once."""

    quantum: float  # service per turn; 0: a turn is the service itself

    def sharers(self, ready: Sequence[JobView]) -> list[JobView]:
        """The ready jobs that take turns so; the others get nothing while these are ready."""
        ...

    def owner(self, job: JobView) -> object:
        """Whose share the job's turns count against."""
        ...

    def service(self, job: JobView) -> float:
        """The service the job has had (attained seconds, or iterations)."""
        ...


TURN_SLACK = 1e-9  # a service within this many quanta of a turn's start is on that turn


def turn_of(service: float, quantum: float) -> float:
    """The turn a job with ``service`` is on: whole quanta, or the service itself."""
    return math.floor(service / quantum + TURN_SLACK) if quantum else service


def iterations_to_turn(service: float, per_iteration: float, quantum: float, turn: float) -> int:
    """The fewest further iterations that bring a job to ``turn`` or later (inverse of
    :func:`turn_of`)."""
    target = (turn - TURN_SLACK) * quantum if quantum else turn
    if service >= target:
        return 0
    count = math.ceil((target - service) / per_iteration)
    if turn_of(service + (count - 1) * per_iteration, quantum) >= turn:
        count -= 1  # rounding put the division one iteration late
    return max(count, 1)


def turn_key(
    policy: TakesTurns, job: JobView, resident: Sequence[JobView]
) -> tuple[float, float, float, int]:
    """What ``policy.pick`` chooses the least of among its sharers, all residents ready."""
    owner = policy.owner(job)
    owned = sum(
        turn_of(policy.service(other), policy.quantum)
        for other in resident
        if policy.owner(other) == owner
    )
    return (owned, turn_of(policy.service(job), policy.quantum), *by_submission(job))


def anticipation_window(mean_gap: float | None) -> float | None:
    """How long a lane is kept for a job after its release when the policy prefers it to every
    ready job: its gap is too short for another job's iteration to fit (anticipatory
    scheduling). None: its gaps are long enough to fill, or not measured yet."""
    if mean_gap is None or mean_gap > defaults.ANTICIPATION_LIMIT:
        return None
    return min(defaults.ANTICIPATION_LIMIT, 4 * mean_gap + 0.0002)


def by_submission(job: JobView) -> tuple[float, int]:
    return (job.submit_time, job.id)


def run_length(
    policy: Policy,
    chosen: JobView,
    ready: Sequence[JobView],
    resident: Sequence[JobView],
    after: Callable[[int], tuple[JobView, float]],
    limit: int,
) -> int:
    """How many iterations in a row (1 to ``limit``) ``policy`` grants ``chosen`` if nothing
    else changes on the lane: ``after(k)`` is chosen's view, and the clock, once it has run
    k more iterations. This is what a simulator needs to advance in bulk.

    A pick that moves away from a job as the job runs does not come back to it while the job
    waits (the job's view is all that changes, and each policy's preference for a job only
    falls as it uses device time), so the first boundary where another job is picked is
    found by doubling, then bisecting: O(log limit) calls of ``pick``.
    """
    others_ready = [job for job in ready if job.id != chosen.id]
    others_resident = [job for job in resident if job.id != chosen.id]

    def keeps(k: int) -> bool:
        view, now = after(k)
        picked = policy.pick([*others_ready, view], [*others_resident, view], now)
        return picked is not None and picked.id == chosen.id

    if limit <= 1 or not keeps(1):
        return 1
    kept, probe = 1, 2
    while probe < limit and keeps(probe):
        kept, probe = probe, probe * 2
    if probe >= limit and (limit - 1 == kept or keeps(limit - 1)):
        return limit
    lost = min(probe, limit - 1)  # keeps(kept) is true and keeps(lost) false
    while lost - kept > 1:
        middle = (kept + lost) // 2
        if keeps(middle):
            kept = middle
        else:
            lost = middle
    return lost
