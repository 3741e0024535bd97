"""A job's recent pace as its host measured it: the length of its iterations (per step) and
of its gaps, as the mean of the last ones less those far from their median. A plain mean
of all of them is led by a few outliers: a ``torch.compile`` job's compilations (seconds
each, among millisecond steps) read as a mean gap of 0.6 s, and its forecast end two
hours ahead of one eight seconds away; a checkpoint's save does the same. The window is
the decay: a job whose phase changes is measured at its new pace once the window has
turned over. Pure.
"""

from __future__ import annotations

from collections import deque

WINDOW = 64  # the last iterations (or gaps) kept
# Of those, the ones over this many times their median, or under their median over it, are
# left out. Trimming a fixed share would keep them where they are many of a few (two
# compilations among the first five gaps a host times); the mean of the rest keeps an
# honest job's spread, which a median alone would not.
OUTLIER = 4.0
# Iterations timed past the first before srtf ranks a job by its pace: on a busy machine one
# or two short iterations are as much the host's and the worker's scheduling as the job's,
# and a job srtf ranks behind on one of them never runs again to correct it.
SETTLED = 3


class RecentMean:
    """The last :data:`WINDOW` lengths measured, each with the steps it advanced (a gap or
    an iteration of a job whose steps are not counted: one each)."""

    def __init__(self) -> None:
        self._kept: deque[tuple[float, int]] = deque(maxlen=WINDOW)

    def add(self, length: float, steps: int = 1) -> None:
        self._kept.append((max(0.0, length), max(0, steps)))

    def __len__(self) -> int:
        return len(self._kept)

    def per_step(self) -> float | None:
        """Seconds a step: the kept lengths' time over the steps they advanced (where they
        advanced none, over their number: grants given back empty would otherwise make it
        read low where steps are counted, and divide by nothing where they are not)."""
        kept = self._trimmed()
        if not kept:
            return None
        steps = sum(count for _, count in kept)
        return sum(length for length, _ in kept) / (steps or len(kept))

    def per_item(self) -> float | None:
        """Seconds each, whatever steps they advanced."""
        kept = self._trimmed()
        return sum(length for length, _ in kept) / len(kept) if kept else None

    def _trimmed(self) -> list[tuple[float, int]]:
        """The kept lengths less those :data:`OUTLIER` times their median or more, or as
        many times less."""
        kept = sorted(self._kept)
        if not kept:
            return kept
        median = kept[len(kept) // 2][0]
        return [item for item in kept if median / OUTLIER <= item[0] <= median * OUTLIER]
