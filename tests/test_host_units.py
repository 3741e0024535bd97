"""The execution host's pure parts: what it makes of a worker's step counts and totals, and
whether a job would ever run as root by accident."""

from __future__ import annotations

import time

import pytest

from gq.errors import LaunchError
from gq.exec.host.messages import LaunchSpec
from gq.exec.host.spawn import identity
from gq.exec.lane.paces import SETTLED
from gq.exec.lane.residents import Resident
from gq.exec.lane.standings import Standing
from gq.policies import make


def resident(declared: int | None = None) -> Resident:
    return Resident(
        job_id=1,
        run=1,
        user="u",
        priority=0,
        submit_time=0.0,
        declared_total=declared,
        lane=0,
        process=None,
        channel=None,
        started_at=0.0,
        started_wall=0.0,
    )


def test_steps_never_decrease_nor_pass_the_total():
    job = resident(declared=100)
    job.record_steps(10)
    job.record_steps(4)  # a count going back is not believed
    assert job.steps_done == 10
    job.record_steps(10**12)  # nor one past the total
    assert (job.steps_done, job.view().steps_total) == (100, None)  # the total is now doubted


def test_a_job_that_claims_to_be_nearly_done_loses_its_place_in_srtf():
    """A job that declares a tiny total and keeps iterating ranks by attained service,
    behind every job whose total is known."""
    gamer, honest = resident(), resident(declared=1000)
    gamer.job_id, honest.job_id = 1, 2
    gamer.declare_total(1)
    gamer.record_steps(50)
    honest.record_steps(10)
    for job in (gamer, honest):
        job.iterations, job.attained = 50, 1.0
    srtf = make("srtf")
    assert srtf.pick([gamer.view(), honest.view()], [], 0.0).id == 2


def test_a_job_that_keeps_raising_its_total_loses_its_place_in_srtf():
    """gq.set_total_steps(n + 1) at every step would keep a job one step from done: a total
    raised after it was given is not believed, and srtf ranks the job by attained service."""
    gamer, honest = resident(), resident(declared=1000)
    gamer.job_id, honest.job_id = 1, 2
    srtf = make("srtf")
    picks = []
    for step in range(1, 20):
        gamer.declare_total(step + 1)
        gamer.record_steps(step)
        honest.record_steps(step)
        for job in (gamer, honest):
            job.iterations, job.attained = step, step * 0.01
        picks.append(srtf.pick([gamer.view(), honest.view()], [], 0.0).id)
    assert gamer.view().steps_total is None
    assert picks[-1] == 2 and picks.count(1) <= 1, picks
    steady = resident()
    for _ in range(3):  # the same total given again (every epoch, say) is fine
        steady.declare_total(300)
    assert steady.view().steps_total == 300


def test_a_job_that_claims_its_whole_total_and_goes_on_loses_its_place_in_srtf():
    """Reporting every step done (--steps 10**6, then a count of 10**6 at once) puts a job
    at zero remaining time; asking for another iteration then shows the claim false."""
    gamer, honest = resident(declared=10**6), resident(declared=100)
    gamer.job_id, honest.job_id = 1, 2
    gamer.record_steps(10**6)
    honest.record_steps(90)
    for job in (gamer, honest):
        job.iterations, job.attained = 5, 0.5
    srtf = make("srtf")
    assert srtf.pick([gamer.view(), honest.view()], [], 0.0).id == 1  # believed, so far
    gamer.asks_for_iteration()
    honest.asks_for_iteration()  # 90 of 100: nothing to doubt
    assert gamer.view().steps_total is None and honest.view().steps_total == 100
    assert srtf.pick([gamer.view(), honest.view()], [], 0.0).id == 2


def _ran(job: Resident, *lengths: float) -> None:
    """Iterations the host timed from grant to release, a step each."""
    for length in lengths:
        job.end_iteration(length, job.steps_done + 1)


def test_srtf_samples_a_job_timed_once_before_it_ranks_it_behind_another():
    """On a busy machine one 10 ms iteration can read 20 ms (the host's and the worker's
    scheduling): ranked on that one, the long job would wait behind the medium one for good
    and never run again to correct it. srtf samples it until SETTLED iterations past its
    warm-up are timed, and then ranks the two by what they take."""
    long, medium = resident(declared=250), resident(declared=150)
    long.job_id, medium.job_id = 1, 2
    _ran(medium, 0.05, *[0.010] * SETTLED)  # a warm-up, then its pace
    _ran(long, 0.05, 0.020)  # a warm-up, then one iteration the machine stretched
    assert medium.view().pace_settled and not long.view().pace_settled
    srtf = make("srtf")
    picks = []
    while not long.view().pace_settled:
        picks.append(srtf.pick([long.view(), medium.view()], [], 0.0).id)
        _ran(long, 0.010)
    assert picks == [1] * (SETTLED - 1)
    # 248 steps at about 13 ms against 146 at 10 ms: the medium job is the shorter now.
    assert srtf.pick([long.view(), medium.view()], [], 0.0).id == 2


def test_an_iteration_that_outlasts_a_jobs_unsettled_pace_ranks_it_by_its_length():
    """A job sampled first is not kept on the lane by it: once its iteration under way has
    lasted longer than its pace says, srtf ranks it by that length, as any other."""
    hog, other = resident(declared=100), resident(declared=100)
    hog.job_id, other.job_id = 1, 2
    _ran(hog, 0.05, 0.010)
    _ran(other, 0.05, *[0.010] * SETTLED)
    hog.standing, hog.granted_at = Standing.HOLDING, time.monotonic() - 5.0
    view = hog.view()
    assert view.pace_settled and view.mean_iteration >= 5.0
    assert make("srtf").pick([view, other.view()], [], 0.0).id == 2


def test_a_total_declared_at_submit_is_the_jobs_own_no_longer():
    job = resident(declared=500)
    job.declare_total(1)
    assert job.steps_total == 500 and job.view().steps_total == 500
    undeclared = resident()
    undeclared.record_steps(20)
    undeclared.declare_total(5)  # fewer than it has done already: as wrong as a count past it
    assert undeclared.view().steps_total is None


def _spec(**change) -> LaunchSpec:
    fields = dict(
        id=7,
        run=1,
        argv=["/bin/true"],
        worker=False,
        cwd="/",
        env={},
        stdout="/o",
        stderr="/o",
        user="u",
        submit_time=1.0,
        uid=1000,
        gid=1000,
        groups=[1000, 27],
    )
    return LaunchSpec(**{**fields, **change})


def test_identity_of_a_job_on_a_root_host(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert identity(_spec()) == (1000, 1000, [1000, 27])
    assert identity(_spec(uid=0, gid=0)) is None  # root's own job runs as root
    for missing in ({"uid": None}, {"gid": None}):
        with pytest.raises(LaunchError, match="refusing to run it as root"):
            identity(_spec(**missing))


def test_a_personal_host_runs_only_its_owners_jobs(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert identity(_spec()) is None
    with pytest.raises(LaunchError, match="cannot run it"):
        identity(_spec(uid=1001))


def test_an_interactive_jobs_idle_time_runs_from_its_last_activity_and_never_backwards():
    from gq.exec.job import idleness

    assert idleness.last_active(None, None, False, 100.0, 40.0) is None
    assert idleness.last_active(None, 90.0, False, 100.0, 40.0) == 90.0
    assert idleness.last_active(95.0, 90.0, False, 100.0, 40.0) == 95.0  # a terminal's reset
    assert idleness.last_active(95.0, 90.0, True, 100.0, 40.0) == 100.0  # holding the lane: now
    assert idleness.last_active(None, 1e12, False, 100.0, 40.0) == 100.0  # the future: now
    # Times set on its terminal before its start (1969, say) count as its start: the wire
    # takes no time before 1970, and the daemon dropped the host that sent one.
    assert idleness.last_active(None, -100.0, False, 100.0, 40.0) == 40.0
    assert idleness.idle_for(None, 40.0, 100.0) == 60.0  # none seen: since its start
    assert idleness.idle_for(30.0, 40.0, 100.0) == 60.0  # a time before its start: its start
    assert idleness.idle_for(90.0, 40.0, 100.0) == 10.0
    assert idleness.idle_for(150.0, 40.0, 100.0) == 0.0
    assert idleness.worth_reporting(None, 1.0)
    assert not idleness.worth_reporting(10.0, 10.0 + idleness.REPORT_STEP / 2)
    assert idleness.worth_reporting(10.0, 10.0 + idleness.REPORT_STEP)


def test_status_marks_an_interactive_job_idle_as_w_spells_it():
    from gq.cli import render

    assert [render.idle_time(s) for s in (5, 59.9, 60, 725, 3600, 12000, 86400 * 3)] == [
        "5s",
        "59s",
        "1:00",
        "12:05",
        "1:00m",
        "3:20m",
        "3days",
    ]


def test_a_workers_steps_are_no_more_than_the_iterations_its_host_granted():
    """A count is the job's word; a grant is the host's: a worker that claims 999,999 of
    1,000,000 steps after four iterations (enough for srtf to rank it by) has done four, and
    srtf ranks it so."""
    liar, honest = resident(), resident(declared=200)
    liar.job_id, honest.job_id, liar.worker, honest.worker = 1, 2, True, True
    liar.declare_total(1_000_000)
    liar.record_steps(999_999)
    assert liar.steps_counted == 0  # no iteration granted yet
    for _ in range(SETTLED + 1):
        liar.end_iteration(0.02)
        honest.end_iteration(0.01, honest.steps_done + 1)
    done = SETTLED + 1
    assert (liar.steps_counted, liar.steps_done) == (done, 999_999)  # what it did; its claim
    assert make("srtf").pick([liar.view(), honest.view()], [], 0.0).id == 2
    plain = resident()  # a plain process's count is all there is of it (it holds no lane)
    plain.record_steps(50)
    assert plain.steps_counted == 50


def test_a_total_lowered_under_a_huge_claim_shows_the_steps_the_host_granted():
    job = resident()
    job.worker = True
    job.record_steps(2**63 - 1)
    job.declare_total(200)
    job.end_iteration(0.01)
    assert (job.steps_done, job.steps_counted) == (200, 1)  # claimed up to its total; done
    assert job.view().steps_total is None  # its total is doubted


def test_an_iteration_under_way_ranks_a_job_as_at_least_that_long():
    """A job whose iterations never end has no mean to rank it by: the one under way counts,
    so srtf does not take it for a job of no length left."""
    job = resident(declared=10)
    job.worker = True
    job.standing = Standing.HOLDING
    job.granted_at = time.monotonic() - 5.0
    assert job.view().mean_iteration >= 5.0
    job.sliced = 3.0  # held 3 s before its lane was taken, then granted again now
    job.granted_at = time.monotonic()
    assert 3.0 <= job.view().mean_iteration < 4.0


def test_a_pages_iterations_are_believed_for_the_lease_time_they_took():
    """A page that claims 999,999 iterations in a lease of 1.5 s is believed, once the host
    has timed the job's pace (10 ms an iteration), for 150 of them."""
    job = resident(declared=1_000_000)
    job.worker = True
    job.iterations = job.page_iterations = 999_999
    job.leased = 1.5
    job.record_steps(999_999)
    assert job.steps_counted == 999_999  # no pace timed yet: the page is all there is
    for _ in range(3):
        job.end_iteration(0.01)
    assert 150 <= job.steps_counted <= 160, job.steps_counted


def test_a_statements_hold_in_progress_counts_in_its_owners_burst():
    """A person's statement goes first while their burst allows (a quarter of the lane
    over a minute): a statement holding the lane for 20 s has spent it, though none of its
    iterations has ended, so its hold is bounded as any other's."""
    from gq.exec.lane.residents import Lane
    from gq.exec.lane.views import lane_views

    repl = resident()
    repl.worker, repl.interactive, repl.channel = True, True, object()
    repl.standing, repl.granted_at = Standing.HOLDING, time.monotonic() - 20.0
    lane = Lane(0, holder=repl, residents=[repl])
    views, _ = lane_views(lane, {}, {}, time.monotonic())
    assert not views[repl.job_id].person_waits
    repl.granted_at = time.monotonic() - 1.0  # a second into its statement: still first
    fresh, _ = lane_views(Lane(0, holder=repl, residents=[repl]), {}, {}, time.monotonic())
    assert fresh[repl.job_id].person_waits


def test_a_few_long_iterations_and_gaps_do_not_lead_the_pace():
    """A torch.compile job: thousands of 2 ms steps with 1 ms gaps, and a few compilations
    of seconds among them. A plain mean read its gap as 0.6 s and its forecast two hours
    ahead; the pace policies and forecasts use is robust to a few outliers."""
    job = resident(declared=20_000)
    job.worker = True
    for index in range(400):
        compiling = index in (3, 150, 151)
        job.time_iteration(4.0 if compiling else 0.002, 1)
        job.gaps.add(5.0 if compiling else 0.001)
    assert job.mean_iteration == pytest.approx(0.002)
    assert job.mean_gap == pytest.approx(0.001)
    # ... and a new phase is its pace once its window has turned over
    for _ in range(200):
        job.time_iteration(0.010, 1)
    assert job.mean_iteration == pytest.approx(0.010)
