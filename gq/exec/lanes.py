"""What a free lane does next (pure: no sockets, no clock of its own). The execution host
follows it and the simulator predicts with it, so that the two cannot drift apart.

A lane that no job holds grants its next iteration to the ready job the policy picks, unless
it is **kept for an awaited job**: one that released the lane moments ago, whose measured
gap (the host-side work between its iterations) is short (``anticipation_window``), which
the policy prefers to every ready job, and before whose expected return the ready job's
iteration is not expected to end. Then the lane stays free until that job is ready again or
its anticipation window has passed (anticipatory scheduling: granting a lower job there
would make the preferred one wait a whole iteration for a gap of a millisecond). A ready
job whose iteration fits in that gap is granted: the awaited job loses nothing by it, and
two jobs with short iterations and millisecond gaps run in each other's gaps rather than
each waiting out the other's. Where the policy picks no ready job, the lane stays free too
(e.g. priority with fill off, a higher job in its gap).

While a job holds the lane, :func:`hand_over` says ahead which job the lane goes to at its
release, where that does not depend on how long the holder's iteration lasts past some
point: the host arms a hand-over on that (gq.exec.handover), so that the holder, releasing
past that point, wakes that job itself.

Two lane-mates whose gaps are both too long to keep the lane for never meet this rule's
choices: whoever asks for the free lane is granted it, and at a release the one waiting is
the only ready job. Under a policy whose pick of a lone ready job is that job, the host
then **lends** them the lane (:func:`lendable`): they take it from each other first come,
first served, without asking (gq.exec.lease). Under fair, which shares by attained time, it
lends it also where a gap is short but each one's iteration fits in the other's gap: the one
approximation, that a job asking late in the other's gap may end its iteration after the
other is back, which then waits for it (one iteration, which fits in a gap) where this rule
would have kept the lane free for it, is evened out by the shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from gq.policies.base import JobView, Policy, anticipation_window, expected_back, fits_before


@dataclass(frozen=True)
class Awaited:
    """A resident job in the gap after its iteration, that the lane may be kept for."""

    view: JobView
    until: float  # its release plus its anticipation window


@dataclass(frozen=True)
class Grant:
    job: JobView


@dataclass(frozen=True)
class KeepFor:
    job: JobView
    until: float


def awaited(view: JobView, released_at: float, mean_gap: float | None) -> Awaited | None:
    """The job just released as a candidate to keep the lane for; None where its gaps are
    long enough to fill, or not measured yet."""
    window = anticipation_window(mean_gap)
    return None if window is None else Awaited(view, released_at + window)


def next_step(policy: Policy, ready: Sequence[JobView], resident: Sequence[JobView],
              waiting_for: Sequence[Awaited], now: float) -> Grant | KeepFor | None:
    """The free lane's decision: grant the ready job the policy picks, keep the lane for an
    awaited job the policy prefers to every ready one (until it is ready or ``until``) unless
    the pick's iteration is expected to end before that job is back, or nothing (no job
    ready, or the policy leaves the lane idle)."""
    if not ready:
        return None
    chosen = policy.pick(ready, resident, now)
    live = [a for a in waiting_for if now < a.until]
    if live:
        preferred = policy.pick([*ready, *(a.view for a in live)], resident, now)
        for candidate in live:
            if preferred is not None and candidate.view.id == preferred.id and not (
                    chosen is not None
                    and fits_before(chosen, expected_back(candidate.view), now)):
                return KeepFor(candidate.view, candidate.until)
    return None if chosen is None else Grant(chosen)


def lendable(policy: Policy, first: JobView, second: JobView) -> bool:
    """Whether a lane whose only jobs are these two may be lent to them: the policy picks
    any lone ready job, and no lane is ever kept for either (both gaps too long to keep it
    for, as measured). A policy that shares by attained time (fair) is lent it also where
    a gap is short but the other's iteration fits in it: there a job that asks late in the
    other's gap may make it wait one iteration, which the shares even out; srtf, rr and
    deadline, which keep one job's precedence, are lent it only where that never happens."""
    if not policy.lends or None in (first.mean_iteration, second.mean_iteration,
                                     first.mean_gap, second.mean_gap):
        return False
    if anticipation_window(first.mean_gap) is None \
            and anticipation_window(second.mean_gap) is None:
        return True
    return policy.alternates and _fits(first, second) and _fits(second, first)


def _fits(job: JobView, mate: JobView) -> bool:
    """Whether ``job``, asking for the lane at the start of ``mate``'s gap, is granted it by
    :func:`next_step` whatever the policy prefers."""
    return anticipation_window(mate.mean_gap) is None or job.mean_iteration <= mate.mean_gap


@dataclass(frozen=True)
class HandOver:
    """Where the lane goes at its holder's release: to ``job`` if that release comes at
    ``after`` or later (monotonic; a release before then is decided as it comes)."""

    job: JobView
    after: float


def hand_over(policy: Policy, ready: Sequence[JobView], resident: Sequence[JobView],
              waiting_for: Sequence[Awaited], holder: JobView, granted_at: float,
              now: float, armed: tuple[int, float] | None = None) -> HandOver | None:
    """While ``holder`` is inside the iteration granted at ``granted_at``: the job the free
    lane's decision grants at its release for every length the iteration may still have
    from some point on, up to twice its usual length, and that point (at once where it is
    the same job for what the iteration has lasted so far). None where no such job is
    known before the iteration's usual end: the lane may be kept for the holder instead,
    or go to another job. ``resident`` and ``waiting_for`` are the lane's other jobs;
    ``armed``, the job and point of a hand-over armed already, is kept where it holds.

    Where the decision reads no clock (no job in its gap but the holder, a policy that
    reads none), only the holder's use changes with the iteration's length, and the
    decision changes once: under fair a holder that has used less than the job waiting
    keeps the lane if it releases now, and once its use has passed the other's, that job
    follows it however long it runs. That point is found by halving. Elsewhere (deadlines,
    a high-priority job due back) the decision may change at each time the views name (a
    job due back, a window's end, a deadline it can no longer make): it is checked on both
    sides of each, and at every 8th of the lengths besides (between two such times only
    the holder's use changes, which can change it too: a net for that, not a proof), and
    the job is named only if it is granted at all of them, from now on (none where the
    views name more than ``_MOMENTS_CHECKED`` such times: the host checks on every event
    while the lane is held)."""
    at_release = _AtRelease(policy, ready, resident, waiting_for, holder, granted_at)
    shortest = max(0.0, now - granted_at)
    longest = 2 * max(shortest, holder.mean_iteration or 0.0) + 0.001
    final = at_release.grants(longest)
    if final is None:
        return None
    if policy.reads_clock or any(now < other.until for other in waiting_for):
        moments = {moment - granted_at
                   for moment in _named_moments(ready, resident, waiting_for, holder)
                   if shortest < moment - granted_at < longest}
        if len(moments) > _MOMENTS_CHECKED:
            return None
        lengths = [shortest + (longest - shortest) * step / 8 for step in range(8)]
        lengths += [max(shortest, moment + nudge) for moment in sorted(moments)
                    for nudge in (-1e-6, 1e-6)]
        if all(at_release.is_granted(final, length) for length in lengths):
            return HandOver(final, granted_at)
        return None
    if armed is not None and armed[0] == final.id \
            and at_release.is_granted(final, max(shortest, armed[1] - granted_at)):
        return HandOver(final, armed[1])
    if at_release.is_granted(final, shortest):
        return HandOver(final, granted_at)
    usual = holder.mean_iteration
    if usual is None or usual <= shortest or not at_release.is_granted(final, usual):
        return None
    within = max(_HAND_OVER_WITHIN, usual / 32)
    early, late = shortest, usual  # not granted at early, granted at late
    while late - early > within:
        middle = (early + late) / 2
        if at_release.is_granted(final, middle):
            late = middle
        else:
            early = middle
    return HandOver(final, granted_at + late)


def _named_moments(ready: Sequence[JobView], resident: Sequence[JobView],
                   waiting_for: Sequence[Awaited], holder: JobView) -> list[float]:
    """The times the views name, where a decision that reads the clock may change: when a
    job in its gap is due back (and when a ready job's iteration would end just then), when
    a window to keep the lane ends, when a job's deadline passes or can no longer be made
    at its pace (gq.policies.deadline.feasible)."""
    backs = [back for job in resident if (back := expected_back(job)) is not None]
    moments = [*backs, *(other.until for other in waiting_for)]
    moments += [back - job.mean_iteration for back in backs
                for job in (*ready, *(other.view for other in waiting_for), holder)
                if job.mean_iteration is not None]
    for job in (*resident, holder):
        if job.deadline is not None:
            moments.append(job.deadline)
            if job.remaining is not None:
                moments.append(job.deadline - job.remaining)
    return moments


_MOMENTS_CHECKED = 16  # a lane whose views name more gets no hand-over from hand_over
_HAND_OVER_WITHIN = 0.00005  # how closely hand_over finds where its decision begins (s)


@dataclass(frozen=True)
class _AtRelease:
    """The free lane's decision at the release of ``holder``'s iteration, by its length."""

    policy: Policy
    ready: Sequence[JobView]
    resident: Sequence[JobView]
    waiting_for: Sequence[Awaited]
    holder: JobView
    granted_at: float

    def grants(self, length: float) -> JobView | None:
        """The job granted at the release of an iteration that lasted ``length`` (None: the
        lane is kept for the holder, or stays free)."""
        release = self.granted_at + length
        holder = self.holder
        released = dataclasses.replace(holder, attained=holder.attained + length,
                                       released_at=release)
        waits = [*self.waiting_for]
        if (own := awaited(released, release, holder.mean_gap)) is not None:
            waits.append(own)
        decision = next_step(self.policy, self.ready, [*self.resident, released], waits,
                             release)
        return decision.job if isinstance(decision, Grant) else None

    def is_granted(self, job: JobView, length: float) -> bool:
        granted = self.grants(length)
        return granted is not None and granted.id == job.id
