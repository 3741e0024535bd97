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

**People first.** A ready interactive job (a terminal's statement, a notebook's cell: a
person waits for it) within its owner's burst is granted before batch jobs, and before a
lane kept for one, unless the lane's last grant was such a turn and its run's time is over;
then the policy picks as usual. A run of turns may hold the lane for as long as the policy's
grant before it held it, one of its iterations at most, and at most the hold bound
(:class:`PeopleTurns`): the host leases it to the person for that long, so a statement of
short steps gets as much of the lane as the batch iteration between its runs, not one step
for each, and the person's pauses inside the run are its own lane time (billed to it, and to
its burst). A statement waits at most for the batch iteration in progress, and the turns
take at most every other grant, however many interactive jobs share the lane: a person
computing on and a batch job alternate by lane time under fifo (which would otherwise keep a
person waiting behind the whole batch job), and the policy's own order decides the grants
between (fair's gives a newcomer the lane until its attained time has caught up). Priority
leaves this to ``--priority`` (``people_first`` false).

The burst is the owner's, across their interactive jobs on the lane's device (a second
REPL, or a new one, starts on the same account): a person computes in bursts, and a user
whose interactive jobs used more than PEOPLE_SHARE of the lane over the last PEOPLE_HORIZON
seconds (decayed), counting the iteration about to be granted at its measured length, runs
batch jobs in disguise, which take the policy's turn until the use has fallen back. So a
REPL that trains without pause gets about that share from the turns, and batch jobs keep
the rest of what the policy gives them.

**A bounded hold.** A job keeps a lane it holds for as long as its iteration lasts, unless
another job waits that this rule, asked with the holder ready too, would grant instead
(:func:`overstays`); from then on the hold lasts at most ``--max-hold`` more, and then the
host takes the lane (the holder frozen inside its iteration, billed its whole hold, and
given the lane again, thawed, when the rule grants it next). An iteration that never ends
costs the others one bound at a time, as a policy orders them.

**A slice at a time.** Under a policy that alternates by lane time (fair), a holder whose
measured gaps are at most :data:`SLICE_GAP_SHARE` of its iterations may go on under its
lease beside the jobs it alternates with for a slice of lane time (``defaults.LEASE_SLICE``),
and the policy then picks again (:func:`sliced`): the shares stay what they were, taken a
slice at a time rather than an iteration at a time, and a switch through the host at
every boundary (a quarter of two 1 ms loops' time) is paid once a slice. Not where a person
waits, the holder's or another's (people first), nor where the holder's gaps are long
enough for another job's iteration to fill.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gq.defaults import LEASE_SLICE
from gq.policies.base import JobView, Policy, anticipation_window, expected_back, fits_before

PEOPLE_HORIZON = 60.0  # seconds over which a user's recent interactive use decays (by e)
PEOPLE_SHARE = 0.25  # the share of the lane that use may reach and still go first


def recent_use(previous: float, since: float, added: float) -> float:
    """Lane seconds used recently: ``previous``, reckoned ``since`` seconds ago and decayed
    since, plus ``added`` (a user who holds a share r of the lane tends to r * HORIZON)."""
    return previous * math.exp(-max(0.0, since) / PEOPLE_HORIZON) + max(0.0, added)


def within_burst(recent: float, next_iteration: float | None = None) -> bool:
    """Whether an interactive job whose owner used ``recent`` still goes first, its next
    iteration (its measured mean; unknown: nothing) counted."""
    return recent + (next_iteration or 0.0) < PEOPLE_SHARE * PEOPLE_HORIZON


@dataclass
class Burst:
    """A user's recent interactive use of a device's lanes (seconds, decayed), as of ``at``
    (monotonic)."""

    used: float = 0.0
    at: float = 0.0

    def add(self, seconds: float, now: float) -> None:
        self.used = recent_use(self.used, now - self.at, seconds)
        self.at = now


@dataclass
class PeopleTurns:
    """A lane's runs of people-first turns, timed by the granter's clock (monotonic). A run
    is owed as long as the policy's grant before it held the lane (to the moment the lane
    was first found free after it), at most one of that grantee's iterations as measured (or
    a slice, if longer or not measured: a lease of fair's, a first iteration), and at most
    the hold bound: a batch job leased the lane for an hour owes a person one iteration, and
    one whose first iteration is a long warm-up owes a slice. The run begins an iteration of
    its person's only where it is expected to end within what is owed (its measured mean),
    so a person whose steps are as long as the batch job's alternates with it one for one,
    and no run takes more than it is owed by more than one iteration's variance. No deficit
    is carried from one run to the next."""

    policy_at: float | None = None  # the policy's last grant
    iteration: float | None = None  # its grantee's mean iteration then, where measured
    freed: float | None = None  # the lane first found free after the last grant
    since: float | None = None  # the run of turns in progress began (None: the policy's)
    owed: float = 0.0  # seconds that run may hold the lane
    step: float = 0.0  # the longest mean iteration of the people granted in it (0: unmeasured)

    def free(self, now: float) -> None:
        """The lane is free at ``now`` (the first such moment after a grant counts)."""
        if self.freed is None:
            self.freed = now

    def granted(self, turn: bool, now: float, bound: float, iteration: float | None = None) -> None:
        """The lane was granted at ``now`` to a job of that mean ``iteration``: a
        people-first ``turn`` (a run begins, or the one in progress goes on), or the
        policy's grant."""
        if not turn:
            self.policy_at, self.iteration, self.since = now, iteration, None
        else:
            if self.since is None:
                held = 0.0
                if self.policy_at is not None and self.freed is not None:
                    held = max(0.0, self.freed - self.policy_at)
                # (unmeasured, as a lease alone on its lane from its first Go: a slice)
                held = min(held, max(self.iteration or 0.0, LEASE_SLICE))
                self.since, self.owed, self.step = now, min(held, bound), 0.0
            self.step = max(self.step, iteration or 0.0)  # (no later turn lengthens it)
        self.freed = None

    def left(self, now: float) -> float:
        """Seconds in which the run in progress may still begin an iteration (0: none is,
        or its time is over)."""
        if self.since is None:
            return 0.0
        return max(0.0, self.since + self.owed - self.step - now)

    def over(self, now: float) -> bool:
        """Whether the last grant was a turn and its run's time is over: the policy's next
        (the rule's ``after_turn``)."""
        return self.since is not None and self.left(now) == 0.0


@dataclass(frozen=True)
class Awaited:
    """A resident job in the gap after its iteration, that the lane may be kept for."""

    view: JobView
    until: float  # its release plus its anticipation window


@dataclass(frozen=True)
class Grant:
    job: JobView
    turn: bool = False  # a people-first turn: the next decision is the policy's own


@dataclass(frozen=True)
class KeepFor:
    job: JobView
    until: float


def awaited(view: JobView, released_at: float, mean_gap: float | None) -> Awaited | None:
    """The job just released as a candidate to keep the lane for; None where its gaps are
    long enough to fill, or not measured yet."""
    window = anticipation_window(mean_gap)
    return None if window is None else Awaited(view, released_at + window)


def next_step(
    policy: Policy,
    ready: Sequence[JobView],
    resident: Sequence[JobView],
    waiting_for: Sequence[Awaited],
    now: float,
    after_turn: bool = False,
) -> Grant | KeepFor | None:
    """The free lane's decision: a people-first turn for an interactive job within its
    burst, unless the lane's last grant was one (``after_turn``); else grant the ready job
    the policy picks, keep the lane for an awaited job the policy prefers to every ready one
    (until it is ready or ``until``) unless the pick's iteration is expected to end before
    that job is back, or nothing (no job ready, or the policy leaves the lane idle)."""
    if not ready:
        return None
    people = [view for view in ready if view.person_waits]
    if policy.people_first and people and not after_turn:
        # Among the people, the policy's order (fifo's too: the first of them, not the
        # first batch job, is what their turn is for).
        chosen = policy.pick(people, [view for view in resident if view.person_waits], now)
        if chosen is not None:
            return Grant(chosen, turn=True)
    chosen = policy.pick(ready, resident, now)
    live = [a for a in waiting_for if now < a.until]
    if live:
        preferred = policy.pick([*ready, *(a.view for a in live)], resident, now)
        for candidate in live:
            if (
                preferred is not None
                and candidate.view.id == preferred.id
                and not (
                    chosen is not None and fits_before(chosen, expected_back(candidate.view), now)
                )
            ):
                return KeepFor(candidate.view, candidate.until)
    return None if chosen is None else Grant(chosen)


def overstays(
    policy: Policy,
    holder: JobView,
    ready: Sequence[JobView],
    resident: Sequence[JobView],
    waiting_for: Sequence[Awaited],
    now: float,
    after_turn: bool = False,
) -> bool:
    """Whether the lane's holder is in another job's way: asked now, with the holder ready
    too, the rule would grant a ``ready`` job instead (not keep the lane, nor give it back
    to the holder)."""
    decision = next_step(policy, [*ready, holder], resident, waiting_for, now, after_turn)
    return isinstance(decision, Grant) and decision.job.id != holder.id


def undisputed(
    policy: Policy,
    holder: JobView,
    ready: Sequence[JobView],
    resident: Sequence[JobView],
    waiting_for: Sequence[Awaited],
    now: float,
    after_turn: bool = False,
) -> bool:
    """Whether none of the ``ready`` jobs could take the lane at any of its holder's
    boundaries: asked with the holder ready, the rule grants the holder, and asked while the
    holder is in a gap however long (no lane kept for it), it grants no one (fifo's head
    job; a higher priority whose gaps nothing fits, or with --fill never). Such a holder
    may cross its boundaries under a lease beside the jobs waiting (they lose nothing: the
    lane would not be theirs) until that changes: a new job, a policy, a person waiting."""
    others = [view for view in ready if view.id != holder.id]
    if not others:
        return True
    ready_too = next_step(policy, [*others, holder], resident, waiting_for, now, after_turn)
    if not (isinstance(ready_too, Grant) and ready_too.job.id == holder.id):
        return False
    in_gap = [awaited for awaited in waiting_for if awaited.view.id != holder.id]
    return next_step(policy, others, resident, in_gap, now, after_turn) is None


SLICE_GAP_SHARE = 0.1  # a holder's gaps, against its iterations, that a slice may hold idle


def sliced(policy: Policy, holder: JobView, ready: Sequence[JobView]) -> bool:
    """Whether ``holder`` may go on under its lease for a slice beside the ``ready`` jobs
    it alternates with: the policy alternates by lane time (a slice changes when each gets
    its share, not how much), no person waits for the holder or for any of them (people
    first: a statement must not wait out a slice), and the holder's measured gaps are at
    most :data:`SLICE_GAP_SHARE` of its iterations (the lane it keeps through them would
    hardly serve another job)."""
    return (
        policy.alternates
        and not holder.person_waits
        and not any(view.person_waits for view in ready if view.id != holder.id)
        and holder.mean_iteration is not None
        and holder.mean_gap is not None
        and holder.mean_gap <= SLICE_GAP_SHARE * holder.mean_iteration
    )
