"""Jobs side by side on one simulated device: how fast each runs. Pure.

A job keeps a share of its device busy while it computes alone (``busy``, 0 < busy <= 1:
a launch-bound loop or a single-threaded job on a many-core cpu leaves the rest idle). Jobs
on parallel lanes of one device share it as the driver's time-slicing shares it
(processor sharing): while the busy shares of the jobs running at once add up to 1 or less,
each runs at its own speed alone; past 1, each is slowed by that sum. Taking turns on one
lane, one job runs at a time: it goes at its speed alone whatever its share.
"""

from __future__ import annotations

from collections.abc import Iterable


def slowdown(busy: Iterable[float]) -> float:
    """How many times longer an iteration takes with these jobs running at once on one
    device (each one's busy share) than alone: 1 while the shares fit, else their sum."""
    return max(1.0, sum(busy))


def work_rate(busy: Iterable[float]) -> float:
    """The work a second (seconds of the jobs' iterations at their speed alone) that jobs
    running at once on one device do together, always ready: taking turns it is 1."""
    shares = list(busy)
    return len(shares) / slowdown(shares)


def busy_for_gain(gain: float, running: int) -> float:
    """The busy share that makes ``running`` jobs side by side, each always ready, do
    ``gain`` times the work of taking turns (what a host measured of a packing): 1/gain,
    within what side by side can do (no less than one lane's share, no more than the
    whole device)."""
    if running < 2 or not gain > 1.0:
        return 1.0
    return 1.0 / min(float(running), gain)
