"""The GPU check's lone_tail phase (bench/gpu_check.py): how long a job that comes waits
for one that had its lane alone. Alone, a job holds its lane under a lease and does not
wait for its device at each release; it keeps no more than one iteration queued ahead of
the one the device runs (gq.exec.lane.device_sync), so a newcomer waits for under three of
its iterations' device work, and not for the thousand kernels CUDA queues before a launch
blocks.

A spin job runs alone until told to stop; once gq has counted some of its steps (its lease
taken, its device's queue as full as it gets), a second spin job is let go, and the first
is stopped once the second is done. Its wait is from then to
the start of its first iteration on the device (its CUDA timing event on the common
monotonic clock: the device ran it once the holder's tail had drained), against the
holder's device time an iteration. On the cpu device there is no queue to drain: INFO.
"""

from __future__ import annotations

import time

from gpu_check_lib import JobFailed, Phase, PhaseTimeout, mean_interval_ms

WAIT_SLACK_MS = 25.0  # the grant's own path: the host's recall, a READY, a Go
LONE_STEPS_FIRST = 50  # steps gq counts of the lone job before the newcomer goes
LONE_ITERS_MOST = 100_000  # (it is stopped long before: the phase's budget ends it else)


def lone_tail(ph: Phase, s) -> None:
    s.node.gq("policy", "set", "fair")
    plain = "lone_tail" in s.cfg["plain"]
    lone = s.args("spin", LONE_ITERS_MOST, plain=plain)
    ph.submit("lone", lone, stage="lone", stop="lone-stop", options=s.mem("spin"))
    ph.submit("newcomer", s.args("spin", 20, plain=plain), stage="newcomer", options=s.mem("spin"))
    ph.wait_ready(["lone", "newcomer"])
    ph.go("lone")
    _wait_for_steps(ph, s, ph.ids["lone"], LONE_STEPS_FIRST)
    came = time.monotonic_ns()
    ph.go("newcomer")
    runs = ph.wait_done(["newcomer"])
    ph.go("lone-stop")
    runs.update(ph.wait_done(["lone"]))
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
    """Until gq has counted ``steps`` of the job's steps (its loop well under way), read
    from the queue: a listing through the CLI at each look would cost the measured job CPU
    and the daemon work."""
    while True:
        found = s.node.progress(job_id)
        if found is not None and found[1] >= steps:
            ph.note(f"job {job_id} at {found[1]} steps")
            return
        if found is not None and found[0] not in ("PENDING", "RUNNING"):
            raise JobFailed(f"job {job_id} {found[0]} before {steps} steps")
        if ph.left() <= 0:
            raise PhaseTimeout(f"waiting for job {job_id} to reach {steps} steps")
        time.sleep(0.05)
