"""The simulator on traces small enough to work out on paper, and on the shipped trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import gq, gq_ok, submit, wait_state, write_script
from gq import policies
from gq.sim.simulator import simulate
from gq.sim.traces import TraceJob, load

# The public 60-job Tiresias trace (see tests/data/README.md), shipped with the tests.
SHIPPED = Path(__file__).resolve().parent / "data" / "tiresias-60.csv"


def job(id, submit, duration, iterations, gpus=1, **kw) -> TraceJob:
    return TraceJob(id=id, submit_time=submit, duration=duration, iterations=iterations,
                    gpus=gpus, **kw)


def ends(result) -> dict[int, float]:
    return {run.job.id: run.end for run in result.runs}


def test_two_jobs_fifo_runs_to_completion_in_submit_order():
    jobs = [job(1, 0, 10, 10), job(2, 1, 2, 2)]
    result = simulate(jobs, policies.make("fifo"))
    assert ends(result) == {1: 10, 2: 12}
    assert result.summary()["avg_jct"] == pytest.approx((10 + 11) / 2)


def test_srtf_preempts_at_the_next_iteration_boundary():
    # Job 2 arrives at 1 s, as job 1's first 1-s iteration ends. Neither pace is known yet
    # (as on the host, it is known after two iterations), so job 1, submitted first, runs
    # 1-2 s; then its 8 s left lose to job 2, which runs 2-4 s, and job 1 resumes.
    jobs = [job(1, 0, 10, 10), job(2, 1, 2, 2)]
    result = simulate(jobs, policies.make("srtf"))
    assert ends(result) == {2: 4, 1: 12}
    assert result.summary()["avg_jct"] == pytest.approx((12 + 3) / 2)


def test_preemption_waits_for_a_long_iteration_to_end():
    jobs = [job(1, 0, 8, 2), job(2, 1, 1, 1)]  # job 1's iterations are 4 s
    result = simulate(jobs, policies.make("srtf"))
    assert ends(result) == {2: 5, 1: 9}


def test_multi_gpu_job_takes_whole_devices():
    jobs = [job(1, 0, 4, 4, gpus=2), job(2, 0, 2, 2)]
    result = simulate(jobs, policies.make("fifo"), gpus=2)
    assert ends(result) == {1: 4, 2: 6}
    summary = result.summary()
    assert summary["makespan"] == 6
    assert summary["utilization"] == pytest.approx((4 * 2 + 2) / (2 * 6))


def test_jobs_asking_more_gpus_than_the_node_get_all_of_them():
    result = simulate([job(1, 0, 3, 3, gpus=8)], policies.make("fifo"), gpus=2)
    assert ends(result) == {1: 3} and result.runs[0].gpus == 2


def test_switch_cost_is_paid_when_a_device_changes_job():
    jobs = [job(1, 0, 2, 2), job(2, 0, 2, 2)]
    result = simulate(jobs, policies.make("fair"), switch_cost=0.5)
    # 1: 0-1 | switch | 2: 1.5-2.5 | switch | 1: 3-4 | switch | 2: 4.5-5.5
    assert ends(result) == {1: 4, 2: 5.5}
    assert result.summary()["utilization"] == pytest.approx(4 / 5.5)
    free = simulate(jobs, policies.make("fair"))
    assert ends(free) == {1: 3, 2: 4}


def test_two_devices_share_single_gpu_jobs():
    jobs = [job(i, 0, 2, 2) for i in range(4)]
    result = simulate(jobs, policies.make("fifo"), gpus=2)
    assert sorted(ends(result).values()) == [2, 2, 4, 4]


def test_priority_runs_high_first():
    jobs = [job(1, 0, 3, 3, priority=0), job(2, 0, 3, 3, priority=5)]
    assert ends(simulate(jobs, policies.make("priority"))) == {2: 3, 1: 6}


def test_reference_figures_on_the_shipped_trace():
    jobs = load(SHIPPED)
    fifo = simulate(jobs, policies.make("fifo")).summary()
    srtf = simulate(jobs, policies.make("srtf")).summary()
    assert fifo["avg_jct"] == pytest.approx(4195.9, rel=0.005)
    assert srtf["avg_jct"] == pytest.approx(3079.4, rel=0.01)
    assert fifo["makespan"] == pytest.approx(10705) and srtf["makespan"] == pytest.approx(10705)


def test_simulate_cli_compare_and_json(home):
    table = gq_ok("simulate", "--trace", SHIPPED, "--compare", "fifo,srtf,fair,priority")
    assert "4195.9" in table and "srtf" in table and "1.36x" in table
    data = json.loads(gq_ok("simulate", "--trace", SHIPPED, "--policy", "srtf", "--json"))
    assert {"policy", "jobs", "avg_jct", "median_jct", "p95_jct", "makespan",
            "utilization"} <= set(data)
    assert data["jobs"] == 60 and data["policy"] == "srtf"
    many = json.loads(gq_ok("simulate", "--trace", SHIPPED, "--compare", "fifo,srtf",
                            "--json", "--gpus", "4", "--switch-cost", "0.1"))
    assert [d["policy"] for d in many] == ["fifo", "srtf"]


def test_simulate_jobs_csv(home, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,steps,priority,user,gpus,mem\n0,4,4,0,ann,1,\n"
                     "1,1,1,0,bob,1,\n")
    out = tmp_path / "jobs.csv"
    gq_ok("simulate", "--trace", trace, "--policy", "srtf", "--jobs-csv", out)
    rows = out.read_text().splitlines()
    assert rows[0].startswith("policy,job_id") and len(rows) == 3


def test_plot_without_matplotlib_says_how_to_get_it(home, tmp_path, monkeypatch):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,steps\n0,1,1\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = gq("simulate", "--trace", trace, "--plot", tmp_path / "p.png")
    assert result.code == 2 and "pip install 'gq[plot]'" in result.err
    assert not (tmp_path / "p.png").exists()


def test_plot_with_matplotlib(home, tmp_path):
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,steps\n0,2,2\n0.5,1,1\n")
    gq_ok("simulate", "--trace", trace, "--compare", "fifo,srtf", "--plot", tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,message", [
    (["--policy", "lottery"], "unknown policy 'lottery'"),
    (["--gpus", "0"], "invalid --gpus 0"),
    (["--switch-cost", "-1"], "invalid --switch-cost"),
])
def test_simulate_bad_options(home, tmp_path, args, message):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,steps\n0,1,1\n")
    result = gq("simulate", "--trace", trace, *args)
    assert result.code == 2 and message in result.err


@pytest.mark.parametrize("content,message", [
    ("", "has no jobs"),
    ("a,b\n1,2\n", "unknown columns"),
    ("submit_time,duration,steps\n0,abc,1\n", "malformed row"),
    ("submit_time,duration,steps\n0,-1,1\n", "positive duration"),
])
def test_simulate_bad_traces(home, tmp_path, content, message):
    trace = tmp_path / "t.csv"
    trace.write_text(content)
    result = gq("simulate", "--trace", trace)
    assert result.code == 2 and message in result.err


def test_missing_trace(home, tmp_path):
    result = gq("simulate", "--trace", tmp_path / "nope.csv")
    assert result.code == 2 and "cannot read trace" in result.err


def test_history_csv_round_trips_into_the_simulator(daemon, tmp_path):
    script = write_script(tmp_path / "api.py", (
        "import gq, time\n"
        "for _ in gq.steps(range(5)):\n"
        "    time.sleep(0.01)\n"
    ))
    ids = [submit(str(script)) for _ in range(2)]
    for job_id in ids:
        wait_state(job_id, "COMPLETED")
    csv_text = gq_ok("history", "--csv")
    lines = csv_text.splitlines()
    assert lines[0] == "id,submit_time,duration,steps,priority,user,gpus,mem,time_limit,deadline"
    assert len(lines) == 3 and all(line.split(",")[3] == "5" for line in lines[1:])
    trace = tmp_path / "week.csv"
    trace.write_text(csv_text)
    data = json.loads(gq_ok("simulate", "--trace", trace, "--policy", "srtf", "--json"))
    assert data["jobs"] == 2 and data["avg_jct"] > 0
