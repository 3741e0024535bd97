"""Rotation's decisions (gq.daemon.scheduling.rotation, pure): who goes out, who comes in,
and, over a simulated sequence of passes, that every job gets its turns."""

from __future__ import annotations

from collections import Counter, defaultdict

from gq.daemon.scheduling.rotation import LIGHT_TURNS, Lane, Resident, Waiter, plan, queue, room

LANE = ("gpu0", 0)


def _resident(job_id: int, began: float, frees: int = 1, user: str = "ann", movable=True):
    return Resident(job_id, user, began, frees, movable)


def test_only_turns_that_lasted_the_period_go_and_the_oldest_first_just_enough():
    residents = [_resident(1, 5.0), _resident(2, 0.0), _resident(3, 2.0), _resident(4, 9.5)]
    assert room(1, residents, period=1.0, now=10.0) == (2,)
    assert room(2, residents, period=1.0, now=10.0) == (2, 3)
    assert room(3, residents, period=1.0, now=10.0) == (2, 3, 1)  # not 4: its turn is young
    assert room(4, residents, period=1.0, now=10.0) is None
    assert room(0, residents, period=1.0, now=10.0) == ()


def test_a_job_whose_memory_cannot_move_is_never_chosen():
    residents = [_resident(1, 0.0, movable=False), _resident(2, 3.0)]
    assert room(1, residents, period=1.0, now=10.0) == (2,)
    assert room(2, residents, period=1.0, now=10.0) is None


def test_under_fair_the_user_who_used_most_goes_first_and_a_lighter_one_stays_a_while():
    usage = {"ann": 100.0, "bob": 10.0, "cat": 50.0}
    residents = [_resident(1, 0.0, user="bob"), _resident(2, 5.0, user="ann")]
    assert room(1, residents, 1.0, 10.0, usage, user="cat") == (2,)
    # For a heavier user's job, bob's resident stays until its turn is LIGHT_TURNS long.
    bob_only = [_resident(1, 0.0, user="bob")]
    assert room(1, bob_only, 4.0, 4.0 * LIGHT_TURNS - 0.5, usage, user="ann") is None
    assert room(1, bob_only, 4.0, 4.0 * LIGHT_TURNS, usage, user="ann") == (1,)
    # Under rr (no usage) only the turns count.
    assert room(1, residents, 1.0, 10.0) == (1,)


def test_the_longest_waiting_comes_in_first_a_rotated_job_before_newer_ones():
    pending_old = Waiter(10, "ann", since=1.0)
    rotated = Waiter(11, "ann", since=5.0)  # went out at 5
    pending_new = Waiter(12, "ann", since=7.0)
    assert [w.job_id for w in queue([pending_new, rotated, pending_old])] == [10, 11, 12]
    # Under fair, the lighter user first.
    usage = {"ann": 9.0, "bob": 1.0}
    bob = Waiter(13, "bob", since=8.0)
    assert [w.job_id for w in queue([pending_new, bob, rotated], usage)] == [13, 11, 12]


def test_the_first_in_line_keeps_its_lanes_from_smaller_jobs_behind_it():
    lane = Lane(*LANE, residents=(_resident(1, 0.0, frees=2), _resident(2, 9.5, frees=2)))
    big = Waiter(10, "ann", since=1.0, short={LANE: 4})  # needs both out: 2's turn is young
    small = Waiter(11, "ann", since=2.0, short={LANE: 1})
    assert plan([lane], [small, big], period=1.0, now=10.0) == []
    later = plan([lane], [small, big], period=1.0, now=11.0)
    assert [(r.incoming, r.out) for r in later] == [(10, (1, 2))]


def test_a_job_that_fits_comes_in_and_a_busy_device_moves_nothing_more():
    other = ("gpu1", 0)
    lanes = [
        Lane(*LANE, residents=(_resident(1, 0.0),), busy=True),
        Lane(*other, residents=(_resident(2, 0.0),)),
    ]
    back = Waiter(10, "ann", since=1.0, short={LANE: 0})  # its room is free again
    waiting = Waiter(11, "ann", since=2.0, short={LANE: 1})
    elsewhere = Waiter(12, "ann", since=3.0, short={LANE: 1, other: 1})
    rotations = plan(lanes, [elsewhere, waiting, back], period=1.0, now=10.0)
    assert [(r.incoming, r.lane, r.out) for r in rotations] == [(10, LANE, ()), (12, other, (2,))]


def _simulate(users: dict[int, str], room_for: int, period: float, passes: int, fair: bool):
    """Jobs of one unit each on a lane of ``room_for`` units, a pass a second, moves at
    once; the jobs never end. Each job's seconds resident, and its turns."""
    resident: dict[int, float] = {}  # job -> when its turn began
    waiting: dict[int, float] = {}  # job -> since when it waits
    for job_id in users:
        if len(resident) < room_for:
            resident[job_id] = 0.0
        else:
            waiting[job_id] = job_id / 1000  # submitted in id order
    seconds: Counter[int] = Counter()
    turns = Counter(resident)
    usage: defaultdict[str, float] = defaultdict(float)
    for now in range(1, passes + 1):
        present = {users[j] for j in resident}
        for job_id in resident:
            seconds[job_id] += 1
        for user in present:  # the lane's second, shared by the users resident
            usage[user] += 1 / len(present)
        here = tuple(_resident(j, began, 1, users[j]) for j, began in resident.items())
        lane = Lane(*LANE, residents=here)
        free = room_for - len(resident)
        waiters = [Waiter(j, users[j], s, {LANE: 1 - free}) for j, s in waiting.items()]
        for rotation in plan([lane], waiters, period, float(now), dict(usage) if fair else None):
            for job_id in rotation.out:
                del resident[job_id]
                waiting[job_id] = float(now)
            del waiting[rotation.incoming]
            resident[rotation.incoming] = float(now)
            turns[rotation.incoming] += 1
    return seconds, turns


def test_five_jobs_with_room_for_two_all_get_turns_of_the_period_and_equal_time():
    seconds, turns = _simulate(dict.fromkeys(range(1, 6), "ann"), 2, 10.0, 500, fair=False)
    assert set(seconds) == set(range(1, 6))
    assert max(seconds.values()) - min(seconds.values()) <= 10  # 200 s each, of 1000
    assert sum(seconds.values()) == 1000  # the room never idle
    assert min(turns.values()) >= 19 and max(turns.values()) <= 21


def test_under_fair_each_user_gets_an_equal_share_of_residency():
    users = {1: "ann", 2: "ann", 3: "ann", 4: "bob", 5: "bob"}
    seconds, _ = _simulate(users, 2, 10.0, 500, fair=True)
    ann = sum(seconds[j] for j in (1, 2, 3))
    assert abs(ann - 500) <= 20 and min(seconds.values()) >= 140
    # A user with one job keeps it resident most of the time, ann's three taking turns.
    users = {1: "ann", 2: "ann", 3: "ann", 4: "ann", 5: "bob"}
    seconds, turns = _simulate(users, 2, 10.0, 500, fair=True)
    assert seconds[5] >= 400 and min(turns.values()) >= 10
