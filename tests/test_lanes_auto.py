"""--lanes auto, the default: jobs that leave the device idle run on lanes of their own at
once; jobs that gain nothing side by side are tried, measured, and take turns again.
Through the real daemon, host and CLI (on the cpu device, a lane a core)."""

from __future__ import annotations

import json
import os
import re

import pytest

import conftest
from conftest import KERNEL_LOOP, ROOT, gq_ok, submit, wait_for, wait_state

LOOP = str(ROOT / "bench" / "jobs" / "cores_loop.py")

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="the cpu device has one lane a core: needs two"
)


def sharing() -> str:
    line = next((line for line in gq_ok("info").splitlines() if line.startswith("  lanes: ")), "")
    return line


def test_two_jobs_whose_steps_wait_run_on_lanes_of_their_own(home):
    """No --lanes given: the first command starts a personal daemon with its defaults.
    Under fair, as each job is timed taking turns, the queue's work decides (under fifo
    the second job is never timed, and what packing costs the first decides: on a loaded
    machine it takes CPU from the first). Their steps mostly wait (5 ms), so that side by
    side pays whatever else takes the cores: two steps that only hash gained nothing on
    a loaded machine, and the test waited in vain."""
    gq_ok("policy", "set", "fair")
    first, second = (
        submit(LOOP, "--steps", "100000", "--mb", "1", "--wait-ms", "5") for _ in range(2)
    )
    for job in (first, second):
        wait_state(job, "RUNNING")
    info = wait_for(
        lambda: "lanes: on lanes of their own at once" in (found := gq_ok("info")) and found,
        90,
        what="the jobs packed",
    )
    line = next(line for line in info.splitlines() if line.startswith("  lanes: "))
    assert f"jobs {first} | {second}" in line and "side by side paid" in line, line
    gain = float(re.search(r"([\d.]+)x the work of taking turns", line).group(1))
    assert gain >= 1.1, line
    assert "lanes auto (chosen by measurement) per device" in info, info
    on_lanes = re.findall(r"job (\d+) \(cores_loop\.py, \w+\) (?:holds|waits for) lane (\d)", info)
    assert sorted(on_lanes) == [(str(first), "0"), (str(second), "1")], info
    gq_ok("cancel", str(first), str(second))


def test_jobs_that_gain_nothing_side_by_side_are_tried_and_take_turns(home, tmp_path):
    """Their steps hold one lock (as two jobs' kernels on one GPU never overlap), and are
    long enough (48 ms) that taking turns loses little to switching: with 1 ms steps, side
    by side on the lock beat taking turns on the lane by 1.3x, and was kept; with 16 ms
    steps a loaded machine's hand-overs once cost the turns a tenth, and side by side paid.
    They wait holding it rather than hash: no CPU of the suite's goes to them (beside two
    busy processes, steps of 16 MB of hashing made the test take 23 s, against 11 s)."""
    gq_ok("policy", "set", "fair")
    lock = tmp_path / "device.lock"
    first, second = (
        submit(LOOP, "--steps", "100000", "--mb", "0", "--wait-ms", "48", "--lock", str(lock))
        for _ in range(2)
    )
    for job in (first, second):
        wait_state(job, "RUNNING")
    line = wait_for(
        lambda: "side by side did not pay" in (found := sharing()) and found,
        90,
        what=lambda: f"a trial that failed (gq info said: {sharing()!r})",
    )
    assert "taking turns on one lane" in line and f"jobs {first},{second}" in line, line
    assert "tried again in" in line, line
    gq_ok("cancel", str(first), str(second))


def test_jobs_side_by_side_are_charged_the_share_of_the_device_they_got(home, tmp_path):
    """Each job's iterations are 10 ms sleeps with 5 ms gaps: on a lane of its own its lease
    is billed all its wall time, but it does two thirds of that in work. Its owner's fair
    share is charged about its work: less than its lane time, never under half of it (two
    jobs running at once), across a restart of the daemon (which adopts the jobs charged
    what it had charged them, not their lane time)."""
    gq_ok("policy", "set", "fair")
    stop = tmp_path / "stop"
    loop = (*KERNEL_LOOP, "--steps", "100000", "--iter-ms", "10", "--gap-ms", "5")
    jobs = [submit(*loop, "--stop-file", str(stop)) for _ in range(2)]
    for job_id in jobs:
        wait_state(job_id, "RUNNING")
    wait_for(lambda: "side by side paid" in sharing(), 60, what="the jobs packed")

    def lane_time() -> float:
        return sum(conftest.job(job_id)["attained"] for job_id in jobs)

    def charged() -> float:  # (one user's: the sum of both jobs')
        return sum(json.loads(gq_ok("info", "--json"))["fair_share"]["usage"].values())

    # (lane time read first: the charge read after it has grown since, if anything)
    wait_for(lambda: (t := lane_time()) > 0 and charged() < 0.9 * t, 60, what="a charge behind")
    assert "restarted" in gq_ok("daemon", "restart")
    wait_for(lambda: "side by side paid" in sharing(), 60, what="the jobs packed again")
    stop.touch()
    ended = [wait_state(job_id, "COMPLETED") for job_id in jobs]
    billed, used = sum(j["attained"] for j in ended), charged()
    work = sum(j["steps_done"] * j["mean_iteration"] for j in ended)
    print(f"lane time {billed:.2f}s, charged {used:.2f}s, work {work:.2f}s")
    assert 0.5 * billed <= used < 0.95 * billed, (billed, used)
    # About their work: what their lane time held beyond it (gaps side by side) went mostly
    # uncharged (the trials' is charged whole: a pace is known only once a trial is over,
    # and the restart measures the turns and tries side by side again).
    assert 0.9 * work <= used <= work + 0.75 * (billed - work), (billed, used, work)
    # gq history says what each was charged, at what pace against taking turns.
    assert abs(sum(j["charged"] for j in ended) - used) < 0.1 * billed, (ended, used)
    assert all(0.5 <= j["pace_side_by_side"] < 1.0 for j in ended), ended
    table = gq_ok("history").splitlines()
    side = table[0].split().index("SIDE")
    assert all(re.fullmatch(r"0\.\d\dx", line.split()[side]) for line in table[1:]), table
