"""The decision of --lanes auto (gq.exec.lane.packing): pure, given what a host would see."""

from __future__ import annotations

import pytest

from gq.exec.lane import packing
from gq.exec.lane.packing import Mode, Packer, Sample


class Jobs:
    """Jobs whose work and iterations grow at given rates (work seconds a second)."""

    def __init__(self, *ids: int):
        self.work = dict.fromkeys(ids, 0.0)
        self.iterations = dict.fromkeys(ids, 0)

    def run(self, packer: Packer, now: float, seconds: float, rates) -> float:
        """Ticks every half second for ``seconds``; ``rates(mode)`` gives each job's rate."""
        end = now + seconds
        while now < end:
            for job, rate in rates(packer.mode).items():
                self.work[job] += rate * 0.5
                self.iterations[job] += 10
            now += 0.5
            packer.tick(now, self.samples())
        return now

    def samples(self, memory: tuple[int, int] | None = None) -> list[Sample]:
        return [
            Sample(job, self.work[job], self.iterations[job], *(memory or (None, None)))
            for job in self.work
        ]


def single_threaded(mode: Mode) -> dict[int, float]:
    """Two jobs that each leave the device half idle: side by side, both at full speed."""
    return {1: 0.5, 2: 0.5} if mode is Mode.TURNS else {1: 0.95, 2: 0.95}


def saturating(mode: Mode) -> dict[int, float]:
    """Two jobs that each fill the device: side by side, each at half speed."""
    return {1: 0.5, 2: 0.5} if mode is Mode.TURNS else {1: 0.45, 2: 0.45}


def test_jobs_that_leave_the_device_idle_are_packed_and_stay_so():
    packer, jobs = Packer(lanes=2), Jobs(1, 2)
    packer.tick(0.0, jobs.samples())
    assert packer.mode is Mode.TURNS and packer.plan() == {1: 0, 2: 0}
    now = jobs.run(packer, 0.0, 5.0, single_threaded)
    assert packer.mode is Mode.PACKED and packer.plan() == {1: 0, 2: 1}
    assert packer.gain == pytest.approx(1.9)
    jobs.run(packer, now, 60.0, single_threaded)
    assert packer.mode is Mode.PACKED


def test_jobs_that_fill_the_device_are_tried_then_take_turns_and_back_off():
    packer, jobs = Packer(lanes=2), Jobs(1, 2)
    packer.tick(0.0, jobs.samples())
    now, trials, failures = 0.0, [], []
    for _ in range(240):  # two minutes
        before = packer.mode
        now = jobs.run(packer, now, 0.5, saturating)
        if before is Mode.TURNS and packer.mode is Mode.TRIAL:
            trials.append(now)
        if before is Mode.TRIAL and packer.mode is Mode.TURNS:
            failures.append(now)
            assert packer.last is packing.Verdict.FAILED
            assert packer.slowest == (pytest.approx(0.9), 1)
            assert packer.gain == pytest.approx(0.9)
    assert len(trials) >= 3 and len(failures) >= 3
    # not tried again before its back-off, which doubles
    waits = [trial - failure for failure, trial in zip(failures, trials[1:])]
    assert waits[0] >= packing.BACKOFF_FIRST
    assert waits[1] >= 2 * packing.BACKOFF_FIRST and waits[1] > waits[0]


def test_a_favoured_job_slowed_past_keep_unpacks_though_the_total_gains():
    """Under srtf, deadline or priority the job favoured taking turns does all the work
    then: packing the one behind it must not cost it more than a tenth, whatever the total.
    Under fifo, fair and rr the whole queue's work decides."""

    def head_slowed(mode: Mode) -> dict[int, float]:
        return {1: 1.0, 2: 0.0} if mode is Mode.TURNS else {1: 0.8, 2: 0.9}

    for favours, kept in ((True, False), (False, True)):
        packer, jobs = Packer(lanes=2, favours=favours), Jobs(1, 2)
        packer.tick(0.0, jobs.samples())
        jobs.run(packer, 0.0, 6.0, head_slowed)
        assert (packer.mode is Mode.PACKED) == kept, favours
        assert packer.slowest == (pytest.approx(0.8), 1)


def test_a_drift_measures_again_and_a_new_job_starts_over():
    packer, jobs = Packer(lanes=2), Jobs(1, 2)
    packer.tick(0.0, jobs.samples())
    now = jobs.run(packer, 0.0, 5.0, single_threaded)
    assert packer.mode is Mode.PACKED

    def drifted(mode: Mode) -> dict[int, float]:
        return {1: 0.5, 2: 0.5} if mode is Mode.TURNS else {1: 0.95, 2: 0.6}

    while packer.last is packing.Verdict.PAID:
        now = jobs.run(packer, now, 0.5, drifted)
    assert packer.last is packing.Verdict.DRIFTED and packer.mode is Mode.TURNS
    jobs.work[3], jobs.iterations[3] = 0.0, 0
    packer.tick(now, jobs.samples())
    assert packer.mode is Mode.TURNS and packer.last is packing.Verdict.CHANGED
    assert packer.plan() == {1: 0, 2: 0, 3: 0}


def test_no_packing_where_memory_does_not_hold_both_lanes_or_is_unknown():
    """Side by side, each lane needs its jobs' resident memory and its largest peak:
    2 x (3 GiB resident + 3 more at the peak) is 12 GiB."""
    gib = 1 << 30
    for memory, figures, packed in (
        (10 * gib, (3 * gib, 6 * gib), False),
        (10 * gib, None, False),
        (12 * gib, (3 * gib, 6 * gib), True),
    ):
        packer, jobs = Packer(lanes=2, memory=memory), Jobs(1, 2)
        packer.tick(0.0, jobs.samples(figures))
        now = 0.0
        for _ in range(20):
            for job, rate in single_threaded(packer.mode).items():
                jobs.work[job] += rate * 0.5
                jobs.iterations[job] += 10
            now += 0.5
            packer.tick(now, jobs.samples(figures))
        assert (packer.mode is Mode.PACKED) == packed, (memory, figures)


def test_one_lane_never_packs():
    packer, jobs = Packer(lanes=1), Jobs(1, 2)
    packer.tick(0.0, jobs.samples())
    jobs.run(packer, 0.0, 10.0, single_threaded)
    assert packer.mode is Mode.TURNS and set(packer.plan().values()) == {0}


def test_a_user_with_one_job_gets_a_lane_of_their_own_beside_one_with_two():
    packer = Packer(lanes=2)
    samples = [Sample(1, 0.0, 0, user="alice"), Sample(2, 0.0, 0, user="alice")]
    samples.append(Sample(3, 0.0, 0, user="bob"))
    packer.tick(0.0, samples)
    packer.mode = Mode.TRIAL  # (as a measurement would have it)
    plan = packer.plan()
    assert plan[1] == plan[2] != plan[3]


def test_a_tiny_turns_figure_makes_no_gain_and_a_fit_lost_unpacks():
    """A turns window where a job did one 20 us iteration made a gain of 1.5e6 (past the
    wire's bound: the daemon dropped the host); and a packing whose memory side by side no
    longer holds (a figure raised) is undone at once."""
    packer, jobs = Packer(lanes=2), Jobs(1, 2)
    packer.tick(0.0, jobs.samples())
    jobs.run(
        packer, 0.0, 6.0, lambda mode: {1: 2e-5, 2: 0.0} if mode is Mode.TURNS else {1: 1, 2: 1}
    )
    assert packer.gain is None
    gib = 1 << 30
    packer, jobs = Packer(lanes=2, memory=10 * gib), Jobs(1, 2)
    fits = (4 * gib, 4 * gib)
    packer.tick(0.0, jobs.samples(fits))
    now = 0.0
    while packer.mode is not Mode.PACKED and now < 20:
        for job, rate in single_threaded(packer.mode).items():
            jobs.work[job] += rate * 0.5
            jobs.iterations[job] += 10
        now += 0.5
        packer.tick(now, jobs.samples(fits))
    assert packer.mode is Mode.PACKED
    packer.tick(now + 0.5, jobs.samples((6 * gib, 6 * gib)))
    assert packer.mode is Mode.TURNS and packer.last is packing.Verdict.FAILED


def test_a_job_never_timed_is_judged_by_what_it_costs_the_others():
    """fifo's second job never ran taking turns: its work side by side is its lane time,
    which says nothing of its speed. Packing it must then not cost the timed one more
    than KEEP allows, even though the total seems to grow (two jobs whose steps share one
    lock: the first at half its speed, the second's lane time all of it)."""
    packer = Packer(lanes=2)
    work, iterations, now = {1: 0.0, 2: 0.0}, {1: 0, 2: 0}, 0.0

    def samples() -> list[Sample]:
        return [Sample(job, work[job], iterations[job], timed=job == 1) for job in (1, 2)]

    packer.tick(now, samples())
    for _ in range(12):
        rates = {1: 1.0, 2: 0.0} if packer.mode is Mode.TURNS else {1: 0.5, 2: 1.0}
        for job, rate in rates.items():
            work[job] += rate * 0.5
            iterations[job] += 10
        now += 0.5
        packer.tick(now, samples())
    assert packer.mode is Mode.TURNS and packer.last is packing.Verdict.FAILED


def test_a_lane_share_is_the_pace_got_within_an_even_split_and_all():
    share = packing.lane_share
    assert share(0.8, 2) == pytest.approx(0.8)  # honest: the share of the device it got
    assert share(0.55, 4) == pytest.approx(0.55)
    assert share(1.3, 2) == 1.0  # never more than its lane time
    assert share(0.01, 2) == 0.5  # a page that under-counts: an even split at least
    assert share(0.0, 4) == 0.25
    assert share(None, 2) == 1.0  # not measured yet: all of it


def test_a_pace_side_by_side_is_work_over_lane_time_and_forgotten_taking_turns():
    """Each job's pace on its own lane: the work its iterations did over the lane time it
    was billed there (job 2, with gaps its lease is billed, did 0.6 of it)."""
    packer = Packer(lanes=2)
    work, billed, iterations, now = {1: 0.0, 2: 0.0}, {1: 0.0, 2: 0.0}, {1: 0, 2: 0}, 0.0

    def samples() -> list[Sample]:
        return [Sample(j, work[j], iterations[j], billed=billed[j]) for j in (1, 2)]

    packer.tick(now, samples())
    while packer.mode is not Mode.PACKED and now < 30:
        packed = packer.mode is not Mode.TURNS
        for job, pace in ((1, 0.95), (2, 0.6)):
            billed[job] += 0.5 if packed else 0.25
            work[job] += 0.5 * pace if packed else 0.25
            iterations[job] += 10
        now += 0.5
        packer.tick(now, samples())
    assert packer.mode is Mode.PACKED
    assert packer.paces == {1: pytest.approx(0.95), 2: pytest.approx(0.6)}
    packer.tick(now + 0.5, [*samples(), Sample(3, 0.0, 0)])  # a job comes: taking turns
    assert packer.mode is Mode.TURNS and packer.paces == {}


# ----- the host's side: what it counts as work (gq.exec.lane.packing_moves) ----------------
def test_turns_taken_a_slice_at_a_time_are_counted_by_their_lane_time(monkeypatch):
    """Under fair, two jobs take turns a slice at a time under leases: each slice's first
    iteration is a grant the host times, 10 ms with the switch in it, then five of 8 ms
    under the lease, which only the page counts. Side by side they gain nothing (the
    device's lock halves each one's rate: 16 ms an iteration). Counted at the pace the host
    timed, the leased iterations are believed for no more than their lane time at that
    pace taking turns, and for all of them side by side: a gain of 1.5 that is not there,
    and the pair was packed. Counted by their lane time taking turns, and at that pace side
    by side, the trial finds none, and they take turns again."""
    from types import SimpleNamespace

    from gq import policies
    from gq.exec.lane import packing_moves
    from gq.exec.lane.residents import Lane, Resident

    clock = [100.0]
    monkeypatch.setattr(packing_moves.time, "monotonic", lambda: clock[0])
    jobs = [
        Resident(
            job_id=job,
            run=1,
            user="u",
            priority=0,
            submit_time=0.0,
            declared_total=None,
            lane=0,
            process=None,  # type: ignore[arg-type]
            channel=object(),  # type: ignore[arg-type]
            started_at=0.0,
            started_wall=0.0,
        )
        for job in (1, 2)
    ]
    lanes = [Lane(0, residents=list(jobs)), Lane(1)]
    granter = SimpleNamespace(
        residents={r.job_id: r for r in jobs},
        policy=policies.make("fair"),
        read_leased_pages=lambda: None,
        schedule=lambda lane: None,
    )
    host = packing_moves.LanePacking(lanes, granter, Packer(lanes=2))  # type: ignore[arg-type]

    def leased(resident: Resident, iterations: int, seconds: float) -> None:
        resident.iterations += iterations
        resident.page_iterations += iterations
        resident.leased += seconds
        resident.attained += seconds

    trials = []
    for _ in range(80):  # 40 s of looks, every half second
        for resident in jobs:
            if host.packer.mode is Mode.TURNS:  # five slices each in half a second
                for _ in range(5):
                    resident.end_iteration(0.010)
                    leased(resident, 5, 0.040)
            else:  # a lane of its own, at half its speed
                leased(resident, 31, 0.5)
        clock[0] += 0.5
        mode = host.packer.mode
        host.tick()
        if mode is Mode.TRIAL and host.packer.mode is not Mode.TRIAL:
            trials.append((host.packer.last, host.packer.gain))
    assert trials and all(last is packing.Verdict.FAILED for last, _ in trials), trials
    assert all(gain is not None and gain < packing.GAIN for _, gain in trials), trials
    assert host.packer.mode is not Mode.PACKED
