"""What the lane rule (:mod:`gq.exec.lane.rule`, pure) is given at a free lane of the host's:
the lane's residents as policies see them, each interactive one marked as a person waiting
while its owner's burst allows (each user's recent interactive use of the device, counted
here across all their interactive jobs), and the jobs in their gaps that the lane may be
kept for. The granter (:mod:`gq.exec.lane.granting`) asks through :func:`decide`, and whether a
holder is in another job's way through :func:`overstays`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from gq.exec.lane import rule as lane_rule
from gq.exec.lane.residents import Lane, Resident, ready_to_grant
from gq.exec.lane.standings import Standing
from gq.policies.base import JobView, Policy


def decide(
    policy: Policy,
    lane: Lane,
    ready: list[Resident],
    bursts: dict[str, lane_rule.Burst],
    usage: Mapping[str, float],
    now: float,
) -> lane_rule.Grant | lane_rule.KeepFor | None:
    """The lane rule's decision for ``lane``, its ``ready`` residents among those it may
    grant (``bursts``: each user's, kept by the caller and brought up to ``now`` here;
    ``usage``: each user's fair-share usage beside the lane's residents)."""
    views, in_gaps = lane_views(lane, bursts, usage, now)
    return lane_rule.next_step(
        policy,
        [views[r.job_id] for r in ready],
        list(views.values()),
        in_gaps,
        now,
        after_turn=lane.turns.over(now),
    )


def overstays(
    policy: Policy,
    lane: Lane,
    holder: Resident,
    ready: list[Resident],
    bursts: dict[str, lane_rule.Burst],
    usage: Mapping[str, float],
    now: float,
) -> bool:
    """Whether the rule would grant one of ``ready`` before ``holder``, its lane's holder
    (:func:`gq.exec.lane.rule.overstays`)."""
    return _ask(lane_rule.overstays, policy, lane, holder, ready, bursts, usage, now)


def usage_beside(lanes: list[Lane], lane: Lane, shares: Mapping[str, float]) -> dict[str, float]:
    """Each user's usage beside ``lane``'s residents: the daemon's figure (``shares``), and
    what their jobs on the device's other ``lanes`` have attained."""
    usage = dict(shares)
    for other in lanes:
        if other is not lane:
            for resident in other.residents:
                usage[resident.user] = usage.get(resident.user, 0.0) + resident.billed
    return usage


def lane_views(
    lane: Lane, bursts: dict[str, lane_rule.Burst], usage: Mapping[str, float], now: float
) -> tuple[dict[int, JobView], list[lane_rule.Awaited]]:
    """The residents as policies see them, each made once (a suspended job counts for
    none; an interactive one waits on a person while its owner's burst allows; each with
    its owner's usage), and those in their gaps the lane may be kept for."""
    views = {r.job_id: r.view(usage.get(r.user, 0.0)) for r in lane.residents if not r.suspended}
    for resident in lane.residents:
        if resident.interactive and not resident.suspended:
            # Its hold in progress counts too: a statement that never ends leaves its
            # owner's burst, and its hold is then bounded as any other (gq.exec.lane.rule).
            billed = resident.billed
            burst = bursts.setdefault(resident.user, lane_rule.Burst(at=now))
            burst.add(billed - resident.burst_counted, now)
            resident.burst_counted = billed
            if lane_rule.within_burst(burst.used, resident.mean_iteration):
                views[resident.job_id] = dataclasses.replace(
                    views[resident.job_id], person_waits=True
                )
    in_gaps = [
        awaited
        for r in lane.residents
        if r.standing is Standing.IDLE
        and not r.suspended
        and r.released_at is not None
        and (awaited := lane_rule.awaited(views[r.job_id], r.released_at, r.mean_gap))
    ]
    return views, in_gaps


def undisputed(
    policy: Policy,
    lane: Lane,
    holder: Resident,
    bursts: dict[str, lane_rule.Burst],
    usage: Mapping[str, float],
    now: float,
    slice_left: bool = False,
    in_gaps_too: bool = False,
    turn_left: bool = False,
) -> bool:
    """Whether ``holder`` may hold its lane under a lease beside the jobs ready for it: none
    of them could take the lane at any of its boundaries
    (:func:`gq.exec.lane.rule.undisputed`), or, with a slice of its lease left
    (``slice_left``), it alternates with every other job on the lane a slice at a time
    (:func:`gq.exec.lane.rule.sliced`), or, with time left to the lane's run of people-first
    turns (``turn_left``), a person waits for it, its owner within their burst (the run is
    the person's, its pauses included). ``in_gaps_too``: some of them are in their gaps,
    not waiting, and only a slice or a turn holds (one that asks could take the lane
    otherwise)."""
    ready = [r for r in ready_to_grant(lane) if r is not holder]
    if not ready and not in_gaps_too:
        return True
    views, in_gaps = lane_views(lane, bursts, usage, now)
    if holder.job_id not in views:
        return False  # (its script said it was finished: it runs no more iterations)
    view = views[holder.job_id]
    if turn_left and view.person_waits:
        return True
    others = [other for job, other in views.items() if job != holder.job_id]
    if slice_left and lane_rule.sliced(policy, view, others):
        return True
    if in_gaps_too:
        return False
    return lane_rule.undisputed(
        policy,
        view,
        [views[r.job_id] for r in ready],
        list(views.values()),
        in_gaps,
        now,
        after_turn=lane.turns.over(now),
    )


def takes_turns(policy: Policy, lane: Lane, now: float) -> bool:
    """Whether a lease on ``lane`` takes turns with the jobs beside it (its worker paced: one
    iteration's work ahead on its device at most): under a policy that alternates by lane
    time (a slice at a time), or as a run of people-first turns (leased for its time)."""
    return policy.alternates or lane.turns.left(now) > 0


def _ask(
    question: Callable[..., bool],
    policy: Policy,
    lane: Lane,
    holder: Resident,
    ready: list[Resident],
    bursts: dict[str, lane_rule.Burst],
    usage: Mapping[str, float],
    now: float,
) -> bool:
    """The rule's ``question`` about ``holder`` beside ``ready``; False for a holder no
    policy sees (its script said it was finished: it runs no more iterations)."""
    views, in_gaps = lane_views(lane, bursts, usage, now)
    if holder.job_id not in views:
        return False
    return question(
        policy,
        views[holder.job_id],
        [views[r.job_id] for r in ready],
        list(views.values()),
        in_gaps,
        now,
        after_turn=lane.turns.over(now),
    )
