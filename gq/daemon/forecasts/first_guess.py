"""A forecast for the seconds before the daemon's forecaster has made one of a job: a job
submitted since its last forecast (a child simulates the queue at most once a second, at a
low CPU priority, so on a loaded machine that can take a while), or one it could not
reach in its time budget. Time limits are all it goes on: a pending job starts now where a
device has room for another resident, else once that device's residents must have ended;
a job ends by its start plus its limit. Shown with its basis, ``guessed``, until the
forecast replaces it. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gq.daemon.scheduling.admission import DeviceLoad
from gq.messages import JobInfo
from gq.queue.states import JobState

GUESSED = "guessed"


def guess(info: JobInfo, loads: Sequence[DeviceLoad], now: float) -> bool:
    """Fill ``info``'s forecast with a first guess; False where time limits say nothing of
    it (no limit, and for a pending job, no device that must be free by a time)."""
    limit = info.time_limit
    if info.start_time is not None and limit is None:
        return False  # running, and nothing to say of its end
    start = info.start_time if info.start_time is not None else _start(info, loads, now)
    if start is None:
        return False
    end = start + limit if limit is not None else None
    info.forecast, info.forecast_start, info.forecast_end = GUESSED, start, end
    return True


def _start(info: JobInfo, loads: Sequence[DeviceLoad], now: float) -> float | None:
    """Now where a device it may use has room for another resident; else the soonest time
    such a device's residents must all have ended (their time limits)."""
    later = info.begin_time is not None and info.begin_time > now
    if info.state != JobState.PENDING.value or info.held or info.dependency or later:
        return None  # held, a dependency or a begin time: time limits say nothing of it
    allowed = set(info.nodelist.split(",")) if info.nodelist else None
    usable = [
        load
        for load in loads
        if (allowed is None or load.name in allowed)
        and (load.gpu or not info.gpus)
        and not load.held
    ]
    if any(load.residents < load.max_resident and not load.exclusive for load in usable):
        return now
    free = min((load.free_at for load in usable), default=math.inf)
    return None if math.isinf(free) else max(now, free)
