"""Forecasts as a pure function of a snapshot of the node (gq.sim.forecast), what each job
will still do (gq.sim.work_estimates), and the simulator started from a node that already
runs jobs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gq import policies
from gq.daemon.scheduling import admission
from gq.policies import JobView
from gq.sim import forecast, work_estimates
from gq.sim.forecast import Pending, Running, Snapshot
from gq.sim.simulator import Resident, Start, simulate
from gq.sim.traces import TraceJob
from gq.sim.work_estimates import Basis, Ended, Past, Work

NOW = 1_000_000.0
GIB = 1 << 30


def device(
    name: str = "gpu0", index: int = 0, held: str | None = None, memory: int = 16 * GIB
) -> admission.DeviceLoad:
    return admission.DeviceLoad(name, True, [admission.LaneLoad(memory)], 4, index=index, held=held)


def view(
    job_id: int,
    steps: int | None = None,
    done: int = 0,
    pace: float | None = None,
    user: str = "ann",
    priority: int = 0,
    submitted: float | None = None,
) -> JobView:
    return JobView(
        id=job_id,
        user=user,
        submit_time=NOW - 100 + job_id if submitted is None else submitted,
        priority=priority,
        steps_done=done,
        steps_total=steps,
        attained=done * (pace or 0.0),
        mean_iteration=pace,
        mean_gap=0.0 if pace else None,
    )


def known(steps: int, pace: float, startup: float = 0.0) -> Work:
    return Work(steps, pace, 0.0, startup, Basis.KNOWN)


def running(
    job_id: int,
    steps: int,
    done: int,
    pace: float,
    started: float,
    device_name: str = "gpu0",
    limit: float | None = None,
) -> Running:
    seen = view(job_id, steps, done, pace)
    return Running(
        seen,
        work_estimates.work(seen, limit, None, NOW - started),
        (device_name,),
        0,
        started,
        0,
        limit,
    )


def pending(
    job_id: int,
    work: Work,
    limit: float | None = None,
    after: tuple[int, ...] = (),
    begin: float | None = None,
    priority: int = 0,
    steps: int | None = None,
) -> Pending:
    return Pending(
        view(job_id, steps, priority=priority),
        admission.Request(job_id, 1, admission.Footprint(), time_limit=limit),
        work,
        begin,
        after,
    )


def snapshot(
    running_jobs=(), pending_jobs=(), devices=None, policy="fifo", max_resident: int = 4
) -> Snapshot:
    return Snapshot(
        NOW,
        (policy, "always", "100ms"),
        tuple(devices or [device()]),
        1,
        max_resident,
        tuple(running_jobs),
        tuple(pending_jobs),
    )


def relative(made: forecast.Forecasts) -> dict[int, tuple]:
    return {
        job_id: (
            None if f.start is None else round(f.start - NOW, 6),
            None if f.end is None else round(f.end - NOW, 6),
            f.basis,
        )
        for job_id, f in made.jobs.items()
    }


def test_a_fully_known_fifo_queue_is_forecast_as_the_simulator_runs_it():
    """One device, fifo: a running job 10 of 30 steps in, two pending jobs of known pace.
    The forecast is the simulator's own answer on the same jobs, the running one's done
    iterations taken off, and every forecast is known."""
    made = forecast.forecast(
        snapshot(
            [running(1, 30, 10, 0.5, NOW - 6)],
            [pending(2, known(20, 1.0, startup=2.0)), pending(3, known(10, 0.2))],
        )
    )
    assert relative(made) == {
        1: (-6.0, 10.0, Basis.KNOWN),
        2: (0.0, 30.0, Basis.KNOWN),  # resident at once, runs after 1
        3: (0.0, 32.0, Basis.KNOWN),
    }
    # The same as a simulation of the remaining work from an empty node:
    alone = simulate(
        [
            TraceJob(1, 0.0, 10.0, 20),
            TraceJob(2, 0.0, 20.0, 20, startup=2.0),
            TraceJob(3, 0.0, 2.0, 10),
        ],
        policies.make("fifo"),
    )
    assert [run.end for run in alone.runs] == [10.0, 30.0, 32.0]


def test_what_a_job_will_do_is_known_estimated_or_unknown_from_what_it_gave():
    measured = view(1, steps=100, done=5, pace=0.1)
    assert work_estimates.work(measured, None, None) == Work(100, 0.1, 0.0, 0.0, Basis.KNOWN)
    earlier = work_estimates.past(
        [
            Ended(run=12.0, steps=100, attained=10.0, iteration=0.1, gap=0.0),
            Ended(run=13.0, steps=100, attained=10.0, iteration=0.1, gap=0.0),
        ]
    )
    assert earlier.overhead == pytest.approx(2.0)  # the least: run less device time
    assert earlier.startup is None and earlier.exit_cost == 0.0
    # --steps, not started: its pace from its owner's earlier jobs of the same name
    assert work_estimates.work(view(2, steps=50), None, earlier) == Work(
        50, 0.1, 0.0, 2.0, Basis.ESTIMATED
    )
    # no --steps: as many steps as the earlier jobs ran
    assert work_estimates.work(view(3), None, earlier).steps == 100
    # --steps and -t only: the slowest pace that ends in time
    assert work_estimates.work(view(4, steps=10), 60, None) == Work(
        10, 6.0, 0.0, 0.0, Basis.ESTIMATED
    )
    # -t only: device time for the whole limit
    only_limit = work_estimates.work(view(5), 60, None)
    assert only_limit.basis is Basis.ESTIMATED
    assert only_limit.steps * only_limit.iteration == pytest.approx(60)
    # where no start-up was measured (a host from before), the overhead is all start-up
    assert (
        work_estimates.work(
            view(8, steps=100, done=5, pace=0.1), None, earlier, elapsed=1.0
        ).teardown
        == 0.0
    )
    # a measured start-up tells start-up and exit apart
    seen = Past(run=12.0, steps=100, iteration=0.1, gap=0.0, overhead=2.0, startup=0.8)
    assert (seen.start_cost, seen.exit_cost) == (0.8, 0.8)  # exit: no longer than start-up
    assert replace(seen, overhead=1.0).exit_cost == pytest.approx(0.2)
    assert replace(seen, exit=0.3).exit_cost == 0.3  # as measured
    pending_work = work_estimates.work(view(9, steps=50), None, seen)
    assert (pending_work.startup, pending_work.teardown) == (0.8, 0.8)
    # nothing: unknown
    assert work_estimates.work(view(6), None, None).basis is Basis.UNKNOWN
    assert work_estimates.work(view(7, steps=10), None, None).basis is Basis.UNKNOWN


def test_a_job_of_a_name_none_has_ended_of_takes_the_pace_of_one_running_not_its_limit():
    """The first jobs of a sweep: none of its name has ended, one runs with its pace
    measured. A pending one that gave --steps and -t was forecast to run its whole limit
    (52 s where it ran 17 s, a forecast off by more than its limit once the wait before it
    was overestimated too); it now goes at the running one's pace."""
    started = NOW - 10.0
    sibling = Running(
        view(1, steps=200, done=100, pace=0.08),
        known(200, 0.08),
        ("gpu0",),
        0,
        started,
        0,
        None,
        name="sweep",
    )
    other = Running(
        view(2, steps=200, done=100, pace=0.5, user="bob"),
        known(200, 0.5),
        ("gpu0",),
        0,
        started,
        0,
        None,
        name="sweep",
    )
    unmeasured = Running(
        view(3, steps=200, done=1, pace=0.9),
        known(200, 0.9),
        ("gpu0",),
        0,
        started,
        0,
        None,
        name="other",
    )
    paces = forecast.running_pace([replace(sibling, startup=2.0), other, unmeasured])
    assert set(paces) == {("ann", "sweep"), ("bob", "sweep")}  # one measured: 2 iterations
    pace = paces[("ann", "sweep")]
    assert (pace.iteration, pace.run, pace.steps) == (0.08, None, None)
    assert pace.startup == 2.0  # as its host measured it
    estimated = work_estimates.work(view(4, steps=200), 52.0, pace)
    assert estimated == Work(200, 0.08, 0.0, 2.0, Basis.ESTIMATED)
    assert work_estimates.work(view(4, steps=200), 52.0, None).iteration == pytest.approx(0.26)
    # without --steps its whole run is unknown: the limit still bounds it
    assert work_estimates.work(view(5), 52.0, pace).steps * 0.08 == pytest.approx(52.0, abs=0.1)


def test_start_up_is_learned_as_measured_apart_from_waits_for_the_lane_and_the_exit():
    """Three jobs of one script under fifo, the first one's pace measured: the pending ones'
    forecasts ended 0.8-1.0 s late, a start-up taken from the running job's time so far less
    its device time (a wait for the lane in it, and progress a second old). The host's own
    measure (launch to first acquire) is what a job of the name goes on, from ended jobs (a
    median) and from a running one alike; the exit is what the overhead leaves of it."""
    ended = work_estimates.past(
        [
            Ended(run=12.0, steps=100, attained=10.0, iteration=0.1, gap=0.0, startup=0.5),
            # bound behind another job: 8 s waiting for the lane, which is no start-up
            Ended(run=20.0, steps=100, attained=10.0, iteration=0.1, gap=0.0, startup=0.7),
            Ended(run=12.5, steps=100, attained=10.0, iteration=0.1, gap=0.0, startup=0.9),
        ]
    )
    assert (ended.startup, ended.overhead) == (pytest.approx(0.7), pytest.approx(2.0))
    assert ended.exit_cost == pytest.approx(1.5)  # the least overhead less its start-up
    assert work_estimates.work(view(4, steps=50), None, ended) == Work(
        50, 0.1, 0.0, pytest.approx(0.7), Basis.ESTIMATED, pytest.approx(1.5)
    )
    # the first of a sweep, 10 s in: it waited 8 s behind another job after a 0.4 s start-up
    waited = Running(
        view(1, steps=200, done=10, pace=0.1),
        known(200, 0.1),
        ("gpu0",),
        0,
        NOW - 10.0,
        0,
        None,
        name="sweep",
        startup=0.4,
    )
    pace = forecast.running_pace([waited])[("ann", "sweep")]
    assert (pace.start_cost, pace.exit_cost) == (0.4, 0.0)
    assert work_estimates.work(view(2, steps=50), None, pace).startup == 0.4


def test_a_running_job_goes_on_from_when_its_progress_was_measured():
    """A host reports progress about once a second: a job 10 of 30 half-second steps in, as
    measured 0.6 s ago, has run on since; it ends, and the job behind it starts and ends,
    0.6 s sooner than from the same progress measured now."""

    def made(measured_at):
        job = replace(running(1, 30, 10, 0.5, NOW - 6), measured_at=measured_at)
        return relative(forecast.forecast(snapshot([job], [pending(2, known(20, 1.0))])))

    assert made(None) == {1: (-6.0, 10.0, Basis.KNOWN), 2: (0.0, 30.0, Basis.KNOWN)}
    assert made(NOW - 0.6) == {1: (-6.0, 9.4, Basis.KNOWN), 2: (0.0, 29.4, Basis.KNOWN)}
    # one that, measured 12 s ago, would have ended by now ends now, not in the past
    assert made(NOW - 12.0)[1][1] == 0.0
    # two of a lane, with idle gaps, measured a moment apart under srtf: the first goes on
    # while the second, iterating too, is awaited in its gap (it was: released at no time)
    gapped = [
        replace(
            running(job_id, 100, 10, 0.1, NOW - 3),
            measured_at=NOW - at,
            view=replace(view(job_id, 100, 10, 0.1), mean_gap=0.0002),
            work=Work(100, 0.1, 0.0002, 0.0, Basis.KNOWN),
        )
        for job_id, at in ((1, 0.08762), (2, 0.08759))
    ]
    made_srtf = forecast.forecast(snapshot(gapped, policy="srtf"))
    assert made_srtf.complete and all(f.end is not None for f in made_srtf.jobs.values())


def test_a_job_behind_an_estimated_one_is_estimated_and_behind_an_unknown_one_unknown():
    made = forecast.forecast(
        snapshot(
            [running(1, 30, 10, 0.5, NOW - 6)],
            [
                pending(2, work_estimates.work(view(2), 40, None), limit=40),  # -t only
                pending(3, known(10, 0.2)),
            ],
        )
    )
    assert made.jobs[1].basis is Basis.KNOWN
    assert made.jobs[2].basis is Basis.ESTIMATED
    assert made.jobs[3].basis is Basis.ESTIMATED  # it starts when 2 ends: an estimate
    assert made.jobs[3].end == pytest.approx(NOW + 10 + 40 + 2)
    made = forecast.forecast(
        snapshot(
            [running(1, 30, 10, 0.5, NOW - 6)],
            [pending(2, work_estimates.work(view(2), None, None)), pending(3, known(10, 0.2))],
        )
    )
    assert made.jobs[2].basis is Basis.UNKNOWN and made.jobs[2].end is None
    assert made.jobs[3].basis is Basis.UNKNOWN and made.jobs[3].end is None  # fifo: never
    # Where the node's recent jobs ran 20 s, the unknown job is simulated for that long: its
    # own end stays unknown, the job behind it gets an estimate.
    made = forecast.forecast(
        snapshot(
            [running(1, 30, 10, 0.5, NOW - 6)],
            [
                pending(2, work_estimates.work(view(2), None, None, typical=20.0)),
                pending(3, known(10, 0.2)),
            ],
        )
    )
    assert made.jobs[2].basis is Basis.UNKNOWN and made.jobs[2].end is None
    assert made.jobs[3].basis is Basis.ESTIMATED
    assert made.jobs[3].end == pytest.approx(NOW + 10 + 20 + 2)


def test_a_known_job_beside_an_unknown_one_under_fair_is_an_estimate_not_unknown():
    """Sharing the lane by turns, a job ends however long its neighbour runs: the forecast
    is a bound (the neighbour may end sooner), so it is estimated."""
    made = forecast.forecast(
        snapshot(
            [running(1, 30, 10, 0.5, NOW - 6)],
            [pending(2, work_estimates.work(view(2), None, None))],
            policy="fair",
        )
    )
    assert made.jobs[1].basis is Basis.ESTIMATED
    assert made.jobs[1].end == pytest.approx(NOW + 20, rel=0.1)  # two jobs take turns
    assert made.jobs[2].basis is Basis.UNKNOWN


def test_the_end_is_never_past_the_start_plus_the_time_limit():
    made = forecast.forecast(snapshot([running(1, 1000, 10, 1.0, NOW - 10, limit=100)]))
    assert made.jobs[1].end == pytest.approx(NOW + 90)


def test_a_dependency_starts_a_job_once_the_job_it_waits_for_has_ended():
    made = forecast.forecast(
        snapshot(
            [running(1, 30, 10, 0.5, NOW - 6)],
            [
                pending(2, known(10, 1.0), after=(1,)),
                pending(3, known(5, 1.0), after=(2,)),
                pending(4, known(5, 1.0), after=(99,)),  # waits for a job outside (held)
                pending(5, known(5, 1.0), after=(4,)),
            ],
        )
    )
    assert relative(made)[2] == (10.0, 20.0, Basis.KNOWN)
    assert relative(made)[3] == (20.0, 25.0, Basis.KNOWN)
    assert made.jobs[4].basis is made.jobs[5].basis is Basis.UNKNOWN
    assert made.jobs[4].start is made.jobs[5].start is None


def test_a_begin_time_and_a_held_device_are_waited_for():
    made = forecast.forecast(snapshot([], [pending(1, known(10, 1.0), begin=NOW + 30)]))
    assert relative(made)[1] == (30.0, 40.0, Basis.KNOWN)
    made = forecast.forecast(
        snapshot(
            [],
            [pending(1, known(10, 1.0))],
            devices=[device("gpu0", 0, held="over 85 C"), device("gpu1", 1)],
        )
    )
    assert made.jobs[1].device == "gpu1"
    made = forecast.forecast(
        snapshot([], [pending(1, known(10, 1.0))], devices=[device(held="drained: maintenance")])
    )
    assert made.jobs[1].basis is Basis.UNKNOWN and made.jobs[1].start is None


def test_a_higher_priority_job_added_delays_the_others_by_its_run():
    base = snapshot(
        [running(1, 12, 2, 1.0, NOW - 2)],
        [pending(2, known(10, 1.0)), pending(3, known(10, 1.0))],
        policy="priority",
        max_resident=1,
    )
    before = forecast.forecast(base)
    urgent = pending(-1, known(5, 1.0), priority=10)
    after = forecast.forecast(Snapshot(**{**base.__dict__, "pending": base.pending + (urgent,)}))
    assert relative(after)[-1][:2] == (10.0, 15.0)  # next once the resident one has ended
    assert forecast.delays(before, after) == {2: pytest.approx(5.0), 3: pytest.approx(5.0)}


def test_a_forecast_stopped_by_its_budget_leaves_the_jobs_it_did_not_reach_unknown():
    jobs = [pending(i, known(10, 1.0)) for i in range(1, 2000)]
    made = forecast.forecast(snapshot([], jobs), stop=lambda: True)
    assert not made.complete
    assert made.jobs[1999].basis is Basis.UNKNOWN and made.jobs[1999].end is None


def _paced(job_id, steps, done, pace, gap, started, on="gpu0", limit=None) -> Running:
    """A running job of ``pace`` s iterations and ``gap`` s of host work after each."""
    seen = replace(view(job_id, steps, done, pace), mean_gap=gap if pace else None)
    return Running(
        seen, work_estimates.work(seen, limit, None, NOW - started), (on,), 0, started, 0, limit
    )


@pytest.mark.parametrize("policy", ["rr", "fair"])
def test_jobs_of_unknown_length_taking_turns_with_gaps_leave_the_forecast_complete(policy):
    """Two running jobs of unknown length take turns with a known one, then with the job
    that waited for its room, each with host work between its iterations: turns then come
    one an iteration, and the unknown jobs' go on for the year they are simulated for (one
    of them mostly in its host work). Once the known jobs have ended, nothing can start or
    end before the time past which the forecast reports nothing: it is complete then, in a
    few thousand events, where it went on until its budget ran out."""
    made_for = snapshot(
        [_paced(1, None, 50, 0.02, 0.004, NOW - 2), _paced(2, None, 40, 0.02, 0.03, NOW - 2)]
        + [_paced(3, 300, 40, 0.02, 0.004, NOW - 1)],
        [pending(4, known(100, 0.02))],
        policy=policy,
        max_resident=3,
    )
    asked = iter(range(100))  # the budget is asked every 256 events: 25,000 at most
    made = forecast.forecast(made_for, stop=lambda: next(asked) >= 99)
    assert made.complete
    seen = relative(made)
    assert seen[1] == (-2.0, None, Basis.UNKNOWN) and seen[2] == (-2.0, None, Basis.UNKNOWN)
    # Three take turns of 20 ms (each one's host work hidden by the others' turns); then
    # job 4, the least served, runs its 100 as if alone until it catches up with them.
    start, end, basis = seen[3]
    assert start == -1.0 and end == pytest.approx(260 * 3 * 0.02, rel=0.05)
    assert basis is Basis.ESTIMATED
    assert seen[4][0] == end and seen[4][1] == pytest.approx(end + 100 * 0.02, rel=0.05)


TWO = [device("gpu0", 0), device("gpu1", 1)]


def test_what_ends_a_forecast_early_leaves_what_it_says_as_a_whole_run_says_it():
    """The horizon ends a simulation once nothing can change what the forecast says. Three
    nodes where something still could, each forecast as its whole run (to its end) says."""
    # A time limit ends a job of iterations so long that its work alone would run past it.
    limited = snapshot(
        [_paced(1, 1200, 10, 1e4, 5e3, NOW - 100, limit=86400.0)]
        + [_paced(2, 1200, 10, 1e4, 5e3, NOW - 100)],
        policy="rr",
    )
    assert relative(forecast.forecast(limited))[1] == (-100.0, 86300.0, Basis.KNOWN)
    # Under fifo a resident that has run no iteration moves to a device that frees first:
    # here only once the horizon is past, so it has no start to report.
    behind = snapshot(
        [
            _paced(1, 2000, 10, 1e4, 5e3, NOW - 100),
            _paced(2, 1100, 10, 1.5e4, 0.0, NOW - 100, "gpu1"),
        ]
        + [_paced(3, None, 0, None, 0.0, NOW - 10)],
        devices=TWO,
        policy="fifo",
    )
    assert relative(forecast.forecast(behind))[3] == (None, None, Basis.UNKNOWN)
    # A job of unknown length begins on the lane in the last gap of a known one, which is
    # then an estimate (it ended beside the unknown one), though no stretch had settled.
    joins = Pending(
        view(4, None),
        admission.Request(4, 1, admission.Footprint(), only=frozenset({"gpu0"})),
        Work(63, 5e5, 0.0, 0.0, Basis.UNKNOWN),
        begin_time=NOW + 150,
    )
    pair = [_paced(i, 11000, 10, 1e3, 500.0, NOW - 100, "gpu1") for i in (2, 3)]
    last_gap = snapshot(
        [_paced(1, 12, 10, 10.0, 100.0, NOW - 100), *pair], [joins], devices=TWO, policy="rr"
    )
    made = forecast.forecast(last_gap)
    assert relative(made)[1] == (-100.0, 220.0, Basis.ESTIMATED) and made.complete


def test_the_simulator_seeded_with_residents_continues_their_runs():
    """Two residents of one lane under fifo, the first 8 of 10 iterations in, the second not
    started: they run on from there; a job submitted before the clock waits for it. The
    bulk advance agrees with the iteration-by-iteration reference from the same start."""
    jobs = [TraceJob(1, -10.0, 10.0, 10), TraceJob(2, -9.0, 4.0, 4), TraceJob(3, -1.0, 1.0, 1)]
    start = Start(
        clock=0.0,
        residents={1: Resident((0,), -10.0, done=8, attained=8.0), 2: Resident((0,), -9.0)},
    )
    for name in ("fifo", "srtf", "fair"):
        bulk = simulate(jobs, policies.make(name), start=start)
        step = simulate(jobs, policies.make(name), start=start, step_by_step=True)
        assert [(r.start, r.end) for r in bulk.runs] == [(r.start, r.end) for r in step.runs]
    fifo = simulate(jobs, policies.make("fifo"), start=start)
    assert {run.job.id: (run.start, run.end) for run in fifo.runs} == {
        1: (-10.0, 2.0),
        2: (-9.0, 6.0),
        3: (0.0, 7.0),
    }
    # A job's exit after its last iteration: it ends later, and is resident until then, so
    # fifo's next job waits for it, as on the host; srtf's does not.
    jobs[0] = TraceJob(1, -10.0, 10.0, 10, teardown=1.5)
    fifo = simulate(jobs, policies.make("fifo"), start=start)
    assert {run.job.id: run.end for run in fifo.runs} == {1: 3.5, 2: 7.5, 3: 8.5}
    srtf = simulate(jobs, policies.make("srtf"), start=start)
    assert max(run.end for run in srtf.runs if run.job.id != 1) == 7.0  # the lane never idle


def test_test_only_requests_waiting_at_once_are_bounded_per_user_and_in_all(monkeypatch):
    from gq import defaults
    from gq.daemon.forecasts.forecasting import Forecaster, WhatIf
    from gq.errors import UserError

    monkeypatch.setattr(defaults, "MAX_TEST_ONLY_PER_USER", 2)
    monkeypatch.setattr(defaults, "MAX_TEST_ONLY", 3)
    forecaster = Forecaster(None, None, None, None, None)
    forecaster.park("first", WhatIf(1000, ()))
    forecaster.check_room(1000)
    forecaster.park("second", WhatIf(1000, ()))
    with pytest.raises(UserError, match="uid 1000"):
        forecaster.check_room(1000)
    forecaster.check_room(1001)  # another user is not held back by the first
    forecaster.park("third", WhatIf(1001, ()))
    with pytest.raises(UserError):
        forecaster.check_room(1002)  # the node's limit


def _forecaster(scheduler, selector=None):
    """A forecaster of ``scheduler``'s snapshots with no database: the node's typical run
    counts as read (none)."""
    import time

    from gq.daemon.forecasts.forecasting import Forecaster

    forecaster = Forecaster(None, scheduler, selector, None, None)
    forecaster._typical = (time.monotonic(), None)
    return forecaster


def test_a_forecaster_looks_at_an_unchanged_node_at_most_once_a_period():
    """A queue that did not change makes no forecast; nor is its snapshot built again at
    every scheduling pass (a pass may come every few milliseconds)."""

    from gq.daemon.forecasts.forecasting import _signature

    unchanged = snapshot([], [pending(1, known(10, 1.0))])

    class Scheduler:
        last_pass = None
        built = 0

        def snapshot(self, past, typical):
            self.built += 1
            return unchanged

    scheduler = Scheduler()
    forecaster = _forecaster(scheduler)
    forecaster.signature = _signature(unchanged)  # as if it had been forecast already
    forecaster.tick()
    forecaster.tick()
    assert scheduler.built == 1 and forecaster.child is None


class _ChangingQueue:
    """A scheduler whose queue changes between looks: each asks for a forecast."""

    last_pass = None
    built = 0

    def snapshot(self, past, typical):
        self.built += 1
        return snapshot([], [pending(self.built, known(10, 1.0))])


def _sleeping_child(monkeypatch, seconds: float) -> None:
    """The forecast child waits ``seconds`` of wall and takes no CPU, as a niced child
    behind busy jobs does."""
    import time

    from gq.daemon.forecasts import forecasting

    def waits_on_a_busy_node(snapshot, asked):
        time.sleep(seconds)
        return forecast.Forecasts(0.0), []

    monkeypatch.setattr(forecasting, "_simulate", waits_on_a_busy_node)


def test_a_daemon_that_stops_with_a_forecast_under_way_logs_no_failure(monkeypatch, caplog):
    """Every daemon stopped soon after a change in its queue logged "no forecast made this
    time (the child failed or overran)": its stop kills the child, which did not fail."""
    import logging
    import selectors

    _sleeping_child(monkeypatch, 5.0)
    with selectors.DefaultSelector() as selector, caplog.at_level(logging.DEBUG, "gq.daemon"):
        forecaster = _forecaster(_ChangingQueue(), selector)
        forecaster.tick()
        assert forecaster.child is not None
        forecaster.close()
    assert forecaster.child is None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_forecasts_are_spaced_by_the_cpu_their_child_took_not_its_wall_time(monkeypatch):
    """A child that yields the CPUs to busy jobs takes seconds of wall for milliseconds of
    work; the next forecast comes a period after it, not ten times its wall time after it
    (on a loaded CI machine one 150-step job ran to its end without a forecast from its own
    pace)."""
    import selectors
    import time

    from gq import defaults

    _sleeping_child(monkeypatch, 0.4)
    monkeypatch.setattr(defaults, "FORECAST_PERIOD", 0.2)
    scheduler = _ChangingQueue()
    with selectors.DefaultSelector() as selector:
        forecaster = _forecaster(scheduler, selector)
        forecaster.tick()
        assert forecaster.child is not None
        while forecaster.child is not None:
            selector.select(5.0)
            forecaster.receive()
        ended = time.monotonic()
        while scheduler.built < 2 and time.monotonic() - ended < 2.0:  # (4 s at its wall)
            time.sleep(0.05)
            forecaster.tick()
        assert scheduler.built == 2, "the next forecast waited ten times the child's wall time"
        forecaster.close()
