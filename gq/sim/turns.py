"""Turns settled in closed form: every grant a turn-taking policy (:class:`TakesTurns`) makes
up to a level, at once.

While all resident jobs are ready, such a policy grants the next iteration to the owner whose
turns add up to least, then to that owner's job on the lowest turn. So every grant to an owner
below a level L comes before any grant to an owner at L or above: the state in which each
owner has just reached L (each job of a single-job owner reached turn L; the jobs of a larger
owner, fair's user, took their turns among themselves by attained time until the owner's
total reached L) is exactly what iteration-by-iteration granting reaches at some moment. This
module finds the highest such level whose grants fit in the time before the next event and
end no job (water-filling, then at most a bisection), and returns each job's iteration count.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gq.policies.base import JobView, TakesTurns, iterations_to_turn, turn_of

BISECTIONS = 48  # steps when a larger owner's job would reach its end below the level
MAX_STEPS_PER_JOB = 64  # single grants after water-filling inside a larger owner, per job


@dataclass(frozen=True)
class Sharer:
    view: JobView
    seconds: float  # device time of one iteration
    per_iteration: float  # service one iteration adds, by the policy's measure
    cap: int  # most iterations it may take in the window (one short of its end)


# Each sharer's (service, service per iteration), by its place among the sharers.
Services = list[tuple[float, float]]


def settle(policy: TakesTurns, sharers: Sequence[Sharer], budget: float) -> list[int] | None:
    """Iterations each sharer runs in the longest settled window of at most ``budget``
    seconds, or None where there is none to settle."""
    quantum = policy.quantum
    services: Services = [(policy.service(s.view), s.per_iteration) for s in sharers]
    if any(per <= 0 for _, per in services):
        return None
    owners: dict[object, list[int]] = {}
    for index, sharer in enumerate(sharers):
        owners.setdefault(policy.owner(sharer.view), []).append(index)
    groups = list(owners.values())
    for members in groups:
        # A larger owner's total must grow by its jobs' device time (fair's attained time).
        if len(members) > 1 and (
            quantum or any(not math.isclose(services[i][1], sharers[i].seconds) for i in members)
        ):
            return None
    levels = [sum(services[i][0] for i in members) for members in groups]
    rates = [sharers[m[0]].seconds / services[m[0]][1] if len(m) == 1 else 1.0 for m in groups]
    level = _water_level(levels, rates, budget - sum(s.seconds for s in sharers))
    ceiling = min(_ceiling(sharers, services, members) for members in groups)
    turn = turn_of(min(level, ceiling), quantum)
    counts = _counts(sharers, services, groups, turn, quantum)
    if counts is not None and any(c > s.cap for c, s in zip(counts, sharers)):
        counts = _highest_within_caps(
            sharers, services, groups, turn, quantum, low=turn_of(min(levels), quantum)
        )
    return counts if counts and any(counts) else None


def _ceiling(sharers: Sequence[Sharer], services: Services, members: list[int]) -> float:
    """The owner's level at which one of its jobs reaches its cap (for a larger owner, as if
    its jobs' iterations were infinitely short: the caps are checked again on the counts)."""
    reach = [services[i][0] + sharers[i].cap * services[i][1] for i in members]
    if len(members) == 1:
        return reach[0]
    lowest = min(reach)
    return sum(services[i][0] + max(0.0, lowest - services[i][0]) for i in members)


def _water_level(levels: list[float], rates: list[float], budget: float) -> float:
    """The level L at which bringing every owner below L up to it (an owner at ``levels[k]``
    costs ``rates[k]`` seconds per unit) costs ``budget`` seconds, jobs' iterations ignored."""
    if budget <= 0:
        return min(levels)
    pairs = sorted(zip(levels, rates))
    current, rate, left = pairs[0][0], 0.0, budget
    for level, owner_rate in pairs:
        cost = rate * (level - current)
        if cost >= left:
            return current + left / rate
        left -= cost
        current, rate = level, rate + owner_rate
    return current + left / rate


def _counts(
    sharers: Sequence[Sharer],
    services: Services,
    groups: list[list[int]],
    turn: float,
    quantum: float,
) -> list[int] | None:
    """Each job's iterations once every owner has just reached ``turn``."""
    counts = [0] * len(sharers)
    for members in groups:
        if len(members) == 1:
            (index,) = members
            service, per_iteration = services[index]
            counts[index] = iterations_to_turn(service, per_iteration, quantum, turn)
            continue
        owned = turn - sum(services[i][0] for i in members)
        if owned > 0 and not _share_inside(sharers, services, members, owned, counts):
            return None
    return counts


def _share_inside(
    sharers: Sequence[Sharer],
    services: Services,
    members: list[int],
    owned: float,
    counts: list[int],
) -> bool:
    """Fill in the iterations of one owner's jobs taking turns by attained time until they
    have used ``owned`` seconds (the first grant that reaches it included). False if that
    took too many single grants to be worth it."""
    attained = [services[i][0] for i in members]
    seconds = [sharers[i].seconds for i in members]
    inner = _water_level(attained, [1.0] * len(members), owned - sum(seconds))
    used = 0.0
    for index, start, step in zip(members, attained, seconds):
        counts[index] = iterations_to_turn(start, step, 0.0, inner)
        used += counts[index] * step
    heap = [
        (start + counts[i] * step, sharers[i].view.submit_time, sharers[i].view.id, i, step)
        for i, start, step in zip(members, attained, seconds)
    ]
    heapq.heapify(heap)
    for _ in range(MAX_STEPS_PER_JOB * len(members)):
        if used >= owned:
            return True
        reached, submitted, job_id, index, step = heap[0]
        counts[index] += 1
        used += step
        heapq.heapreplace(heap, (reached + step, submitted, job_id, index, step))
    return used >= owned


def _highest_within_caps(
    sharers: Sequence[Sharer],
    services: Services,
    groups: list[list[int]],
    high: float,
    quantum: float,
    low: float,
) -> list[int] | None:
    """The counts at the highest level from ``low`` to ``high`` that take no job past its cap."""
    best = None
    for _ in range(BISECTIONS):
        middle = (low + high) / 2 if not quantum else math.floor((low + high) / 2)
        counts = _counts(sharers, services, groups, middle, quantum)
        if counts is not None and all(c <= s.cap for c, s in zip(counts, sharers)):
            best, low = counts, middle
        else:
            high = middle
        if high - low <= (1 if quantum else 1e-12 * max(1.0, abs(high))):
            break
    return best
