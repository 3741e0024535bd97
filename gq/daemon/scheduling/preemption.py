"""Whom a high-priority job that does not fit preempts: pure.

Under ``priority``, a pending job that does not fit beside a device's residents, only
because lower ones hold the memory, has the fewest of them that free enough moved out to
host memory (gq.exec.host.memory_moves): the least memory that frees enough (each preempted
job pays a move out and back, a few seconds per GPU), then the fewest jobs, then those
least recently used. (They come back last out, first back: gq.daemon.scheduling.preempting.)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

MOST_TRIED = 12  # candidates weighed at once (2**12 sets): the lowest, least recently used


@dataclass(frozen=True)
class Candidate:
    job_id: int
    priority: int
    frees: int  # bytes of the device its move out frees (its figure and its context)
    used_at: float  # when it last used its lane (wall clock)


def victims(short: int, priority: int, residents: Sequence[Candidate]) -> list[int] | None:
    """The residents below ``priority`` to move out so that ``short`` more bytes are free
    (none where nothing is short); None where even all of them would not free enough."""
    if short <= 0:
        return []
    lower = sorted(
        (r for r in residents if r.priority < priority and r.frees > 0),
        key=lambda r: (r.priority, r.used_at),
    )[:MOST_TRIED]
    if sum(r.frees for r in lower) < short:
        return None
    best: tuple[tuple[int, int, float], tuple[Candidate, ...]] | None = None
    for size in range(1, len(lower) + 1):
        for chosen in itertools.combinations(lower, size):
            freed = sum(r.frees for r in chosen)
            if freed < short:
                continue
            cost = (freed, size, max(r.used_at for r in chosen))
            if best is None or cost < best[0]:
                best = (cost, chosen)
    assert best is not None  # all of them free enough
    return sorted(r.job_id for r in best[1])
