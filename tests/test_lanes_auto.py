"""--lanes auto, the default: jobs that leave the device idle run on lanes of their own at
once; jobs that gain nothing side by side are tried, measured, and take turns again.
Through the real daemon, host and CLI (on the cpu device, a lane a core)."""

from __future__ import annotations

import os
import re

import pytest

from conftest import ROOT, gq_ok, submit, wait_for, wait_state

LOOP = str(ROOT / "bench" / "jobs" / "cores_loop.py")

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="the cpu device has one lane a core: needs two"
)


def sharing() -> str:
    line = next((line for line in gq_ok("info").splitlines() if line.startswith("  lanes: ")), "")
    return line


def test_two_single_threaded_jobs_run_on_lanes_of_their_own(home):
    """No --lanes given: the first command starts a personal daemon with its defaults.
    Under fair, as each job is timed taking turns, the queue's work decides (under fifo
    the second job is never timed, and what packing costs the first decides: on a loaded
    machine it takes CPU from the first)."""
    gq_ok("policy", "set", "fair")
    first, second = (submit(LOOP, "--steps", "100000", "--mb", "2") for _ in range(2))
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
    long enough (about 8 ms) that taking turns loses little to switching: with 1 ms steps,
    side by side on the lock beat taking turns on the lane by 1.3x, and was kept."""
    gq_ok("policy", "set", "fair")
    lock = tmp_path / "device.lock"
    first, second = (
        submit(LOOP, "--steps", "100000", "--mb", "16", "--lock", str(lock)) for _ in range(2)
    )
    for job in (first, second):
        wait_state(job, "RUNNING")
    line = wait_for(
        lambda: "side by side did not pay" in (found := sharing()) and found,
        90,
        what="a trial that failed",
    )
    assert "taking turns on one lane" in line and f"jobs {first},{second}" in line, line
    assert "tried again in" in line, line
    gq_ok("cancel", str(first), str(second))
