"""What a lane's memory asks of its jobs, pure: whether a parked worker must give back its
cached device memory before another job's iteration (the Salus condition's max-ephemeral
sharing holds only then: the workers are separate processes), and whether a job measured
at a boundary holds more than its cap where no cgroup holds it (the cpu and emulated
devices without a memory controller): it has run out of memory. The granter
(:mod:`gq.exec.lane.granting`) asks at each grant and after each iteration.
"""

from __future__ import annotations

from gq.exec.lane.residents import Lane, Resident


def short_of_memory(lane: Lane, cuda: bool, capacity: int | None) -> bool:
    """Whether a parked worker must give back its cached device memory: the lane is
    shared, and its jobs' caps (where one is unknown, the lane's ``capacity``) may not fit
    together."""
    if not cuda:
        return False
    live = [r for r in lane.residents if r.channel is not None]
    if len(live) < 2:
        return False
    caps = [r.mem_cap for r in live]
    return (
        capacity is None or None in caps or sum(cap for cap in caps if cap is not None) > capacity
    )


def over_cap(resident: Resident, cuda: bool) -> bool:
    """Whether a job measured at a boundary holds more than its memory cap where nothing
    else holds it to that (no GPU allocator's fraction, no cgroup's limit)."""
    peak, cap = resident.mem_peak, resident.mem_cap
    return (
        peak is not None
        and cap is not None
        and not cuda
        and resident.cgroup_cap is None
        and peak > cap
    )
