"""Unit tests of the policies: pure objects over job views."""

from __future__ import annotations

import pytest

from gq import policies
from gq.defaults import LEASE_SLICE
from gq.policies import JobView
from gq.policies.base import anticipation_window
from gq.policies.priority import Priority


def view(id, **kw) -> JobView:
    kw.setdefault("submit_time", float(id))
    return JobView(id=id, **kw)


def test_make_rejects_unknown_names():
    with pytest.raises(ValueError):
        policies.make("lottery")
    with pytest.raises(ValueError):
        policies.make("priority", fill="sometimes")


def test_fifo_orders_by_submission_and_waits_for_the_first():
    fifo = policies.make("fifo")
    first, second = view(1), view(2)
    assert [j.id for j in fifo.order([second, first])] == [1, 2]
    assert fifo.pick([first, second], [first, second], 0).id == 1
    assert fifo.pick([second], [first, second], 0) is None  # not work-conserving
    assert fifo.pick([second], [second], 0).id == 2


def test_srtf_prefers_least_remaining_time():
    srtf = policies.make("srtf")
    long = view(1, steps_total=300, steps_done=10, mean_iteration=0.01)  # 2.9 s left
    short = view(2, steps_total=30, steps_done=0, mean_iteration=0.01)  # 0.3 s left
    assert srtf.pick([long, short], [long, short], 0).id == 2
    assert srtf.pick([long], [long, short], 0).id == 1  # work-conserving


def test_srtf_uses_measured_iteration_time_not_just_steps():
    srtf = policies.make("srtf")
    many_fast = view(1, steps_total=100, mean_iteration=0.001)  # 0.1 s
    few_slow = view(2, steps_total=10, mean_iteration=0.1)  # 1 s
    assert srtf.pick([many_fast, few_slow], [], 0).id == 1


def test_srtf_unknown_totals_go_last_least_attained_first():
    srtf = policies.make("srtf")
    known = view(1, steps_total=1000, mean_iteration=1.0)
    las_a = view(2, attained=5.0)
    las_b = view(3, attained=1.0)
    assert srtf.pick([las_a, las_b, known], [], 0).id == 1
    assert srtf.pick([las_a, las_b], [], 0).id == 3
    assert [j.id for j in srtf.order([las_a, view(4, steps_total=5), known])] == [4, 1, 2]


def test_fair_balances_users_then_jobs():
    fair = policies.make("fair")
    ann1 = view(1, user="ann", attained=3.0)
    ann2 = view(2, user="ann", attained=3.0)
    bob = view(3, user="bob", attained=4.0)
    resident = [ann1, ann2, bob]
    # ann holds 6 s over two jobs, bob 4 s: bob's job goes next although it has more alone.
    assert fair.pick(resident, resident, 0).id == 3
    less = view(2, user="ann", attained=1.0)
    assert fair.pick([ann1, less], [ann1, less], 0).id == 2


def test_fair_admission_interleaves_users():
    fair = policies.make("fair")
    jobs = [view(1, user="ann"), view(2, user="ann"), view(3, user="ann"), view(4, user="bob")]
    assert [j.id for j in fair.order(jobs)] == [1, 4, 2, 3]


def test_priority_always_fills_idle_time():
    policy = Priority("always")
    high = view(1, priority=10)
    low = view(2, priority=0)
    assert policy.pick([high, low], [high, low], 0).id == 1
    assert policy.pick([low], [high, low], 0).id == 2
    assert [j.id for j in policy.order([low, high])] == [1, 2]


def test_priority_equal_levels_share_by_attained_time():
    policy = Priority("always")
    a = view(1, attained=2.0)
    b = view(2, attained=1.0)
    assert policy.pick([a, b], [a, b], 0).id == 2


def test_priority_never_leaves_lane_idle_for_idle_high_job():
    policy = Priority("never")
    high = view(1, priority=10)
    low = view(2, priority=0)
    assert policy.pick([low], [high, low], 0) is None
    assert policy.pick([low], [low], 0).id == 2


def test_priority_gapfit_admits_only_iterations_that_fit_the_gap():
    policy = Priority("gapfit")
    high = view(1, priority=10, released_at=100.0, mean_gap=0.020)  # back at 100.020
    short = view(2, mean_iteration=0.005)
    long = view(3, mean_iteration=0.050)
    assert policy.pick([short], [high, short], 100.001).id == 2
    assert policy.pick([long], [high, long], 100.001) is None
    assert policy.pick([short], [high, short], 100.018) is None  # too late to fit
    assert policy.pick([long], [high, long], 100.5).id == 3  # high overdue: don't waste
    unmeasured = view(4)
    assert policy.pick([unmeasured], [high, unmeasured], 100.001).id == 4  # learn first


@pytest.mark.parametrize("name", policies.NAMES)
def test_every_policy_picks_nothing_from_nothing(name):
    assert policies.make(name).pick([], [view(1)], 0) is None
    assert policies.make(name).order([]) == []


def test_rr_gives_each_job_its_quantum_in_turn():
    from gq.policies.rr import parse_quantum

    rr = policies.make("rr", quantum="100ms")
    a = JobView(id=1, submit_time=1.0, attained=0.25)  # in its third quantum
    b = JobView(id=2, submit_time=2.0, attained=0.12)  # in its second
    assert rr.pick([a, b], [a, b], 0.0).id == 2  # the one behind catches up first
    b2 = JobView(id=2, submit_time=2.0, attained=0.21)  # both in their third quantum now
    assert rr.pick([a, b2], [a, b2], 0.0).id == 1  # earliest submitted keeps its turn
    by_steps = policies.make("rr", quantum="10it")
    c, d = JobView(id=3, steps_done=19), JobView(id=4, steps_done=20, submit_time=-1.0)
    assert by_steps.pick([c, d], [c, d], 0.0).id == 3
    assert parse_quantum("2s") == (2.0, False) and parse_quantum("10it") == (10.0, True)
    for bad in ("", "0s", "-1ms", "10", "fast"):
        with pytest.raises(ValueError, match="invalid quantum"):
            parse_quantum(bad)


def test_deadline_policy_is_earliest_deadline_first_and_puts_lost_causes_after():
    edf = policies.make("deadline")
    soon = JobView(id=1, submit_time=2.0, deadline=100.0)
    later = JobView(id=2, submit_time=1.0, deadline=200.0)
    none = JobView(id=3, submit_time=0.0)
    assert [j.id for j in edf.order([none, later, soon])] == [1, 2, 3]
    assert edf.pick([none, later, soon], [], 0.0).id == 1
    # 50 steps of 3 s left cannot end by 100: the job that can still make it goes first
    lost = JobView(
        id=1, submit_time=2.0, deadline=100.0, steps_done=50, steps_total=100, mean_iteration=3.0
    )
    assert edf.pick([lost, later], [], 0.0).id == 2


def test_deadline_spellings():
    from datetime import datetime

    from gq.errors import UserError
    from gq.units import parse_when

    now = datetime(2026, 11, 21, 15, 30).timestamp()
    assert parse_when("now+90", now) == now + 90
    assert parse_when("now+2hours", now) == now + 7200
    assert parse_when("2026-12-01T10:00", now) == datetime(2026, 12, 1, 10).timestamp()
    assert parse_when("16:00", now) == datetime(2026, 11, 21, 16).timestamp()
    assert parse_when("09:00", now) == datetime(2026, 11, 22, 9).timestamp()
    assert parse_when("midnight", now) == datetime(2026, 11, 22).timestamp()
    for bad in ("soon", "now+5parsecs", "2026-13-01", "25:00"):
        with pytest.raises(UserError, match="invalid --deadline"):
            parse_when(bad, now)


@pytest.mark.parametrize(
    "name,quantum", [("priority", "100ms"), ("fair", "100ms"), ("rr", "100ms"), ("rr", "2it")]
)
def test_turn_taking_policies_pick_the_least_turn_key_among_their_sharers(name, quantum):
    """What the simulator settles in closed form is what ``pick`` does one grant at a time."""
    import random

    from gq.policies.base import TakesTurns, turn_key

    rng = random.Random(5)
    policy = policies.make(name, quantum=quantum)
    assert isinstance(policy, TakesTurns)
    for _ in range(300):
        ready = [
            JobView(
                id=i,
                submit_time=rng.choice([0.0, 1.0, 2.0]),
                user=rng.choice("ab"),
                priority=rng.randrange(3),
                steps_done=rng.randrange(6),
                attained=rng.choice([0.0, 0.05, 0.1, 0.15, 0.5, 3.0]),
            )
            for i in range(rng.randint(1, 6))
        ]
        sharers = policy.sharers(ready)
        expected = min(sharers, key=lambda j: turn_key(policy, j, ready))
        assert policy.pick(ready, ready, 0.0).id == expected.id
        if name == "priority":
            assert {j.priority for j in sharers} == {max(j.priority for j in ready)}


def test_iterations_to_turn_is_the_least_count_that_reaches_the_turn():
    import random

    from gq.policies.base import iterations_to_turn, turn_of

    rng = random.Random(8)
    for _ in range(2000):
        quantum = rng.choice([0.0, 0.1, 0.25, 3.0])
        per = rng.choice([0.01, 0.1, 0.3, 1.0, 0.07])
        service = rng.choice([0.0, 0.3, 1.0, 2.9]) + rng.randrange(5) * per
        turn = rng.randrange(0, 40) if quantum else rng.uniform(0, 10)
        count = iterations_to_turn(service, per, quantum, turn)
        assert turn_of(service + count * per, quantum) >= turn
        assert count == 0 or turn_of(service + (count - 1) * per, quantum) < turn


# ----- a free lane's next step (gq.exec.lane.rule: the host's rule and the simulator's) -----
def test_a_free_lane_is_kept_for_a_preferred_job_in_a_gap_too_short_to_fill():
    from gq.exec.lane import rule as lane

    rule = policies.make("priority")
    high, low = view(1, priority=5), view(2)
    in_gap = lane.awaited(high, released_at=10.0, mean_gap=0.001)
    assert in_gap is not None and in_gap.until == 10.0 + anticipation_window(0.001)
    # Nothing else ready: nothing to decide, whatever is awaited.
    assert lane.next_step(rule, [], [high, low], [in_gap], 10.001) is None
    # The low job became ready in the high one's gap (nothing was ready at its release).
    assert lane.next_step(rule, [low], [high, low], [in_gap], 10.001) == lane.KeepFor(
        high, in_gap.until
    )
    # ... and is granted once the window has passed.
    assert lane.next_step(rule, [low], [high, low], [in_gap], in_gap.until) == lane.Grant(low)


@pytest.mark.parametrize("policy", ["fair", "priority"])
def test_a_free_lane_is_granted_to_a_job_whose_iteration_fits_in_the_awaited_gap(policy):
    """Two jobs with short iterations and millisecond gaps run in each other's gaps: the lane
    is kept for the preferred job in its gap only where the ready job's iteration would
    not end before that job is expected back (its release plus its gap)."""
    from gq.exec.lane import rule as lane

    rule = policies.make(policy)
    preferred = view(
        1, priority=5, attained=1.0, mean_iteration=0.0002, mean_gap=0.001, released_at=10.0
    )
    in_gap = lane.awaited(preferred, released_at=10.0, mean_gap=0.001)
    short, long, unknown = (
        view(2, attained=2.0, mean_iteration=iteration) for iteration in (0.0002, 0.005, None)
    )
    for other, kept in ((short, False), (long, True), (unknown, True)):
        decision = lane.next_step(rule, [other], [preferred, other], [in_gap], 10.0001)
        assert decision == (lane.KeepFor(preferred, in_gap.until) if kept else lane.Grant(other)), (
            other
        )
    # It fits by what is left of the gap: late in it, the short job no longer does.
    assert lane.next_step(rule, [short], [preferred, short], [in_gap], 10.0009) == lane.KeepFor(
        preferred, in_gap.until
    )


def test_a_free_lane_is_not_kept_for_a_job_the_policy_does_not_prefer_or_a_long_gap():
    from gq.exec.lane import rule as lane

    rule = policies.make("priority")
    high, low = view(1, priority=5), view(2)
    low_in_gap = lane.awaited(low, released_at=10.0, mean_gap=0.001)
    assert lane.next_step(rule, [high], [high, low], [low_in_gap], 10.001) == lane.Grant(high)
    assert lane.awaited(high, released_at=10.0, mean_gap=1.0) is None  # long enough to fill
    assert lane.awaited(high, released_at=10.0, mean_gap=None) is None  # not measured yet
    # A policy that leaves the lane idle leaves it idle (priority with fill off).
    strict = policies.make("priority", fill="never")
    assert lane.next_step(strict, [low], [high, low], [], 10.001) is None


@pytest.mark.parametrize("policy", ["fifo", "fair", "srtf", "rr", "deadline"])
def test_an_interactive_job_goes_first_every_other_grant_and_batch_jobs_keep_the_rest(policy):
    """A person's statement waits for at most the batch iteration in progress; while it
    computes on, batch jobs still get at least every other grant."""
    from gq.exec.lane import rule as lane

    rule = policies.make(policy)
    batch = view(1, submit_time=0.0, attained=0.0, mean_iteration=0.1, steps_total=10)
    person = view(2, submit_time=5.0, attained=50.0, mean_iteration=0.1, person_waits=True)
    grants, turn = [], False
    for _ in range(8):
        decision = lane.next_step(rule, [batch, person], [batch, person], [], 10.0, after_turn=turn)
        assert isinstance(decision, lane.Grant), decision
        grants.append(decision.job.id)
        turn = decision.turn
    assert grants[0] == 2  # nothing granted before: the person first
    assert all(2 in grants[i : i + 2] for i in range(0, 8, 2))  # and every other grant on
    assert all(1 in grants[i : i + 3] for i in range(6))  # never two turns of the person's in a row
    # Ahead of a lane kept for a batch job in its short gap, too.
    in_gap = lane.awaited(batch, released_at=10.0, mean_gap=0.001)
    assert lane.next_step(rule, [person], [batch, person], [in_gap], 10.0001) == lane.Grant(
        person, turn=True
    )


@pytest.mark.parametrize("policy", ["fifo", "fair"])
def test_several_interactive_jobs_share_one_turn_in_two(policy):
    """Two REPLs (or three) cannot hand the lane to each other turn after turn: after a
    people-first turn, whoever it went to, the policy picks; under fifo that is the batch
    job submitted first, so it gets every other grant."""
    from gq.exec.lane import rule as lane

    rule = policies.make(policy)
    batch = view(1, submit_time=0.0, attained=5.0, mean_iteration=0.1)
    people = [view(i, submit_time=5.0 + i, attained=9.0, person_waits=True) for i in (2, 3, 4)]
    grants, turn = [], False
    for _ in range(12):
        decision = lane.next_step(
            rule, [batch, *people], [batch, *people], [], 10.0, after_turn=turn
        )
        assert isinstance(decision, lane.Grant), decision
        grants.append(decision.job.id)
        turn = decision.turn
    assert grants.count(1) == 6 and grants[1::2] == [1] * 6, grants


def test_priority_leaves_an_interactive_job_to_its_priority():
    from gq.exec.lane import rule as lane

    rule = policies.make("priority")
    high = view(1, priority=5)
    person = view(2, person_waits=True)
    assert lane.next_step(rule, [high, person], [high, person], [], 10.0) == lane.Grant(high)
    # Alone among the ready, an interactive job is simply granted, under any policy.
    assert lane.next_step(rule, [person], [high, person], [], 10.0) == lane.Grant(person)


def test_an_interactive_job_goes_first_only_within_its_burst():
    """A REPL that trains without pause is a batch job in disguise: once its recent use of
    the lane passes PEOPLE_SHARE, it takes the policy's turn, and it goes first again once
    its use has decayed."""
    from gq.exec.lane import rule as lane

    assert lane.within_burst(0.0)
    used = 0.0
    for _ in range(600):  # holding the whole lane, second by second
        used = lane.recent_use(used, 1.0, 1.0)
    assert not lane.within_burst(used)
    assert abs(used - lane.PEOPLE_HORIZON) < 1.0  # a share of 1 tends to the horizon
    for _ in range(600):  # a quarter of it less a little: still first
        used = lane.recent_use(used, 1.0, lane.PEOPLE_SHARE * 0.95)
    assert lane.within_burst(used)
    assert lane.recent_use(10.0, -5.0, -3.0) == 10.0  # a clock or a figure gone backwards
    late = lane.recent_use(lane.PEOPLE_HORIZON, lane.PEOPLE_HORIZON * 2, 0.0)
    assert lane.within_burst(late)  # two horizons idle: first again
    # The iteration about to be granted counts at its measured length: a statement that
    # held the lane ten minutes does not go first again until that has decayed.
    assert not lane.within_burst(0.0, next_iteration=600.0)
    burst = lane.Burst(at=0.0)
    burst.add(600.0, 600.0)
    burst.add(0.0, 600.0 + 60.0)
    assert not lane.within_burst(burst.used)
    burst.add(0.0, 600.0 + 60.0 * 4)
    assert lane.within_burst(burst.used)


def _lane_by_time(policy: str, step: float, gap: float, batch_iteration: float, until: float):
    """A lane shared by a batch job (iterations of ``batch_iteration`` s, no gaps) and a
    person whose statement runs steps of ``step`` s with ``gap`` s between, driven through
    the rule and its PeopleTurns as the host drives them (a run of turns leased to the person
    for its time, its gaps included, asked back as the time is over): each one's lane time."""
    from gq.exec.lane import rule as lane

    rule, turns, bound = policies.make(policy), lane.PeopleTurns(), 2.0
    batch = view(1, submit_time=0.0, mean_iteration=batch_iteration)
    person = view(2, submit_time=5.0, mean_iteration=step, person_waits=True)
    held, now = {1: 0.0, 2: 0.0}, 0.0
    while now < until:
        turns.free(now)
        decision = lane.next_step(rule, [batch, person], [batch, person], [], now, turns.over(now))
        assert isinstance(decision, lane.Grant), decision
        turns.granted(decision.turn, now, bound, decision.job.mean_iteration)
        start = now
        if decision.job.id == 1:
            now += batch_iteration
        else:  # its lease: step after step, the gaps its own, until the run's time is up
            now += step
            while turns.left(now) > 0:
                now += gap + step
        held[decision.job.id] += now - start
    return held


@pytest.mark.parametrize("policy", ["fifo", "srtf", "rr", "deadline"])
def test_a_persons_short_steps_get_the_lane_by_time_not_one_step_a_batch_iteration(policy):
    """A statement of 5 ms steps beside a batch job of 50 ms iterations: each run of the
    person's turns lasts about as long as the batch iteration before it, so the two share
    the lane about half and half (one step each, the statement would get a tenth)."""
    held = _lane_by_time(policy, step=0.005, gap=0.0002, batch_iteration=0.05, until=10.0)
    share = held[2] / (held[1] + held[2])
    assert 0.45 <= share <= 0.5, held


@pytest.mark.parametrize("step", [0.03, 0.05, 0.2])
def test_a_run_of_turns_begins_no_step_that_would_take_more_than_it_is_owed(step):
    """Steps as long as the batch job's (or longer) alternate with it one for one; steps of
    30 ms beside 50 ms iterations get one each too: a second would end past the run's due,
    which would give the person more of the lane than the batch job."""
    held = _lane_by_time("fifo", step=step, gap=0.0002, batch_iteration=0.05, until=10.0)
    runs = held[2] / step  # the person's steps, one a run
    assert held[1] == pytest.approx(runs * 0.05, rel=0.02), held


def test_a_person_who_keeps_the_lane_idle_is_billed_the_idle_time_and_gets_no_more():
    """Empty steps with 19 ms gaps: the run is timed by the clock, the gaps included (the
    host bills the lease's wall time to the person, and to their burst), so the batch job
    keeps half the lane, however little the person computes in it."""
    held = _lane_by_time("fifo", step=0.0, gap=0.019, batch_iteration=0.05, until=10.0)
    assert held[1] / (held[1] + held[2]) >= 0.45, held


def test_a_run_of_turns_is_owed_the_policys_last_hold_one_iteration_at_most():
    """A batch job leased the lane for an hour owes a person one of its iterations (a slice
    if longer), and one alone on its lane from its first Go, or warming up for 30 s, its
    iterations not measured, a slice; never more than the hold bound. A turn with no
    policy's grant before it is one iteration; a turn granted while a run goes on continues
    it, no longer for a later person's longer steps; the policy's grant ends it."""
    from gq.exec.lane import rule as lane

    turns = lane.PeopleTurns()
    turns.granted(True, 0.0, bound=2.0)  # a person alone: nothing is owed beyond its step
    assert turns.over(0.0) and turns.left(0.0) == 0.0
    turns.granted(False, 1.0, bound=2.0)  # a lone lease, its mean unknown at its Go
    turns.free(3601.0)  # asked back an hour on, as a person asks
    turns.free(3602.0)  # (the first moment found free counts)
    turns.granted(True, 3601.0, bound=2.0)
    assert turns.left(3601.0) == pytest.approx(LEASE_SLICE)
    turns.granted(False, 4000.0, bound=2.0, iteration=1.5)  # leased an hour, 1.5 s a step
    turns.free(7600.0)
    turns.granted(True, 7600.0, bound=2.0)
    assert turns.left(7600.0) == pytest.approx(1.5) and not turns.over(7601.0)
    turns.granted(True, 7601.0, bound=2.0, iteration=0.1)  # another person, within the run
    assert turns.left(7601.0) == pytest.approx(0.4) and turns.over(7601.4)
    turns.granted(True, 7601.4, bound=2.0)  # an unmeasured one: the run is no longer for it
    assert turns.over(7601.4)
    turns.granted(False, 7602.0, bound=2.0)
    assert not turns.over(7700.0) and turns.left(7602.0) == 0.0
    turns.granted(False, 8000.0, bound=2.0, iteration=30.0)  # a long iteration: the bound
    turns.free(8030.0)
    turns.granted(True, 8030.0, bound=2.0)
    assert turns.left(8030.0) == pytest.approx(2.0)
    turns.granted(False, 9000.0, bound=2.0, iteration=0.001)  # fair's slice of 1 ms steps
    turns.free(9000.5)
    turns.granted(True, 9000.5, bound=2.0)
    assert turns.left(9000.5) == pytest.approx(LEASE_SLICE)


def test_fair_counts_a_users_past_use_beside_their_resident_jobs():
    """A user's jobs that ended (or run elsewhere) count: bob's new job, with 10 s used
    before it, waits behind ann's job of 4 s attained, though it has attained nothing."""
    fair = policies.make("fair")
    ann = view(1, user="ann", attained=4.0)
    bob = view(2, user="bob", attained=0.0, user_usage=10.0)
    assert fair.pick([ann, bob], [ann, bob], 0).id == 1
    lighter = view(2, user="bob", user_usage=3.0)
    assert fair.pick([ann, lighter], [ann, lighter], 0).id == 2


def test_fair_counts_a_resident_side_by_side_at_what_its_owner_was_charged():
    """The host ranks users by what the daemon charges them: ann's job, 6 s on a lane of its
    own at half the device, was charged 3 s, so it is picked before bob's of 4 s; a charge
    above the lane time is not believed."""
    fair = policies.make("fair")
    ann = view(1, user="ann", attained=6.0, charged=3.0)
    bob = view(2, user="bob", attained=4.0)
    assert fair.pick([ann, bob], [ann, bob], 0).id == 1
    inflated = view(1, user="ann", attained=6.0, charged=60.0)
    assert fair.pick([inflated, bob], [inflated, bob], 0).id == 2


def test_fair_admission_puts_the_user_who_used_least_first_in_each_round():
    fair = policies.make("fair")
    jobs = [view(1, user="ann"), view(2, user="ann"), view(3, user="bob"), view(4, user="bob")]
    assert [j.id for j in fair.order(jobs)] == [1, 3, 2, 4]
    assert [j.id for j in fair.order(jobs, {"ann": 50.0, "bob": 1.0})] == [3, 1, 4, 2]


def test_usage_halves_every_half_life_and_never_decays_without_one():
    from gq.policies.fair import decayed

    assert decayed(8.0, 0.0, 10.0) == 8.0
    assert decayed(8.0, 10.0, 10.0) == pytest.approx(4.0)
    assert decayed(8.0, 30.0, 10.0) == pytest.approx(1.0)
    assert decayed(8.0, 1e9, float("inf")) == 8.0
    assert decayed(8.0, -5.0, 10.0) == 8.0  # a clock that went back decays nothing


@pytest.mark.parametrize("name", ["fair", "srtf", "priority", "rr", "deadline"])
def test_a_holder_is_in_the_way_once_the_policy_prefers_a_waiting_job(name):
    """The bounded hold's question (gq.exec.lane.rule.overstays): asked with the holder ready
    too, would the lane rule grant a waiting job instead?"""
    from gq.exec.lane.rule import overstays

    policy = policies.make(name)
    holder = view(1, user="ann", attained=30.0, priority=0, steps_total=10**6, steps_done=1)
    holder = JobView(**{**holder.__dict__, "mean_iteration": 30.0, "deadline": 10**9})
    waiting = view(2, user="bob", priority=5, steps_total=200, mean_iteration=0.01, deadline=50.0)
    assert overstays(policy, holder, [waiting], [holder, waiting], [], 0.0)
    # The holder the policy prefers to every waiting job keeps its lane (its own quantum
    # aside: rr's turns are the bound it takes then).
    light = JobView(**{**holder.__dict__, "attained": 0.0, "priority": 9, "steps_done": 10**6 - 1})
    light = JobView(**{**light.__dict__, "mean_iteration": 0.001, "deadline": 1.0})
    heavy = JobView(**{**waiting.__dict__, "attained": 60.0, "priority": 0})
    if name != "rr":
        assert not overstays(policy, light, [heavy], [light, heavy], [], 0.0)


def test_fifos_head_job_is_never_in_the_way_of_those_behind_it():
    from gq.exec.lane.rule import overstays

    fifo = policies.make("fifo")
    head, behind = view(1, attained=100.0), view(2)
    assert not overstays(fifo, head, [behind], [head, behind], [], 0.0)
    assert overstays(fifo, behind, [head], [head, behind], [], 0.0)


def test_a_holder_none_of_the_waiting_jobs_could_take_the_lane_from_is_undisputed():
    """Whether a lease may go on beside jobs ready for the lane (gq.exec.lane.rule.undisputed):
    fifo's head, and a higher priority whose gaps no lower iteration fits or that is never
    filled, hold it whatever the waiting jobs do; a job fair would switch from, a holder a
    lower job fills the gaps of, fifo's second job and a person waiting do not."""
    from gq.exec.lane.rule import undisputed

    head, behind = view(1, attained=100.0), view(2)
    fifo = policies.make("fifo")
    assert undisputed(fifo, head, [behind], [head, behind], [], 0.0)
    assert not undisputed(fifo, behind, [head], [head, behind], [], 0.0)
    assert undisputed(fifo, head, [], [head, behind], [], 0.0)  # nobody waits
    person = JobView(**{**behind.__dict__, "person_waits": True})
    assert not undisputed(fifo, head, [person], [head, person], [], 0.0)
    fair = policies.make("fair")
    assert not undisputed(fair, head, [behind], [head, behind], [], 0.0)
    # The high job released the lane at 0.0 and is back 5 ms later, as it measured.
    high = view(1, priority=9, mean_iteration=0.01, mean_gap=0.005, released_at=0.0)
    low = view(2, priority=0, mean_iteration=0.05)
    short_low = JobView(**{**low.__dict__, "mean_iteration": 0.001})
    for fill, long_low, fitting_low in (
        ("never", True, True),
        ("gapfit", True, False),
        ("always", False, False),
    ):
        priority = policies.make("priority", fill=fill)
        assert undisputed(priority, high, [low], [high, low], [], 0.001) == long_low, fill
        got = undisputed(priority, high, [short_low], [high, short_low], [], 0.001)
        assert got == fitting_low, fill
    # Past its expected return, gapfit fills (the lane would idle): disputed.
    assert not undisputed(
        policies.make("priority", fill="gapfit"), high, [low], [high, low], [], 1.0
    )


def test_under_fair_a_holder_whose_gaps_nothing_could_fill_keeps_its_lease_a_slice():
    """gq.exec.lane.rule.sliced: fair alternates by lane time, so a holder whose measured
    gaps are at most a tenth of its iterations may go on under its lease for a slice beside
    the jobs it alternates with; not with longer or unmeasured gaps, not where a person
    waits (for one of them, or for the holder itself: people first), not under policies
    that do not alternate (they say it through undisputed)."""
    from gq.exec.lane.rule import SLICE_GAP_SHARE, sliced

    fair = policies.make("fair")
    holder = view(1, mean_iteration=0.001, mean_gap=0.00005)
    other = view(2, mean_iteration=0.001, mean_gap=0.00005)
    assert sliced(fair, holder, [other])
    assert sliced(fair, holder, [])  # (nobody beside it: a lease needs no slice, but holds)
    at_most = JobView(**{**holder.__dict__, "mean_gap": SLICE_GAP_SHARE * 0.001})
    assert sliced(fair, at_most, [other])
    for change in ({"mean_gap": 0.0005}, {"mean_gap": None}, {"mean_iteration": None}):
        assert not sliced(fair, JobView(**{**holder.__dict__, **change}), [other]), change
    person = JobView(**{**other.__dict__, "person_waits": True})
    assert not sliced(fair, holder, [other, person])
    # Nor for a holder a person waits for: its people-first turns are an iteration each,
    # at most every other grant, not a slice of them.
    assert not sliced(fair, JobView(**{**holder.__dict__, "person_waits": True}), [other])
    for name in ("fifo", "srtf", "priority", "deadline", "rr"):
        assert not sliced(policies.make(name), holder, [other]), name


def test_preemption_moves_out_the_least_memory_that_frees_enough():
    from gq.daemon.scheduling.preemption import Candidate, victims

    residents = [
        Candidate(1, priority=0, frees=600, used_at=10.0),
        Candidate(2, priority=0, frees=300, used_at=20.0),
        Candidate(3, priority=0, frees=350, used_at=5.0),
        Candidate(4, priority=9, frees=900, used_at=1.0),  # not below the job: never
    ]
    assert victims(0, 5, residents) == []  # nothing short: nobody
    assert victims(280, 5, residents) == [2]  # the least that frees enough
    assert victims(320, 5, residents) == [3]
    assert victims(620, 5, residents) == [2, 3]  # 650 beats 600+300 and 600+350
    assert victims(1300, 5, residents) is None  # even all below it free too little
    # Alike in memory and count: the one least recently used goes.
    tied = [Candidate(7, 0, 500, used_at=50.0), Candidate(8, 0, 500, used_at=40.0)]
    assert victims(400, 1, tied) == [8]
    assert victims(400, 0, tied) is None  # of the same priority: no one
