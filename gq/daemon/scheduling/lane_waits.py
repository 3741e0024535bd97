"""Waiting behind a lane's residents: how long, moving a job that has not started, and an
idle resident giving its slot back.

Where the policy makes a newcomer wait behind the jobs already on its lane (fifo), admission
needs when each lane frees: the running jobs' time left, from their rows' progress. And a
resident that has not started yet, queued behind jobs that end later than another device
would start it, is better off there: :func:`move_unstarted` sends one back to the queue a
pass (:func:`gq.daemon.scheduling.admission.move` chooses it), and admission places it again. A
resident idle for ``--idle-resident``, of a user over their part of a device's slots, gives
its slot back to a job that waits for one (:func:`give_back_slot`,
:func:`gq.daemon.scheduling.residency.slot_to_give_back` chooses it): requeued, saying why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from gq import policies
from gq.daemon.scheduling import admission, residency
from gq.daemon.supervision.running import Running
from gq.daemon.supervision.supervisor import Supervisor
from gq.exec.host.messages import JobProgress, StopWhy
from gq.policies.base import time_left
from gq.queue.scheduling_rows import SchedulingRow as Row

log = logging.getLogger("gq.daemon")


def move_unstarted(
    rows: Sequence[Row],
    supervisor: Supervisor,
    allowed: Callable[[str | None, str | None], frozenset[str] | None],
    loads: Callable[[Sequence[Row]], list[admission.DeviceLoad]],
    margin: float,
) -> None:
    """A resident that has run no iteration, waiting behind jobs that end later than
    another device would start it, goes back to the queue (its process ended, the run
    not counted), and admission places it there: one a pass. ``rows``: the running jobs';
    ``allowed``: the devices a job may use, by its GPU type and the devices it named;
    ``loads``: the devices as admission sees them; ``margin``: how much sooner is worth a
    move (seconds)."""
    now = time.time()
    waiting = []
    lane_rows: dict[tuple[str, int], list[Row]] = {}
    for row in rows:
        job = supervisor.running.get(row.id)
        if job is not None and len(job.devices) == 1:
            lane_rows.setdefault((job.devices[0].name, job.lane), []).append(row)
    for (device, _lane), residents in lane_rows.items():
        for row in residents:
            job = supervisor.running[row.id]
            if (
                row.steps_done
                or row.attained
                or row.holds_lane
                or job.holds_lane
                or row.interpreter is None
                or job.exclusive
                or job.kill_why is not None
                or job.suspended
                or job.interactive
            ):
                continue
            starts_in = sum(
                _time_left(other, supervisor.running, now)
                for other in residents
                if (other.submit_time, other.id) < (row.submit_time, row.id)
            )
            waiting.append(
                admission.Unstarted(
                    row.id,
                    device,
                    job.footprint_now(),
                    starts_in,
                    gpus=row.gpus,
                    only=allowed(row.gpu_type, row.nodelist),
                )
            )
    chosen = admission.move(waiting, loads(rows), margin)
    if chosen is not None:
        # Not marked as being killed: its host refuses if it was granted an iteration
        # meanwhile, and then its run goes on as if nothing had been asked.
        log.info("job %d: moving it to a device that starts it sooner", chosen)
        supervisor.ask_to_move(supervisor.running[chosen])


def add_time_left(
    loads: dict[str, admission.DeviceLoad], rows: Sequence[Row], running: dict[int, Running]
) -> None:
    """Each lane's wait for a newcomer: the time left of the running jobs on it (``rows``:
    theirs; ``running``: as their hosts run them, by id)."""
    now = time.time()
    for row in rows:
        job = running.get(row.id)
        if job is None:
            continue
        left = _time_left(row, running, now)
        for device in job.devices:
            if (load := loads.get(device.name)) is not None:
                load.lanes[job.lane].starts_in += left


def _time_left(row: Row, running: dict[int, Running], now: float) -> float:
    """How long a running job will still hold its lane, as far as its row tells."""
    job = running[row.id]
    return time_left(running_view(row), now - job.started, job.time_limit)


def running_view(row: Row, progress: JobProgress | None = None) -> policies.JobView:
    """A running job's progress as policies see it: its row's, or ``progress`` (its host's
    last report, not yet flushed to the row)."""
    shown = row if progress is None else progress
    total = shown.steps_total if shown.steps_total is not None else row.steps_total
    return policies.JobView(
        id=row.id,
        user=row.user,
        submit_time=row.submit_time,
        priority=row.priority,
        steps_done=shown.steps_done if progress is None else progress.steps_counted,
        steps_total=total,
        attained=shown.attained,
        mean_iteration=shown.mean_iteration,
        mean_gap=shown.mean_gap,
    )


def give_back_slot(
    requests: Sequence[admission.Request],
    reasons: dict[int, str],
    loads: Sequence[admission.DeviceLoad],
    supervisor: Supervisor,
    idle_after: float,
) -> None:
    """Where jobs wait for room (those of ``requests``, in the policy's order, whose
    ``reasons`` say so: not the node's memory or CPUs, nor the guard) on a full device that
    would take them once a slot is free, and that device holds an idle resident of a user
    over their part of its slots that may give it back: that resident is requeued (its run
    ends; it says why), one a pass. A pass with no such resident costs a look at each
    running job, whatever waits."""
    if not loads:
        return
    now = time.time()
    residents = [
        residency.Resident(
            job.job_id,
            job.user,
            job.host,
            now - job.active_at,
            job.may_give_back(now),
            job.kill_why is StopWhy.YIELD,
        )
        for job in supervisor.running.values()
    ]
    if not any(r.may_yield and r.idle_for >= idle_after for r in residents):
        return  # (the usual pass: nobody to ask, whatever waits)
    asking = (
        residency.Waiting(
            request.user,
            frozenset(
                d.name
                for d in admission.usable(request.gpus, request.only, loads)
                if d.held is None and any(lane.fits_alone(request.footprint) for lane in d.lanes)
            ),
        )
        for request in requests
        if reasons.get(request.job_id) in admission.WAITS_FOR_ROOM
        and not request.exclusive
        and request.gpus <= 1
    )
    slots = min(load.max_resident for load in loads)
    chosen = residency.slot_to_give_back(asking, residents, slots, idle_after)
    if chosen is None:
        return
    job = supervisor.running[chosen.job_id]
    job.yielded = chosen.idle_for
    log.info(
        "job %d gives its slot on %s back: its lane idle for %.0f s while another user's "
        "job waits (--idle-resident)",
        job.job_id,
        job.host,
        chosen.idle_for,
    )
    supervisor.kill(job, StopWhy.YIELD)
