"""The simulator on traces small enough to work out on paper, and on the shipped trace."""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gq import policies
from gq.sim.simulator import simulate
from gq.sim.traces import TraceJob, load, write_gq_csv

from conftest import gq, gq_ok, submit, wait_state, write_script
from conftest import job as job_info

# The public 60-job Tiresias trace (see tests/data/README.md), shipped with the tests.
SHIPPED = Path(__file__).resolve().parent / "data" / "tiresias-60.csv"


def job(id, submit, duration, iterations, gpus=1, **kw) -> TraceJob:
    return TraceJob(
        id=id, submit_time=submit, duration=duration, iterations=iterations, gpus=gpus, **kw
    )


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
    # Job 1's iterations are 4 s and its pace is known from 8 s on; job 2 arrives at 9 s,
    # in the middle of job 1's third iteration, and starts only when it ends, at 12 s.
    jobs = [job(1, 0, 16, 4), job(2, 9, 1, 1)]
    result = simulate(jobs, policies.make("srtf"))
    assert ends(result) == {2: 13, 1: 17}


def test_multi_gpu_job_takes_whole_devices():
    jobs = [job(1, 0, 4, 4, gpus=2), job(2, 0, 2, 2)]
    result = simulate(jobs, policies.make("fifo"), gpus=2)
    assert ends(result) == {1: 4, 2: 6}
    summary = result.summary()
    assert summary["makespan"] == 6
    assert summary["utilization"] == pytest.approx((4 * 2 + 2) / (2 * 6))


def test_a_run_stopped_early_gives_no_summary():
    # Jobs a stopped run did not end have no completion time: figures without them would
    # flatter it, so it refuses them (it failed on their missing end before).
    jobs = [job(i, i, 1, 1) for i in range(1, 1001)]
    result = simulate(jobs, policies.make("fifo"), stop=lambda: True)
    assert not result.complete and any(run.end is None for run in result.runs)
    with pytest.raises(ValueError, match="of the jobs did not end"):
        result.summary()
    with pytest.raises(ValueError, match="of the jobs did not end"):
        result.jcts()


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
    # 0.6 % over the optimum (3079.4 s): a new job's pace is known only after two
    # iterations, which it runs first, as on the execution host.
    assert srtf["avg_jct"] == pytest.approx(3096.6, rel=0.001)
    assert fifo["makespan"] == pytest.approx(10705) and srtf["makespan"] == pytest.approx(10705)


def test_simulate_cli_compare_and_json(home):
    table = gq_ok(
        "simulate", "--trace", SHIPPED, "--compare", "fifo,srtf,fair,priority", "--lanes", "1"
    )
    assert "4195.9" in table and "srtf" in table and "1.35x" in table
    data = json.loads(gq_ok("simulate", "--trace", SHIPPED, "--policy", "srtf", "--json"))
    assert {"policy", "jobs", "avg_jct", "median_jct", "p95_jct", "makespan", "utilization"} <= set(
        data
    )
    assert data["jobs"] == 60 and data["policy"] == "srtf"
    many = json.loads(
        gq_ok(
            "simulate",
            "--trace",
            SHIPPED,
            "--compare",
            "fifo,srtf",
            "--json",
            "--gpus",
            "4",
            "--switch-cost",
            "0.1",
        )
    )
    assert [d["policy"] for d in many] == ["fifo", "srtf"]


def test_simulate_jobs_csv(home, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "submit_time,duration,steps,priority,user,gpus,mem\n0,4,4,0,ann,1,\n1,1,1,0,bob,1,\n"
    )
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


@pytest.mark.parametrize(
    "args,message",
    [
        (["--policy", "lottery"], "unknown policy 'lottery'"),
        (["--gpus", "0"], "invalid --gpus 0"),
        (["--switch-cost", "-1"], "invalid --switch-cost"),
        (["--share-slice", "1.5"], "invalid --share-slice 1.5: a fraction from 0 to 1"),
    ],
)
def test_simulate_bad_options(home, tmp_path, args, message):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,steps\n0,1,1\n")
    result = gq("simulate", "--trace", trace, *args)
    assert result.code == 2 and message in result.err


@pytest.mark.parametrize(
    "content,message",
    [
        ("", "has no jobs"),
        ("a,b\n1,2\n", "unknown columns"),
        ("submit_time,duration,steps\n0,1,1\n0,abc,1\n", "row 2: duration 'abc' is not a number"),
        ("submit_time,duration,steps\n0,1,1.5\n", "row 1: steps '1.5' is not an integer"),
        ("submit_time,duration,steps\n0,1,1\n,1,1\n", "row 2: no submit_time"),
        ("submit_time,duration,steps\n0,1,1\n0,1,1,7\n", "row 2: 3 columns expected"),
        ("submit_time,duration,steps\n0,1,1\n0\n", "row 2: 3 columns expected"),
        ("submit_time,duration,steps\n0,-1,1\n", "row 1: job 0 needs positive duration"),
        ("submit_time,duration,steps,gap\n0,1,1,0\n0,1,1,-2\n", "row 2: job 1 has a negative"),
        (
            "job_id,num_gpu,submit_time,iterations,duration\n4,1,0,10,x\n",
            "row 1: duration 'x' is not a number",
        ),
    ],
)
def test_simulate_bad_traces(home, tmp_path, content, message):
    trace = tmp_path / "t.csv"
    trace.write_text(content)
    result = gq("simulate", "--trace", trace)
    assert result.code == 2 and message in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1 and result.out == ""


def test_missing_trace(home, tmp_path):
    result = gq("simulate", "--trace", tmp_path / "nope.csv")
    assert result.code == 2 and "cannot read trace" in result.err


def test_history_csv_round_trips_into_the_simulator(daemon, tmp_path):
    script = write_script(
        tmp_path / "api.py",
        ("import gq, time\nfor _ in gq.steps(range(5)):\n    time.sleep(0.01)\n"),
    )
    ids = [submit(str(script)) for _ in range(2)]
    for job_id in ids:
        wait_state(job_id, "COMPLETED")
    csv_text = gq_ok("history", "--csv")
    lines = csv_text.splitlines()
    header = lines[0].split(",")
    assert header[:10] == [
        "id",
        "submit_time",
        "duration",
        "steps",
        "priority",
        "user",
        "gpus",
        "mem",
        "time_limit",
        "deadline",
    ]
    # A gap column where a busy machine made the worker's turnaround a measurable gap (> 2 ms).
    assert header[10:] in ([], ["gap"])
    assert len(lines) == 3 and all(line.split(",")[3] == "5" for line in lines[1:])
    trace = tmp_path / "week.csv"
    trace.write_text(csv_text)
    data = json.loads(gq_ok("simulate", "--trace", trace, "--policy", "srtf", "--json"))
    assert data["jobs"] == 2 and data["avg_jct"] > 0


def test_history_csv_carries_measured_gaps_into_the_simulator(daemon, tmp_path):
    """Fetching the next batch happens released (gq.steps): 30 ms of it is an idle gap the
    host measures, gq show reports, and gq history --csv hands to the simulator."""
    script = write_script(
        tmp_path / "loader.py",
        (
            "import gq, time\n"
            "def batches():\n"
            "    for i in range(12):\n"
            "        time.sleep(0.03)\n"
            "        yield i\n"
            "for _ in gq.steps(batches()):\n"
            "    time.sleep(0.005)\n"
        ),
    )
    plain = write_script(tmp_path / "plain.py", "print('no iterations')\n")
    gapped_id, plain_id = submit(str(script)), submit(str(plain))
    for job_id in (gapped_id, plain_id):
        wait_state(job_id, "COMPLETED")
    shown = job_info(gapped_id)
    assert 0.028 <= shown["mean_gap"] < 0.1, shown["mean_gap"]
    assert "MeanGap:" in gq_ok("show", str(gapped_id))
    lines = gq_ok("history", "--csv").splitlines()
    assert lines[0].endswith(",deadline,gap")
    gaps = {int(line.split(",")[0]): float(line.split(",")[-1]) for line in lines[1:]}
    assert gaps[gapped_id] == pytest.approx(shown["mean_gap"], rel=1e-4) and gaps[plain_id] == 0
    trace = tmp_path / "week.csv"
    trace.write_text("\n".join(lines) + "\n")
    assert {job.id: job.gap for job in load(trace)}[gapped_id] > 0.028
    data = json.loads(gq_ok("simulate", "--trace", trace, "--policy", "priority", "--json"))
    assert data["jobs"] == 2


def generated(count: int, seed: int) -> list[TraceJob]:
    """Jobs with mixed sizes, paces, priorities, users, device counts and start-ups."""
    rng = random.Random(seed)
    jobs, clock = [], 0.0
    for index in range(count):
        iterations = rng.randint(1, 400)
        jobs.append(
            job(
                index,
                round(clock, 3),
                iterations * rng.uniform(0.01, 0.3),
                iterations,
                gpus=rng.choice([1, 1, 1, 2, 4]),
                priority=rng.randrange(3),
                user=f"u{rng.randrange(3)}",
                startup=rng.choice([0.0, 0.0, 1.5]),
            )
        )
        clock += rng.expovariate(1 / 8)
    return jobs


@pytest.mark.parametrize("name", ["fifo", "srtf", "priority", "deadline", "rr", "fair"])
@pytest.mark.parametrize("gpus", [1, 4])
def test_bulk_advance_agrees_with_iteration_by_iteration(name, gpus):
    for jobs in (generated(30, seed=gpus), load(SHIPPED)[:25] if gpus == 4 else generated(30, 7)):
        step = simulate(jobs, policies.make(name), gpus=gpus, step_by_step=True)
        bulk = simulate(jobs, policies.make(name), gpus=gpus)
        assert ends(bulk) == pytest.approx(ends(step), rel=1e-9, abs=1e-6)
        assert bulk.busy == pytest.approx(step.busy)
        assert bulk.events <= step.events


def test_bulk_advance_on_the_shipped_trace_is_exact_and_takes_few_events():
    jobs = load(SHIPPED)
    for name in ("priority", "fair", "rr"):  # the others: generated traces and a slice
        step = simulate(jobs, policies.make(name), step_by_step=True)
        bulk = simulate(jobs, policies.make(name))
        assert ends(bulk) == pytest.approx(ends(step), rel=1e-9, abs=1e-6)
        assert step.events == sum(j.iterations for j in jobs)  # one per iteration
        assert bulk.events < len(step.slices) // 10, name  # turns: a window at a time
    fifo = simulate(jobs, policies.make("fifo"))
    assert fifo.events < 3 * len(jobs)


def test_rr_counting_iterations_settles_turns_exactly():
    jobs = generated(30, seed=11)
    for quantum in ("3it", "250ms"):
        step = simulate(jobs, policies.make("rr", quantum=quantum), step_by_step=True)
        bulk = simulate(jobs, policies.make("rr", quantum=quantum))
        assert ends(bulk) == pytest.approx(ends(step), rel=1e-9, abs=1e-6)
        assert bulk.events < step.events // 3


def test_fair_in_slices_stays_within_half_a_percent():
    # Slices are what fair falls back on when switching costs time; asked for here without.
    for jobs, gpus in ((generated(60, seed=3), 1), (generated(60, 4), 4)):
        step = simulate(jobs, policies.make("fair"), gpus=gpus, step_by_step=True)
        bulk = simulate(jobs, policies.make("fair"), gpus=gpus, share_slice=0.001)
        error = bulk.summary()["avg_jct"] / step.summary()["avg_jct"] - 1
        assert abs(error) < 0.005 and bulk.events < step.events


def test_progress_bar_shows_only_on_a_terminal_after_a_second(monkeypatch, capsys):
    from gq.cli.simulate import _ProgressBar

    with _ProgressBar(10) as quiet:  # stderr is not a terminal here
        quiet.started -= 5
        quiet(3)
    assert quiet.shown is None
    with _ProgressBar(10) as early:
        early.wanted = True
        early(3)  # within the first second: nothing yet
        assert early.shown is None
        early.started -= 5
        early(4)
        assert early.shown is not None
        assert early.shown.tasks[0].completed == 4 and early.shown.tasks[0].total == 10


def gapped(count: int, seed: int) -> list[TraceJob]:
    """Generated jobs (see ``generated``), some with idle gaps: none, too short to fill, or
    long enough for others' iterations."""
    rng = random.Random(seed)
    return [
        replace(j, gap=rng.choice([0.0, 0.0, 0.001, 0.05, 0.2])) for j in generated(count, seed)
    ]


@pytest.mark.parametrize(
    "name,fill",
    [
        ("fifo", "always"),
        ("srtf", "always"),
        ("fair", "always"),
        ("rr", "always"),
        ("priority", "always"),
        ("priority", "gapfit"),
        ("priority", "never"),
    ],
)
def test_bulk_advance_with_gaps_agrees_with_iteration_by_iteration(name, fill):
    for gpus, lanes in ((1, 1), (4, 1), (1, 2)):
        jobs = gapped(30, seed=gpus + lanes)
        if lanes > 1:  # (jobs that fit side by side: each at its speed alone)
            jobs = [replace(j, busy=0.5) for j in jobs]
        step = simulate(jobs, policies.make(name, fill), gpus=gpus, lanes=lanes, step_by_step=True)
        bulk = simulate(jobs, policies.make(name, fill), gpus=gpus, lanes=lanes)
        assert ends(bulk) == pytest.approx(ends(step), rel=1e-9, abs=1e-6)
        assert bulk.busy == pytest.approx(step.busy)
        assert bulk.events < step.events


def test_a_job_alone_with_gaps_runs_in_bulk_and_ends_after_its_last_gap():
    result = simulate([job(1, 0, 10, 1000, startup=2.0, gap=0.05)], policies.make("fifo"))
    assert ends(result) == {1: pytest.approx(2 + 10 + 1000 * 0.05)}
    assert result.events <= 3 and result.busy == pytest.approx(10)


@pytest.mark.parametrize(
    "fill,high_end,low_end", [("never", 12, 32), ("always", 14, 23), ("gapfit", 13, 25)]
)
def test_fill_modes_on_paper(fill, high_end, low_end):
    """H: 3 iterations of 1 s, 3 s idle after each, priority 1; L: 10 iterations of 2 s.
    never: L waits until H has exited (12). always: L's iterations overrun H's gaps by 1 s
    twice (H ends 14). gapfit: once H's gap is known (after its second iteration), L runs
    only where 2 s fit before H's next acquire: [6, 8], then idle until 9; [10, 12] in H's
    last gap, idle until H exits at 13."""
    high = job(1, 0, 3, 3, priority=1, gap=3.0)
    low = job(2, 0, 20, 10)
    result = simulate([high, low], policies.make("priority", fill))
    assert ends(result) == {1: pytest.approx(high_end), 2: pytest.approx(low_end)}


def test_anticipation_keeps_the_lane_for_a_gap_too_short_to_fill():
    """A (5 iterations of 1 s, priority 1) and B (3 of 1 s) under priority. B fills A's first
    gap (its length is not known yet). Once known, a 1 ms gap is anticipated: B waits until
    A has exited. A 10 ms gap is filled by B every time."""

    def run(gap):
        return ends(
            simulate(
                [job(1, 0, 5, 5, priority=1, gap=gap), job(2, 0, 3, 3)], policies.make("priority")
            )
        )

    short = run(0.001)
    assert short[1] == pytest.approx(2 + 4 * 1.001)
    assert short[2] == pytest.approx(short[1] + 2)
    filled = run(0.01)
    assert filled[2] == pytest.approx(6)  # B ran in A's 1st, 2nd and 3rd gaps
    assert filled[1] == pytest.approx(8.02)


def test_a_job_whose_iteration_fits_runs_in_the_anticipated_gaps():
    """Under srtf, A (40 iterations of 0.2 ms, 1 ms gaps) is preferred to B (50 of them):
    its gaps are anticipated, yet B's iterations fit in them, so both run as if alone
    (B but for a wait or two). B's iterations of 10 ms do not fit: B waits out A's gaps."""

    def ends_of(*jobs):
        return ends(simulate(list(jobs), policies.make("srtf")))

    a = job(1, 0, 0.008, 40, gap=0.001)
    short, long = job(2, 0, 0.01, 50, gap=0.001), job(2, 0, 0.5, 50, gap=0.001)
    together = ends_of(a, short)
    assert together[1] == pytest.approx(ends_of(a)[1])
    assert together[2] == pytest.approx(ends_of(short)[2], abs=0.001)
    waits = ends_of(a, long)
    assert waits[2] > ends_of(long)[2] + 0.04  # behind most of A's 40 gaps


def test_lanes_run_at_once_and_split_the_memory():
    """A, B, C need 40 units each and keep half the device busy. One lane of 100: A and B
    resident, run one after the other; C waits for room. Two lanes of 50: A and B on a lane
    each, at once, at their speed alone (halves that fit the device); C fits neither until
    one ends. Jobs that keep the whole device busy gain nothing from lanes: each goes at
    half its speed beside the other."""
    jobs = [job(i, 0, 10, 10, mem=40, busy=0.5) for i in (1, 2, 3)]
    one = simulate(jobs, policies.make("fifo"), capacity=100)
    assert ends(one) == {1: 10, 2: 20, 3: 30}
    two = simulate(jobs, policies.make("fifo"), capacity=100, lanes=2)
    assert ends(two) == {1: 10, 2: 10, 3: 20}
    assert {piece.lane for piece in two.slices} == {0, 1}
    assert two.summary()["utilization"] == pytest.approx(3 * 10 * 0.5 / 20)
    whole = [replace(run, busy=1.0) for run in jobs]
    assert ends(simulate(whole, policies.make("fifo"), capacity=100, lanes=2)) == {
        1: 20,
        2: 20,
        3: 30,
    }


def test_simulate_cli_lanes(home, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,duration,steps,busy\n0,10,10,0.5\n0,10,10,0.5\n")
    one = json.loads(gq_ok("simulate", "--trace", trace, "--lanes", "1", "--json"))
    two = json.loads(gq_ok("simulate", "--trace", trace, "--lanes", "2", "--json"))
    assert one["makespan"] == pytest.approx(20) and two["makespan"] == pytest.approx(10)
    assert one["lanes"] == "1" and two["lanes"] == "2"
    bad = gq("simulate", "--trace", trace, "--lanes", "0")
    assert bad.code == 2 and "invalid --lanes 0" in bad.err


def test_gap_and_startup_columns_in_both_layouts(home, tmp_path):
    jobs = [job(1, 0, 4, 200, priority=1, gap=0.03, startup=1.5), job(2, 0, 10, 400)]
    ours = tmp_path / "ours.csv"
    write_gq_csv(jobs, ours)
    assert ours.read_text().splitlines()[0].endswith(",gap,startup")
    assert load(ours) == jobs
    tiresias = tmp_path / "tiresias.csv"
    tiresias.write_text(
        "job_id,num_gpu,submit_time,iterations,duration,gap\n7,1,0,100,1,0.01\n8,1,0,100,1,\n"
    )
    assert [j.gap for j in load(tiresias)] == [0.01, 0.0]
    never = json.loads(
        gq_ok("simulate", "--trace", ours, "--policy", "priority", "--fill", "never", "--json")
    )
    always = json.loads(gq_ok("simulate", "--trace", ours, "--policy", "priority", "--json"))
    assert never["makespan"] > always["makespan"]  # L waits out every gap of the high job


def _jcts_of(text: str, gpus: int, tmp_path: Path, policy: str = "fifo") -> dict[int, float]:
    from gq.sim.simulator import simulate
    from gq.sim.traces import load

    path = tmp_path / "t.csv"
    path.write_text(text)
    result = simulate(load(path), policies.make(policy), gpus=gpus, backfill=False)
    return {run.job.id: run.end - run.job.submit_time for run in result.runs}


def test_a_job_waits_where_it_will_run_soonest_not_where_it_was_first_put(tmp_path):
    """Three jobs on two devices under fifo: the third starts when the short job's device
    frees (JCT 59, as a central FIFO queue), not behind the long job (149); bound before
    the paces were known, it moves there once they are."""
    trace = (
        "submit_time,duration,steps,priority,user,gpus\n"
        "0,100,1000,0,u,1\n0,10,100,0,u,1\n{third},50,500,0,u,1\n"
    )
    assert _jcts_of(trace.format(third=1), 2, tmp_path) == pytest.approx({0: 100, 1: 10, 2: 59})
    assert _jcts_of(trace.format(third=0.05), 2, tmp_path)[2] == pytest.approx(59.95)
    for policy in ("srtf", "fair"):  # the third job gets turns at once: nothing to move
        assert _jcts_of(trace.format(third=1), 2, tmp_path, policy)[2] < 100


def test_a_pause_among_many_batches_does_not_make_the_mean_gap(daemon, tmp_path):
    """A torch.compile job's compilations, a checkpoint's save: a few long pauses among many
    short gaps, the first ones most often. A plain mean read them as the job's gap; the pace
    forecasts and policies use leaves them out."""
    script = write_script(
        tmp_path / "compiles.py",
        (
            "import gq, time\n"
            "def batches():\n"
            "    for i in range(40):\n"
            "        time.sleep(1.5 if i in (1, 2) else 0.02)\n"
            "        yield i\n"
            "for _ in gq.steps(batches()):\n"
            "    time.sleep(0.005)\n"
        ),
    )
    wait_state(job_id := submit(str(script)), "COMPLETED")
    shown = job_info(job_id)
    # Alone, it ran under a lease after its first few gaps: the pace its host timed and its
    # lease's together are what its iterations and gaps took (40 of them, 4 s in all),
    # not the pauses'.
    pace = shown["mean_iteration"] + shown["mean_gap"]
    assert shown["mean_gap"] < 0.15 and 40 * pace <= 1.2 * shown["run_time"], {
        k: shown[k] for k in ("mean_gap", "mean_iteration", "attained", "run_time", "steps_done")
    }
