"""Jobs side by side in the simulator: the speed model (gq.sim.side), the simulated host's
``--lanes auto`` through the host's own packer (gq.sim.lanes_auto), ``gq simulate --lanes``
and forecasts of jobs a host reports side by side."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_forecast import NOW, running, snapshot

from gq import policies
from gq.errors import UserError
from gq.exec.lane import packing
from gq.sim import forecast, side
from gq.sim.simulator import simulate
from gq.sim.traces import TraceJob, load

from conftest import gq, gq_ok

SIDE = Path(__file__).resolve().parents[1] / "bench" / "traces" / "side.csv"


def jobs(*busy: float, duration: float = 60.0, iterations: int = 600, **kw) -> list[TraceJob]:
    return [
        TraceJob(i, 0.0, duration, iterations, busy=b, user=f"u{i}", **kw)
        for i, b in enumerate(busy, start=1)
    ]


def ends(result) -> dict[int, float]:
    return {run.job.id: run.end for run in result.runs}


def auto(trace: list[TraceJob], policy: str = "fair", **kw):
    return simulate(trace, policies.make(policy), lanes=2, packing=True, **kw)


def trials(result) -> list[float]:
    """When each stretch of side by side began: a piece on the second lane after one on the
    first alone, or the first piece there."""
    starts, last = [], None
    for piece in sorted((p for p in result.slices if p.lane == 1), key=lambda p: p.start):
        if last is None or piece.start > last + 1.0:
            starts.append(piece.start)
        last = piece.end
    return starts


# ----- the model -------------------------------------------------------------------------
def test_jobs_that_fit_side_by_side_go_at_their_speed_alone_and_past_one_share_it():
    assert side.slowdown([0.3, 0.5]) == 1.0
    assert side.slowdown([0.3, 0.5, 0.4]) == pytest.approx(1.2)
    assert side.slowdown([1.0, 1.0]) == 2.0
    assert side.work_rate([1.0, 1.0]) == pytest.approx(1.0)  # no more than taking turns
    assert side.work_rate([0.4, 0.4]) == pytest.approx(2.0)
    assert side.work_rate([0.6, 0.6]) == pytest.approx(2 / 1.2)


def test_the_busy_share_that_reproduces_a_measured_gain():
    assert side.busy_for_gain(1.6, 2) == pytest.approx(1 / 1.6)
    assert side.work_rate([side.busy_for_gain(1.6, 2)] * 2) == pytest.approx(1.6)
    assert side.busy_for_gain(9.0, 2) == 0.5  # no more than two lanes can do
    for nothing in (1.0, 0.7, float("nan")):
        assert side.busy_for_gain(nothing, 2) == 1.0
    assert side.busy_for_gain(1.6, 1) == 1.0


def test_fixed_lanes_share_the_device_by_the_jobs_busy_shares():
    """Two lanes at once: jobs of a third each end together as alone; jobs that keep the
    device busy each take twice as long, as taking turns would have them end by then."""
    light = ends(simulate(jobs(0.3, 0.3), policies.make("fifo"), lanes=2))
    assert light == {1: pytest.approx(60.0), 2: pytest.approx(60.0)}
    whole = ends(simulate(jobs(1.0, 1.0), policies.make("fifo"), lanes=2))
    assert whole == {1: pytest.approx(120.0), 2: pytest.approx(120.0)}
    over = simulate(jobs(0.75, 0.75), policies.make("fifo"), lanes=2)
    assert ends(over)[1] == pytest.approx(60 * 1.5, rel=1e-6)
    assert over.summary()["utilization"] == pytest.approx(1.0)


def test_a_slower_neighbour_ending_speeds_the_other_up_at_its_next_iteration():
    short = [TraceJob(1, 0.0, 10.0, 100, busy=1.0), TraceJob(2, 0.0, 60.0, 600, busy=1.0)]
    found = ends(simulate(short, policies.make("fifo"), lanes=2))
    assert found[1] == pytest.approx(20.0, abs=0.11)  # at half speed beside job 2
    assert found[2] == pytest.approx(70.0, abs=0.11)  # 10 s of it at half speed, then alone


# ----- the busy column -------------------------------------------------------------------
@pytest.mark.parametrize("busy", ["nan", "0", "-0.2", "1.5", "lots", "inf"])
def test_a_bad_busy_column_is_refused_naming_the_row(tmp_path, busy):
    trace = tmp_path / "t.csv"
    trace.write_text(f"submit_time,duration,steps,busy\n0,10,10,0.5\n0,10,10,{busy}\n")
    with pytest.raises(UserError, match=r"row 2: .*busy"):
        load(trace)


def test_the_busy_column_is_read_in_both_layouts_and_defaults_to_all(tmp_path):
    ours = tmp_path / "ours.csv"
    ours.write_text("submit_time,duration,steps,busy\n0,10,10,0.25\n0,10,10,\n")
    assert [j.busy for j in load(ours)] == [0.25, 1.0]
    tiresias = tmp_path / "tiresias.csv"
    tiresias.write_text("job_id,num_gpu,submit_time,iterations,duration,busy\n7,1,0,10,10,0.5\n")
    assert load(tiresias)[0].busy == 0.5


# ----- --lanes auto ----------------------------------------------------------------------
def test_jobs_that_leave_the_device_idle_are_packed_and_end_sooner():
    trace = jobs(0.4, 0.4)
    turns = simulate(trace, policies.make("fair"))
    packed = auto(trace)
    assert turns.summary()["makespan"] == pytest.approx(120.0, rel=0.01)
    assert packed.summary()["makespan"] < 0.6 * turns.summary()["makespan"]
    assert {piece.lane for piece in packed.slices} == {0, 1}
    assert len(trials(packed)) == 1  # packed once, and it paid: kept


def test_jobs_that_keep_the_device_busy_are_tried_and_taken_back_to_turns():
    trace = jobs(1.0, 1.0, duration=300.0, iterations=3000)
    turns = simulate(trace, policies.make("fair")).summary()["makespan"]
    found = auto(trace)
    assert found.summary()["makespan"] == pytest.approx(turns, rel=0.03)
    tried = trials(found)
    assert len(tried) >= 3
    waits = [b - a for a, b in zip(tried, tried[1:])]
    # each trial waits twice as long as the one before it (10 s, 20 s, 40 s ... after it)
    assert all(later > 1.7 * earlier for earlier, later in zip(waits, waits[1:]))
    assert waits[0] == pytest.approx(packing.BACKOFF_FIRST, abs=packing.WINDOW_MAX)


def test_srtf_packs_only_where_its_favourite_keeps_its_speed():
    """srtf favours the shortest job: beside a job that fits with it, it runs at its own
    speed and the other gains; beside one that would slow it past a tenth, packing is
    undone, and the favourite ends within a tenth of its end taking turns."""
    fits = [TraceJob(1, 0.0, 30.0, 300, busy=0.4), TraceJob(2, 0.0, 90.0, 900, busy=0.4)]
    alone = ends(simulate(fits, policies.make("srtf")))
    found = ends(auto(fits, "srtf"))
    assert found[1] == pytest.approx(alone[1], rel=0.05)
    assert found[2] < alone[2] - 20
    heavy = [replace(j, busy=0.8) for j in fits]
    alone = ends(simulate(heavy, policies.make("srtf")))
    found = ends(auto(heavy, "srtf"))
    assert found[1] <= alone[1] / packing.KEEP


def test_jobs_are_packed_only_where_their_memory_fits_side_by_side():
    trace = jobs(0.4, 0.4, mem=60)
    assert auto(trace, capacity=100).summary()["makespan"] == pytest.approx(120.0, rel=0.02)
    assert auto(trace, capacity=120).summary()["makespan"] < 80.0


# ----- gq simulate --lanes ---------------------------------------------------------------
def test_simulate_compares_lane_settings_one_row_each(home):
    rows = json.loads(
        gq_ok("simulate", "--trace", SIDE, "--compare", "fifo,fair", "--lanes", "1,auto", "--json")
    )
    assert [(r["policy"], r["lanes"]) for r in rows] == [
        ("fifo", "1"),
        ("fair", "1"),
        ("fifo", "auto"),
        ("fair", "auto"),
    ]
    for one, measured in zip(rows[:2], rows[2:]):
        assert measured["makespan"] < 0.75 * one["makespan"]
        assert measured["utilization"] > one["utilization"]
    table = gq_ok("simulate", "--trace", SIDE, "--lanes", "1,auto")
    assert "LANES" in table and "auto" in table
    default = json.loads(gq_ok("simulate", "--trace", SIDE, "--json"))
    assert default["lanes"] == "auto"


@pytest.mark.parametrize(
    "setting,said",
    [
        ("0", "invalid --lanes 0:"),
        ("65", "invalid --lanes 65:"),
        ("foo", "invalid --lanes 'foo':"),
        ("1,,auto", "invalid --lanes '1,,auto':"),
        ("", "invalid --lanes '':"),
    ],
)
def test_simulate_refuses_a_bad_lanes_setting_in_one_line(home, setting, said):
    bad = gq("simulate", "--trace", SIDE, "--lanes", setting)
    assert bad.code == 2 and bad.out == ""
    assert said in bad.err and len(bad.err.strip().splitlines()) == 1


def test_simulate_refuses_a_bad_busy_column_in_one_line(home, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,steps,busy\n0,10,10,2\n")
    bad = gq("simulate", "--trace", trace)
    assert bad.code == 2 and bad.out == ""
    assert "row 1: job 0 has busy 2.0" in bad.err and len(bad.err.strip().splitlines()) == 1


# ----- forecasts -------------------------------------------------------------------------
def _two_running(sharing: tuple[forecast.Sharing, ...] | None, policy: str = "fair"):
    made = snapshot(
        [
            running(1, 1000, 100, 0.1, NOW - 10),
            replace(running(2, 1000, 100, 0.1, NOW - 10), view=_user(2, "bob")),
        ],
        policy=policy,
    )
    return forecast.forecast(replace(made, packing=sharing))


def _user(job_id: int, user: str):
    seen = running(job_id, 1000, 100, 0.1, NOW - 10).view
    return replace(seen, user=user)


def test_jobs_their_host_reports_side_by_side_are_forecast_at_the_speed_it_measured():
    """Two jobs with 90 s each to do: taking turns they end about 180 s on; reported side
    by side at 1.6 times the turns' work, 180 / 1.6 s on."""
    turns = _two_running(None)
    reported = (forecast.Sharing("gpu0", True, ((1,), (2,)), 1.6, 2),)
    packed = _two_running(reported)
    for job_id in (1, 2):
        assert turns.jobs[job_id].end - NOW == pytest.approx(180.0, rel=0.02)
        assert packed.jobs[job_id].end - NOW == pytest.approx(180.0 / 1.6, rel=0.02)


@pytest.mark.parametrize(
    "report",
    [
        forecast.Sharing("gpu0", False, ((1, 2),), None, 2),  # taking turns
        forecast.Sharing("gpu0", True, ((1,), (2,)), 0.9, 2),  # a gain that did not pay
        forecast.Sharing("gpu0", True, ((1,), (2,)), None, 2),
        forecast.Sharing("gpu0", True, ((1,), (3,)), 1.6, 2),  # not the jobs running there
        forecast.Sharing("gpu0", True, ((1,), (2,), (3,)), 1.6, 3),
        forecast.Sharing("gpu9", True, ((1,), (2,)), 1.6, 2),  # another device
    ],
)
def test_jobs_no_report_shows_side_by_side_paying_are_forecast_taking_turns(report):
    found = _two_running((report,))
    turns = _two_running(None)
    for job_id in (1, 2):
        assert found.jobs[job_id].end == pytest.approx(turns.jobs[job_id].end, rel=0.03)


def test_a_forecast_under_lanes_auto_with_no_report_yet_runs_the_hosts_packer():
    made = _two_running(())
    assert made.jobs[1].end - NOW == pytest.approx(180.0, rel=0.03)  # busy jobs: no gain
    assert made.complete and made.jobs[1].device == "gpu0"


def test_the_daemon_gives_forecasts_its_hosts_reports_only_under_lanes_auto():
    from gq.daemon.forecasts.snapshot_jobs import sharing
    from gq.exec.host.messages import PackingReport

    report = PackingReport(mode="packed", lanes=[[1], [2]], most=2, gain=1.6)
    assert sharing(False, {"gpu0": report}) is None
    assert sharing(True, {}) == ()
    assert sharing(True, {"gpu0": report}) == (
        forecast.Sharing("gpu0", True, ((1,), (2,)), 1.6, 2),
    )
    turns = PackingReport(mode="turns", lanes=[[1, 2]], most=2, gain=1.6)
    assert not sharing(True, {"gpu0": turns})[0].packed


# ----- the packer's timing, as a simulated host uses it ----------------------------------
def _samples(work: float = 0.0, iterations: int = 0) -> list[packing.Sample]:
    return [packing.Sample(job, work, iterations, user=f"u{job}") for job in (1, 2)]


def test_a_simulated_host_looks_when_a_window_may_be_complete_and_not_during_a_back_off():
    packer = packing.Packer(2)
    packer.tick(0.0, _samples())
    assert packer.next_look(0.0) == packing.WINDOW  # the turns' window's least
    packer.retry_at = 100.0
    assert packer.next_look(0.0) == 100.0 - packing.WINDOW  # measured afresh by then
    packer.retry_at = 0.0
    # past its least with too few iterations: after as long again, up to its most
    assert packer.next_look(2.0) == 4.0
    assert packer.next_look(10.0) == packing.WINDOW_MAX


def test_a_packing_taken_up_from_a_report_stays_while_it_pays_as_reported():
    packer = packing.Packer(2)
    packer.resume(_samples(), 1.6, 0.0)
    assert packer.mode is packing.Mode.PACKED and packer.plan() == {1: 0, 2: 1}
    at = packer.next_look(0.0)
    assert at == packing.PACKED_WINDOW
    packer.tick(at, _samples(work=0.8 * at, iterations=100))  # each at 0.8: 1.6 in all
    assert packer.mode is packing.Mode.PACKED and packer.gain == pytest.approx(1.6)
    packer.tick(2 * at, _samples(work=0.8 * at + 0.1, iterations=200))  # it stopped paying
    assert packer.mode is packing.Mode.TURNS
