"""The GPU check's lone_tail phase (bench/gpu_check.py): how long a job that comes waits
for one that had its lane alone. Alone, a job holds its lane under a lease and does not
wait for its device at each release; it keeps no more than one iteration queued ahead of
the one the device runs (gq.exec.lane.device_sync), so a newcomer waits for under three of
its iterations' device work, and not for the thousand kernels CUDA queues before a launch
blocks.

A spin job runs alone; once gq has counted a quarter of its steps (its lease taken, its
device's queue as full as it gets), a second spin job is let go. Its wait is from then to
the start of its first iteration on the device (its CUDA timing event on the common
monotonic clock: the device ran it once the holder's tail had drained), against the
holder's device time an iteration. On the cpu device there is no queue to drain: INFO.
"""

from __future__ import annotations

import time

from gpu_check_lib import JobFailed, Phase, PhaseTimeout, mean_interval_ms

WAIT_SLACK_MS = 25.0  # the grant's own path: the host's recall, a READY, a Go


def lone_tail(ph: Phase, s) -> None:
    s.node.gq("policy", "set", "fair")
    plain = "lone_tail" in s.cfg["plain"]
    iters = s.cfg["lone_iters"]
    ph.submit("lone", s.args("spin", iters, plain=plain), stage="lone", options=s.mem("spin"))
    ph.submit("newcomer", s.args("spin", 20, plain=plain), stage="newcomer", options=s.mem("spin"))
    ph.wait_ready(["lone", "newcomer"])
    ph.go("lone")
    _wait_for_steps(ph, s, ph.ids["lone"], iters // 4)
    came = time.monotonic_ns()
    ph.go("newcomer")
    runs = ph.wait_done(["lone", "newcomer"])
    waited_ms = (runs["newcomer"]["iv"][0][0] - came) / 1e6
    iteration_ms = mean_interval_ms(runs["lone"])
    bound = 3 * iteration_ms + WAIT_SLACK_MS if s.cuda else None
    ph.fig(
        "newcomer_wait_ms",
        waited_ms,
        "<=" if bound is not None else None,
        bound,
        note="from its go to its first iteration on the device; bound: 3 of the lone "
        f"job's iterations + {WAIT_SLACK_MS:.0f} ms",
    )
    ph.fig("lone_iteration_ms", iteration_ms, note="the lone job's device time an iteration")


def _wait_for_steps(ph: Phase, s, job_id: int, steps: int) -> None:
    """Until gq has counted ``steps`` of the job's steps (its loop well under way)."""
    while True:
        job = next((j for j in s.node.jobs() if j["id"] == job_id), None)
        if job is not None and (job["steps_done"] or 0) >= steps:
            ph.note(f"job {job_id} at {job['steps_done']} steps")
            return
        if job is not None and job["state"] not in ("PENDING", "RUNNING"):
            raise JobFailed(f"job {job_id} {job['state']} before {steps} steps")
        if ph.left() <= 0:
            raise PhaseTimeout(f"waiting for job {job_id} to reach {steps} steps")
        time.sleep(0.05)
