"""A strict central FIFO queue: the reference gq's fifo on several devices is measured
against (``bench/central_fifo.py``). Pure, and independent of the simulator: no lanes, no
admission, no estimates.

Jobs are taken in submission order. Each starts at the earliest time at or after its
arrival, and at or after the start of the job before it, at which as many devices as it
asks for (all of them, if it asks for more) are free; it holds them for its start-up, its
iterations and their gaps, alone. A device is any device: there is no topology.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from gq.sim.traces import TraceJob


def central_fifo(jobs: Sequence[TraceJob], gpus: int) -> dict[int, tuple[float, float]]:
    """Each job's (start, end) by id under a central FIFO queue of ``gpus`` devices."""
    if gpus < 1:
        raise ValueError("a node has at least 1 device")
    busy: list[tuple[float, int]] = []  # (end, devices) of the jobs started so far
    free, previous, found = gpus, -float("inf"), {}
    for job in sorted(jobs, key=lambda job: (job.submit_time, job.id)):
        wanted = min(job.gpus, gpus)
        start = max(job.submit_time, previous)
        # Starts never go back in time, so devices only come free from here on: the job
        # starts once enough of the running jobs have ended.
        while busy and (busy[0][0] <= start or free < wanted):
            end, devices = heapq.heappop(busy)
            free += devices
            start = max(start, end)
        end = start + job.startup + job.duration + job.iterations * job.gap
        heapq.heappush(busy, (end, wanted))
        free -= wanted
        found[job.id] = (start, end)
        previous = start
    return found
