"""Memory safety (pure): what a job's device-memory figure is, and what a run that ran out
of memory comes to.

A job's figure is what it declared (``--gpu-mem``); for a job that declared nothing, the
peak of its first iterations plus a margin, measured while it has its lane to itself (its
probe); after a run that ran out of memory, what that run asked for. The figure is what
admission counts, with what the job was measured to hold where that is more, and the job's
cap (see :mod:`gq.exec.host.loop`), but for a probed figure on the cpu and emulated devices,
where a probe sees less than the job's cgroup counts.

A run that ran out of memory goes back to the queue, its figure raised to what it asked
for, to start again once that much is free; it fails instead where its owner said so
(``--oom fail``), where not even an empty device offers that much, or once it has run out
of memory more often than ``--retries`` allows (``OOM_REQUEUES`` without it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gq import defaults
from gq.messages import OnOutOfMemory
from gq.units import format_size


@dataclass(frozen=True)
class Verdict:
    requeue: bool  # back to the queue (else FAILED, its figure as it was)
    figure: int  # what it needs: its device-memory figure from now on, if requeued
    reason: str  # squeue's REASON while it waits, or why it failed


def probed_figure(peak: int, margin: float = defaults.MEMORY_MARGIN) -> int:
    """A probed job's figure: its measured peak and a margin for what its later iterations
    may add (a longer sequence, a larger batch at the end)."""
    return math.ceil(peak * (1 + margin))


def over_figure(figure: int | None, peak: int | None) -> bool:
    """Whether a job was measured to hold more device memory than its figure (MEM!), past
    what the allocator's rounding adds to an honest figure (``MEM_OVER_SLACK``)."""
    return figure is not None and peak is not None and peak > figure + defaults.MEM_OVER_SLACK


def shortage_reason(need: int, free: int) -> str:
    return f"OutOfMemory (needs {format_size(need)}, {format_size(max(free, 0))} free)"


def after_shortage(
    held: int,
    wanted: int | None,
    figure: int | None,
    on_oom: OnOutOfMemory,
    ooms: int,
    retries: int | None,
    free: int,
    largest: int,
) -> Verdict:
    """What a run that ran out of memory comes to: it ``held`` so much and ``wanted`` so much
    (None: it did not say; then its figure grows by ``OOM_GROWTH``), had the ``figure``, had
    run out ``ooms`` times before; ``free``: what its lane had left beside its neighbours;
    ``largest``: what the largest lane of an empty device offers."""
    need = wanted if wanted is not None else math.ceil(max(held, figure or 0) * defaults.OOM_GROWTH)
    if figure is not None and need <= figure:
        # It ran out within its own figure: its allocator's cache, or a neighbour over its
        # own. Grown all the same, so that runs out of memory end (each is counted).
        need = math.ceil(figure * defaults.OOM_GROWTH)
    need = max(need, held, 1)
    reason = shortage_reason(need, free)
    allowed = retries if retries is not None else defaults.OOM_REQUEUES
    if on_oom is OnOutOfMemory.FAIL:
        return Verdict(False, need, f"{reason}; --oom fail")
    if need > largest:
        return Verdict(
            False,
            need,
            f"{reason}; no device of this node offers "
            f"{format_size(need)} (at most {format_size(largest)})",
        )
    if ooms >= allowed:
        return Verdict(False, need, f"{reason}; ran out of memory {ooms + 1} times")
    return Verdict(True, need, reason)
