"""Why a pending job waits, as squeue says it, and the pending jobs that can never start.

Before placing, the scheduling pass (:mod:`gq.daemon.scheduling.scheduler`) sorts the pending jobs:
those that may start now, those that wait for their begin time or a dependency (their reason
set), and those that never can (a dependency that cannot be satisfied, a deadline they can
no longer meet: cancelled). After placing, each job admission left waiting gets its reason:
admission's, or a more telling one (the memory it waits for, an operator's drain, its
array's limit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from gq.daemon.devices import Device
from gq.daemon.scheduling import admission
from gq.daemon.supervision import memory_figures
from gq.messages import MemoryBasis
from gq.queue import dependencies, job_updates, transitions
from gq.queue.engine import Database
from gq.queue.scheduling_rows import SchedulingRow as Row
from gq.queue.states import JobState
from gq.units import format_duration

# squeue's reasons for a pending job
DEPENDENCY = "Dependency"
ARRAY_LIMIT = "JobArrayTaskLimit"
NEVER_SATISFIED = "DependencyNeverSatisfied"
BEGIN_TIME = "BeginTime"
DRAINING = "ReqNodeNotAvail"


def eligible(
    db: Database,
    wake: Callable[[], None],
    pending: Sequence[Row],
    late_held: Sequence[Row],
    needs: dict[int, dependencies.Dependency],
    runs: dict[int, list[tuple[JobState, bool]]],
) -> list[Row]:
    """Pending jobs that may start now; the others get squeue's reason. Held jobs are
    not read here (holding set their reason) unless their deadline may pass. ``wake`` asks
    for another pass, once jobs were cancelled here."""
    eligible, reasons, never, late = [], {}, [], []
    now = time.time()
    for job in late_held:
        if now + (job.time_limit or 0) > (job.deadline or math.inf):
            late.append(job)
    for job in pending:
        if job.deadline is not None and now + (job.time_limit or 0) > job.deadline:
            late.append(job)  # as Slurm: removed once it can no longer end in time
            continue
        if job.begin_time is not None and job.begin_time > now:
            if job.reason != BEGIN_TIME:
                reasons[job.id] = BEGIN_TIME
            continue
        need = needs.get(job.id)
        outcome = (
            dependencies.evaluate(need, runs)
            if need is not None
            else dependencies.Outcome.SATISFIED
        )
        if outcome is dependencies.Outcome.NEVER:
            never.append(job.id)
        elif outcome is dependencies.Outcome.WAITING:
            if job.reason != DEPENDENCY:
                reasons[job.id] = DEPENDENCY
        else:
            eligible.append(job)
    if never or late or reasons:
        with db.write() as session:
            transitions.cancel_pending_many(session, never, NEVER_SATISFIED, now)
            for job in late:
                transitions.cancel_pending(
                    session, job.id, _too_late(job, now), state=JobState.DEADLINE
                )
            job_updates.set_pending_reasons(session, reasons)
    if never or late:
        wake()  # their dependants may now be unsatisfiable too
    return eligible


def hold_for_drain(db: Database, eligible: list[Row], why: str) -> None:
    """The node is drained: every job that could start waits, saying so."""
    reason = _draining(why)
    changed = {job.id: reason for job in eligible if job.reason != reason}
    if changed:
        with db.write() as session:
            job_updates.set_pending_reasons(session, changed)


def blocked(
    outcome: admission.Outcome,
    requests: Sequence[admission.Request],
    rows: dict[int, Row],
    throttled: Sequence[int],
    loads: list[admission.DeviceLoad],
    drained: dict[str, str],
    devices: Sequence[Device],
) -> dict[int, str]:
    """The reason of each job a pass did not start (``rows`` by id): admission's, the memory
    one raised after running out of it waits for, the operator's drain of every device it
    may use, or its array's limit (``throttled``: not offered to admission)."""
    reasons = dict(outcome.reasons)  # Resources for the first blocked job, as squeue
    for request in requests:  # one that ran out of memory says how much it waits for
        if (
            reasons.get(request.job_id) == admission.RESOURCES
            and rows[request.job_id].mem_basis == MemoryBasis.RAISED.value
        ):
            reasons[request.job_id] = memory_figures.shortage_reason(
                request.footprint.persistent, _most_free(loads, request)
            )
    if drained:  # a job that may run only where an operator drains says so
        every = frozenset(d.name for d in devices)
        for request in requests:
            allowed = request.only if request.only is not None else every
            if request.job_id in reasons and allowed and allowed <= set(drained):
                why = "; ".join(sorted(set(drained[name] for name in allowed)))
                reasons[request.job_id] = _draining(why)
    reasons.update({job_id: ARRAY_LIMIT for job_id in throttled})
    return reasons


def _most_free(loads: list[admission.DeviceLoad], request: admission.Request) -> int:
    """The most memory a lane of the devices a job may use has free now."""
    return max(
        (
            lane.headroom()
            for load in admission.usable(request.gpus, request.only, loads)
            for lane in load.lanes
        ),
        default=0,
    )


def _draining(why: str) -> str:
    return f"{DRAINING}: draining ({why})"


def _too_late(job: Row, now: float) -> str:
    if now >= (job.deadline or 0):
        return "deadline passed before it could start"
    return (
        f"cannot end before its deadline: its time limit {format_duration(job.time_limit)} "
        "ends after it"
    )
