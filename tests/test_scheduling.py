"""Resident jobs swapped at iteration boundaries on the cpu device: real torch scripts where
finding their iterations is the subject, the same loop marked with gq.steps where the policy
is."""

from __future__ import annotations

import bisect
import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from gq import defaults

from conftest import (
    DECLARED,
    KERNEL_LOOP,
    PYTHON,
    all_jobs,
    gq_ok,
    job,
    start_together,
    submit,
    wait_for,
    wait_state,
    write_script,
)

TRAIN = str(Path(__file__).resolve().parents[1] / "examples" / "kernel_train.py")


def ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def loop_seconds(path: Path) -> float:
    return json.loads(path.read_text().strip().splitlines()[-1])["loop_seconds"]


def test_unmodified_training_script_reports_its_steps(daemon):
    job_id = submit("--steps", "40", TRAIN, "--steps", "40", "--iter-ms", "2")
    info = wait_state(job_id, "COMPLETED", timeout=60)
    assert info["steps_done"] == 40 == info["steps_total"]
    assert 0.002 <= info["mean_iteration"] < 0.05
    assert info["attained"] >= 40 * 0.002
    assert info["mem_persistent"] > 10 << 20  # RSS of a process that imported torch
    shown = gq_ok("show", str(job_id))
    assert "MeanIteration:" in shown and "AttainedDeviceTime:" in shown


def test_inference_under_no_grad_counts_outermost_calls(daemon):
    job_id = submit(TRAIN, "--steps", "25", "--iter-ms", "1", "--infer")
    assert wait_state(job_id, "COMPLETED", timeout=60)["steps_done"] == 25


def test_explicit_api_steps_step_and_total(daemon, tmp_path):
    script = write_script(
        tmp_path / "api.py",
        (
            "import gq, time\n"
            "assert gq.in_job()\n"
            "for item in gq.steps(range(12)):\n"
            "    time.sleep(0.001)\n"
            "gq.set_total_steps(20)\n"
            "for _ in range(8):\n"
            "    time.sleep(0.001)\n"
            "    gq.step()\n"
        ),
    )
    info = wait_state(submit(str(script)), "COMPLETED", timeout=30)
    assert info["steps_done"] == 20 and info["steps_total"] == 20


def test_job_api_is_a_no_op_outside_gq(tmp_path):
    import subprocess

    script = write_script(
        tmp_path / "plain.py",
        (
            "import gq\n"
            "assert not gq.in_job()\n"
            "gq.set_total_steps(3)\n"
            "print(sum(gq.steps([1, 2, 3])))\n"
            "gq.step()\n"
        ),
    )
    out = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "6"


def _long_and_short(tmp_path, long_steps: int = 300) -> tuple[int, int]:
    start = tmp_path / "go"
    long = submit(
        *DECLARED,
        "-J",
        "long",
        "--steps",
        str(long_steps),
        *KERNEL_LOOP,
        "--steps",
        str(long_steps),
        "--iter-ms",
        "5",
        "--start-file",
        str(start),
    )
    # 100 x 5 ms: under fifo the short job gets the lane when the long script returns, and
    # must outlast the long process's teardown for the end times to show the order.
    short = submit(
        *DECLARED,
        "-J",
        "short",
        "--steps",
        "100",
        *KERNEL_LOOP,
        "--steps",
        "100",
        "--iter-ms",
        "5",
        "--start-file",
        str(start),
    )
    wait_state(long, "RUNNING")
    wait_state(short, "RUNNING")  # both resident on the one device
    start_together(start, 2)
    return long, short


def test_srtf_finishes_the_short_job_first(daemon, tmp_path):
    gq_ok("policy", "set", "srtf")
    long, short = _long_and_short(tmp_path, 1000)  # 5 s: it runs on once the short one ends
    short_info = wait_state(short, "COMPLETED", timeout=60)
    assert job(long)["state"] == "RUNNING"
    long_info = wait_state(long, "COMPLETED", timeout=60)
    assert ts(short_info["end_time"]) < ts(long_info["end_time"])
    # The short job ran nearly alone: its loop took far less than the long one's.
    assert loop_seconds(tmp_path / f"gq-{short}.out") < 0.5 * loop_seconds(
        tmp_path / f"gq-{long}.out"
    )


def test_fifo_finishes_the_first_job_first_and_the_second_waits(daemon, tmp_path):
    # The short job is read before the long one, and the long one still runs: so the
    # short job had waited while the long one ran (a first read that came after the long
    # job's end on a busy machine found the short one at work, as it then should be).
    long, short = _long_and_short(tmp_path, 600)
    waiting = wait_for(
        lambda: (
            (s := job(short), g := job(long))
            and g["steps_done"] > 0
            and g["state"] == "RUNNING"
            and (s, g)
        ),
        30,
        what="long job progress",
    )
    assert waiting[0]["steps_done"] == 0 and not waiting[0]["holds_lane"]
    assert "waits" in gq_ok("status")
    long_info = wait_state(long, "COMPLETED", timeout=60)
    short_info = wait_state(short, "COMPLETED", timeout=60)
    assert ts(long_info["end_time"]) < ts(short_info["end_time"])


def test_policy_change_takes_effect_on_running_jobs(daemon, tmp_path):
    long, short = _long_and_short(tmp_path, 800)  # under fifo the short job waits...
    wait_for(lambda: job(long)["steps_done"] >= 20, 30, what="long job progress")
    assert job(short)["steps_done"] == 0
    gq_ok("policy", "set", "srtf")  # ...until srtf reaches the host at the next boundary
    wait_state(short, "COMPLETED", timeout=30)
    assert job(long)["state"] == "RUNNING"
    wait_state(long, "COMPLETED", timeout=60)


def test_fair_share_between_two_equal_jobs(daemon, tmp_path):
    gq_ok("policy", "set", "fair")
    start = tmp_path / "go"
    ids = [
        submit(
            *DECLARED,
            "--steps",
            "500",
            *KERNEL_LOOP,
            "--steps",
            "500",
            "--iter-ms",
            "4",
            "--start-file",
            str(start),
        )
        for _ in range(2)
    ]
    for job_id in ids:
        wait_state(job_id, "RUNNING")
    start_together(start, 2)
    samples = []
    while True:
        rows = {r["id"]: r for r in json.loads(gq_ok("status", "--json"))}
        if len(rows) < 2:
            break
        a, b = (rows[i]["attained"] for i in ids)
        # Fair shares the device while both iterate: past their warm-up iterations (a first
        # one can take ten times the others, and only then can fair even it out) and
        # before either loop is over (the other then runs alone).
        iterating = all(50 <= rows[i]["steps_done"] < 450 for i in ids)
        if a > 0 and b > 0 and iterating:
            samples.append((a, b))
        time.sleep(0.1)
    assert len(samples) >= 2, samples
    # Within 10%, give or take fair's granularity: a slice the host leases one of them at a
    # time (the figures are read in the middle of one) and an iteration it overruns by.
    for a, b in samples:
        assert abs(a - b) <= 0.10 * max(a, b) + defaults.LEASE_SLICE + 0.02, samples


@pytest.mark.long
def test_priority_job_runs_almost_as_if_alone_while_low_jobs_fill_its_gaps(daemon, tmp_path):
    """A high-priority job with gaps between its iterations, submitted after two low jobs
    that are always ready: under priority it starts at once, each of its iterations waits at
    most for the low iteration under way, and the lows run in its gaps; under fifo, in the
    same run, it waits for both. Its waits are counted in the lows' iterations that began
    while it waited, and its loop is compared as what the lows add to its loop alone, both
    from the jobs' own clocks: a loaded machine stretches every run, and most of all what
    lies outside the loop (a process's spawn and start-up), by a different amount at each
    moment."""
    spans_file, stop = tmp_path / "spans.jsonl", tmp_path / "stop"
    high_args = [
        *DECLARED,
        *KERNEL_LOOP,
        "--steps",
        "60",
        "--iter-ms",
        "10",
        "--gap-ms",
        "20",
        "--spans-out",
        str(spans_file),
    ]
    low_args = [
        *DECLARED,
        "--priority",
        "0",
        *KERNEL_LOOP,
        "--steps",
        "800",
        "--iter-ms",
        "4",
        "--spans-out",
        str(spans_file),
        "--stop-file",
        str(stop),
    ]
    alone = submit("--priority", "10", *high_args)
    wait_state(alone, "COMPLETED", timeout=60)
    beside = {}
    for policy in ("fifo", "priority"):
        gq_ok("policy", "set", policy)
        lows = [submit(*low_args) for _ in range(2)]
        wait_for(
            lambda lows=lows: job(lows[0])["steps_done"] > 0, 60, what="the first low job to run"
        )
        high = submit("--priority", "10", *high_args)
        beside[policy] = high
        wait_state(high, "COMPLETED", timeout=120)
        if policy == "fifo":  # it ended after both
            assert all(job(i)["state"] == "COMPLETED" for i in lows)
        else:  # their loops end at their next step, writing their spans
            stop.touch()
            for low in lows:
                wait_state(low, "COMPLETED", timeout=60)

    runs = {int(row["job"]): row for row in map(json.loads, spans_file.read_text().splitlines())}

    def rest(job_id: int) -> float:
        """What the lows added to its loop, from its first request to its last iteration's
        end, as a share of its loop alone."""

        def loop(run: dict) -> float:
            return run["spans"][-1][1] - run["asked"][0]

        return loop(runs[job_id]) / loop(runs[alone]) - 1

    fifo_rest, priority_rest = (rest(beside[policy]) for policy in ("fifo", "priority"))
    assert fifo_rest > 1.0, fifo_rest  # it waited for the lows: at least the second's 3.2 s
    assert priority_rest < 0.2 * fifo_rest, (priority_rest, fifo_rest)
    high = runs[beside["priority"]]
    low_begins = sorted(begin for low in lows for begin, _ in runs[low]["spans"])

    def began(since: float, until: float) -> int:
        return bisect.bisect(low_begins, until) - bisect.bisect(low_begins, since)

    waits = [began(asked, begin) for asked, (begin, _) in zip(high["asked"], high["spans"])]
    gaps = [began(end, asked) for (_, end), asked in zip(high["spans"], high["asked"][1:])]
    # One low iteration may begin while it waits: one granted just before its request reached
    # the host. Turns of one iteration each among the three let both lows begin one in 22 of
    # its 60 waits; a few such are a host held off the CPU by a loaded machine.
    assert len(waits) == 60 and sum(n > 1 for n in waits) <= 6, waits
    # The lows ran in its gaps (under fifo they ran while it waited, and it ran alone): a gap
    # fits five low iterations.
    assert sum(n > 0 for n in gaps) >= len(gaps) // 2, gaps


def test_worker_crashes_leave_other_resident_jobs_running(home, tmp_path):
    """Four workers crash mid-iteration, holding the lane, each its own way, among two
    resident jobs that go on to complete: one host, one daemon, all at once."""
    gq_ok("daemon", "start", "--kill-wait", "1", "--max-resident", "6")
    gq_ok("policy", "set", "fair")
    # Declared: six jobs that each probed their memory would start one after another.
    survivors = [
        submit(*DECLARED, *KERNEL_LOOP, "--steps", "60", "--iter-ms", "3") for _ in range(2)
    ]
    crashers = {
        how: submit(
            *DECLARED,
            *KERNEL_LOOP,
            "--steps",
            "60",
            "--iter-ms",
            "3",
            "--crash-at",
            "20",
            "--crash-how",
            how,
        )
        for how in ("exception", "os_exit", "sigsegv", "sys_exit0")
    }
    ended = {
        how: wait_state(job_id, "COMPLETED", "FAILED", timeout=60)
        for how, job_id in crashers.items()
    }
    assert {how: info["state"] for how, info in ended.items()} == {
        "exception": "FAILED",
        "os_exit": "FAILED",
        "sigsegv": "FAILED",
        "sys_exit0": "COMPLETED",
    }
    assert (ended["exception"]["exit_code"], ended["os_exit"]["exit_code"]) == (1, 3)
    assert ended["sigsegv"]["reason"] == "killed by signal SIGSEGV"
    assert ended["sigsegv"]["exit_code"] == 139
    for job_id in survivors:
        assert wait_state(job_id, "COMPLETED", timeout=60)["steps_done"] == 60


def test_resident_cap_and_exclusive(home, tmp_path):
    from conftest import DaemonControl

    control = DaemonControl(home)
    control.start("--max-resident", "2")
    try:
        script = write_script(tmp_path / "s.sh", "sleep 300\n")
        first, second, third, fourth = (submit(str(script)) for _ in range(4))
        wait_state(first, "RUNNING")
        wait_state(second, "RUNNING")
        info = wait_for(
            lambda: (j := job(third))["reason"] == "Resources" and j,
            10,
            what="third job to wait for resources",
        )
        assert info["state"] == "PENDING"
        assert job(fourth)["reason"] == "Priority"  # behind the third, as squeue says
        gq_ok("cancel", str(first), str(fourth))
        wait_state(third, "RUNNING")
        exclusive = submit("--exclusive", str(script))
        info = wait_for(
            lambda: (j := job(exclusive))["reason"] == "Resources" and j,
            10,
            what="the exclusive job to wait for its device",
        )
        assert info["state"] == "PENDING"
        gq_ok("cancel", str(second), str(third))
        wait_state(exclusive, "RUNNING")
        later = submit(str(script))
        info = wait_for(
            lambda: (j := job(later))["reason"] == "Resources" and j,
            10,
            what="the later job to be refused the exclusive device",
        )
        assert info["state"] == "PENDING"  # nothing shares an exclusive device
        gq_ok("cancel", str(exclusive), str(later))
    finally:
        control.stop()


def test_memory_requests_admit_only_what_fits(daemon, tmp_path):
    capacity = json.loads(gq_ok("info", "--json"))["devices"][0]["memory_total"]
    script = write_script(tmp_path / "m.sh", "sleep 300\n")
    big = f"{int(capacity * 0.6) >> 20}M"
    first = submit("--mem", big, str(script))
    second = submit("--mem", big, str(script))
    small = submit("--mem", "64M", str(script))
    wait_state(first, "RUNNING")
    info = wait_for(
        lambda: (j := job(second))["reason"] == "Resources" and j, 10, what="second big job to wait"
    )
    assert info["state"] == "PENDING"
    # No backfill: the small job queues behind the big one it would overtake.
    assert job(small)["state"] == "PENDING"
    gq_ok("cancel", str(first))
    wait_state(second, "RUNNING")
    wait_state(small, "RUNNING")
    gq_ok("cancel", str(second), str(small))


def test_info_lists_lanes_and_resident_jobs(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "sleep 300\n")
    job_id = submit(str(script))
    wait_state(job_id, "RUNNING")
    text = gq_ok("info")
    assert "1 lane(s) per device" in text and f"job {job_id} (s.sh, " in text
    gq_ok("cancel", str(job_id))


def test_measured_memory_counts_for_admission(home, tmp_path):
    """A job that gave no --mem is admitted on what it is measured to use (RSS here)."""
    from conftest import DaemonControl

    control = DaemonControl(home)
    control.start("--cpu-memory", "1G", "--max-resident", "8")
    try:
        hog = write_script(
            tmp_path / "hog.py",
            (
                "import gq, time\n"
                "held = b'x' * (600 << 20)  # resident: every page written\n"
                "for _ in gq.steps(range(3000)):\n"
                "    time.sleep(0.01)\n"
            ),
        )
        hog_id = submit(str(hog))
        wait_for(
            lambda: (job(hog_id)["mem_persistent"] or 0) > 600 << 20,
            20,
            what="the hog's memory to be measured",
        )
        small = write_script(tmp_path / "small.sh", "true\n")
        second = submit("--mem", "500M", str(small))
        info = wait_for(
            lambda: (j := job(second))["reason"] == "Resources" and j,
            10,
            what="the second job to wait for memory",
        )
        assert info["state"] == "PENDING"
        assert json.loads(gq_ok("info", "--json"))["devices"][0]["memory_total"] == 1 << 30
        gq_ok("cancel", str(hog_id))
        wait_state(second, "COMPLETED")
    finally:
        control.stop()


def test_forked_children_do_not_speak_for_the_job(daemon, tmp_path):
    script = write_script(
        tmp_path / "forking.py",
        (
            "import os, gq, torch\n"
            "model = torch.nn.Linear(4, 1)\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for step in gq.steps(range(10)):\n"
            "    if step == 3:\n"
            "        child = os.fork()\n"
            "        if child == 0:  # like a DataLoader worker: runs modules, steps, exits\n"
            "            assert not gq.in_job()\n"
            "            for _ in range(5):\n"
            "                model(torch.ones(4)).sum().backward(); optimizer.step(); gq.step()\n"
            "            os._exit(0)\n"
            "        os.waitpid(child, 0)\n"
        ),
    )
    info = wait_state(submit(str(script)), "COMPLETED", timeout=60)
    assert info["steps_done"] == 10


@pytest.mark.long
def test_two_lanes_run_iterations_in_parallel(home, tmp_path):
    """Under fifo one lane would make the second job wait; with two lanes both progress."""
    from conftest import DaemonControl

    control = DaemonControl(home)
    control.start("--lanes", "2")
    try:
        start = tmp_path / "go"
        ids = [
            submit(
                *DECLARED,
                "--steps",
                "1000",
                *KERNEL_LOOP,
                "--steps",
                "1000",
                "--iter-ms",
                "5",
                "--start-file",
                str(start),
            )
            for _ in range(2)
        ]
        for job_id in ids:
            wait_state(job_id, "RUNNING")
        assert sorted(job(i)["lane"] for i in ids) == [0, 1]
        start_together(start, 2)

        def both_progressed() -> list[dict] | None:
            # One view of both (read one after the other, on a loaded machine the first
            # had ended by the time the second was read), each job 5 s of iterations alone.
            seen = [j for j in all_jobs() if j["id"] in ids]
            return seen if all(j["steps_done"] > 0 for j in seen) else None

        both = wait_for(both_progressed, 30, what="both lanes to progress")
        assert [j["state"] for j in both] == ["RUNNING", "RUNNING"], both
        assert "2 lane(s) per device" in gq_ok("info")
        for job_id in ids:
            wait_state(job_id, "COMPLETED", timeout=60)
    finally:
        control.stop()


def test_each_job_on_a_gpu_counts_its_cuda_context_beside_its_figure():
    """A CUDA context (cuBLAS loaded: 676 MiB on an H200) is held by every resident process
    whatever its figure says: two jobs of 2 GiB fit a 5 GiB lane alone, not with it."""
    from gq.daemon.scheduling import admission

    gib = 1 << 30
    job = admission.Footprint(persistent=2 * gib)
    bare = admission.LaneLoad(5 * gib, [job])
    on_gpu = admission.LaneLoad(5 * gib, [job], overhead=768 << 20)
    assert bare.fits(job) and not on_gpu.fits(job)
    assert on_gpu.fits(admission.Footprint(persistent=gib))
    assert on_gpu.fits_alone(admission.Footprint(persistent=4 * gib))
    assert not on_gpu.fits_alone(admission.Footprint(persistent=5 * gib))
