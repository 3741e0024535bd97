"""An interactive job's idle time, as its execution host sees it (``gq status``'s idle
mark, ``--idle-timeout``).

A job is active while it holds the lane, and when its terminal was last used: typed on (the
terminal's access time) or written to (its modification time), as ``w`` counts a login's
idle time; the kernel keeps those times to within 8 s. A REPL's statement or a notebook's
cell that computes keeps its terminal's times fresh (:mod:`gq.exec.job.console`), so a long
computation is not idle time. Those times are the job's to set: a job can only make itself
look busier than it is, which costs no one else anything (its time limit still holds); a
time in the future counts as now, and one before the job's start as its start (a job that
set its terminal's times to 1969 would otherwise send the daemon a time the wire refuses).
"""

from __future__ import annotations

CHECK_EVERY = 1.0  # seconds between looks at the interactive jobs' terminals
REPORT_STEP = 5.0  # a later activity than the one reported by less is not reported yet


def last_active(
    previous: float | None,
    terminal_used: float | None,
    holds_lane: bool,
    wall: float,
    started: float,
) -> float | None:
    """The latest activity known (wall clock), from ``started`` to ``wall``; None while none
    is."""
    times = [t for t in (previous, terminal_used) if t is not None]
    if holds_lane:
        times.append(wall)
    latest = max(times, default=None)
    return None if latest is None else min(max(latest, started), wall)


def idle_for(active_at: float | None, started: float, wall: float) -> float:
    """Seconds since the job's last activity, or since its start where it had none."""
    since = started if active_at is None else max(started, active_at)
    return max(0.0, wall - since)


def worth_reporting(reported: float | None, seen: float) -> bool:
    """Whether an activity at ``seen`` changes what the daemon was told enough to tell it."""
    return reported is None or seen >= reported + REPORT_STEP
