"""Rotation (``--rotate PERIOD``) under ``fair`` and ``rr``: the scheduling pass's part.

Whom to move out and who comes in is :mod:`gq.daemon.scheduling.rotation` (pure). Here,
before admission in each pass: the node's lanes as rotation weighs them (each resident's
turn, what its move out frees, whether it may move), the jobs that wait (those rotated
out, and the first job the last pass left waiting for device room), and the rotations
chosen, carried out through the preempter's books (gq.daemon.scheduling.preempting):
residents marked out and suspended, their memory moved to host memory at their next
boundary (state S, PREEMPTED in their history, the reason saying after what turn and for
whom); a rotated-out job let back, its room kept from admission until it is resumed. A
pending job comes in through admission, into the room its predecessors left. What each
move out and back took is logged, as a warning past ROTATION_COST_SHARE of the period.

When turns began and when jobs went out is read back from their state histories after a
restart, so a restarted daemon goes on with the same turns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple

from gq import defaults
from gq.daemon.devices import context_memory
from gq.daemon.scheduling import admission, rotation
from gq.daemon.scheduling.preempting import Preempter
from gq.queue import lookups
from gq.queue.engine import Database
from gq.queue.scheduling_rows import SchedulingRow as Row
from gq.units import format_size

log = logging.getLogger("gq.daemon")
ROTATING = frozenset({"fair", "rr"})  # the policies that take turns over residency too


class Rotator:
    def __init__(
        self,
        db: Database,
        preempter: Preempter,
        period: float | None,
        wake: Callable[[], None],
        loads: Callable[[Sequence[Row]], list[admission.DeviceLoad]],
    ):
        self.db = db
        self.loads = loads  # the devices as admission sees them, given the running jobs' rows
        self.preempter = preempter
        self.supervisor = preempter.supervisor
        self.period = period  # None: --rotate not given
        self.wake = wake
        self.turns: dict[tuple[int, int], float] = {}  # (job, run) -> when its turn began
        self.went_out: dict[int, float] = {}  # job -> when it went out, until it is back
        self.moves: dict[int, tuple[str, float]] = {}  # each job's last move logged
        # The first job the last pass left waiting for device room, and since when it waits.
        self.waiting: list[tuple[admission.Request, float]] = []

    def active(self, policy: str) -> bool:
        return self.period is not None and policy in ROTATING

    def note_waiting(
        self,
        blocked: Sequence[admission.Request],
        reasons: Mapping[int, str],
        rows: Mapping[int, Row],
    ) -> None:
        """After admission: the first job it left waiting only for device room (one that
        shares a device: a job of whole devices waits for them), for the next pass."""
        self.waiting = [
            (request, rows[request.job_id].submit_time)
            for request in blocked[:1]
            if reasons.get(request.job_id) == admission.RESOURCES
            and request.gpus <= 1
            and not request.exclusive
        ]

    def run(self, running: Sequence[Row], pending: Sequence[Row], policy: str) -> None:
        """One pass where jobs rotate under the policy, before admission (a job let back
        has its room kept from the jobs it admits): ``pending`` the jobs it will weigh."""
        if self.period is None or policy not in ROTATING:
            return
        loads = self.loads(running)
        now = time.time()
        usage = self.supervisor.ledger.usages(now) if policy == "fair" else None
        self.preempter.follow(running)
        self._learn(now)
        self._follow_moves(now)
        waiters = self._waiters(loads, {row.id for row in pending})
        if not waiters:
            return
        rotations = rotation.plan(self._lanes(loads), waiters, self.period, now, usage)
        for chosen in rotations:
            self._carry_out(chosen, now)
        if rotations:
            self.wake()  # the resumes and admissions they make room for, soon

    def _learn(self, now: float) -> None:
        """When each running job's turn began (its start, or its last return) and when
        each job out went out: kept, else read from their state histories (a restart)."""
        jobs = self.supervisor.running
        unknown = [job for job in jobs.values() if (job.job_id, job.run) not in self.turns]
        out = [job_id for job_id in self.preempter.out if job_id not in self.went_out]
        if unknown or out:
            with self.db.read() as session:
                times = lookups.preemption_times(session, [job.job_id for job in unknown] + out)
            for job in unknown:
                back = times.get(job.job_id, (None, None))[1]
                self.turns[job.job_id, job.run] = max(job.started, back or 0.0)
            for job_id in out:
                self.went_out[job_id] = times.get(job_id, (None, None))[0] or now
        if len(self.turns) > len(jobs):
            live = {(job.job_id, job.run) for job in jobs.values()}
            self.turns = {key: began for key, began in self.turns.items() if key in live}

    def _follow_moves(self, now: float) -> None:
        """Log each move out and back of the jobs out (what a rotation costs), and start
        the turn of one whose memory is back on its device."""
        assert self.period is not None
        for job_id in list(self.went_out):
            job = self.supervisor.running.get(job_id)
            if job is None:
                del self.went_out[job_id]
                self.moves.pop(job_id, None)
                continue
            memory = job.latest.memory if job.latest is not None else None
            if memory is None or memory.took is None or memory.place not in ("host", "device"):
                continue
            move = (memory.place, memory.took)
            if self.moves.get(job_id) != move:
                self.moves[job_id] = move
                way = "out to host memory" if memory.place == "host" else "back to its device"
                costly = memory.took > defaults.ROTATION_COST_SHARE * self.period
                log.log(
                    logging.WARNING if costly else logging.INFO,
                    "job %d: its memory (%s) moved %s in %.2f s%s",
                    job_id,
                    format_size(memory.moved),
                    way,
                    memory.took,
                    f", more than {defaults.ROTATION_COST_SHARE:.0%} of the rotation "
                    f"period ({self.period:g} s)"
                    if costly
                    else "",
                )
            if memory.place == "device" and job_id not in self.preempter.out:
                del self.went_out[job_id]  # back: its turn begins
                self.turns[job.job_id, job.run] = now

    def _lanes(self, loads: Sequence[admission.DeviceLoad]) -> list[rotation.Lane]:
        lanes = []
        for load in loads:
            device = next((d for d in self.supervisor.devices if d.name == load.name), None)
            if device is None:
                continue
            busy = not self.preempter.may_move_on(load, device)
            for index in range(len(load.lanes)):
                movable = {job.job_id for job in self.preempter.movable(load.name, index)}
                residents = tuple(
                    rotation.Resident(
                        job.job_id,
                        job.user,
                        self.turns.get((job.job_id, job.run), job.started),
                        sum(astuple(job.footprint_now())) + context_memory(device),
                        job.job_id in movable,
                    )
                    for job in self.supervisor.running.values()
                    if job.lane == index
                    and load.name in {d.name for d in job.devices}
                    and not job.away
                )
                lanes.append(rotation.Lane(load.name, index, residents, busy))
        return lanes

    def _waiters(
        self, loads: Sequence[admission.DeviceLoad], pending: set[int]
    ) -> list[rotation.Waiter]:
        """The jobs out (waiting to come back where they were, or let back and waiting
        for their room there), and the first pending job waiting for room."""
        by_name = {load.name: load for load in loads}
        waiters = []
        for job in self.supervisor.running.values():
            out = job.job_id in self.preempter.out and job.away
            let_back = job.wants_back and job.suspended and job.memory_moved_out
            load = by_name.get(job.devices[0].name) if len(job.devices) == 1 else None
            if load is None or not (out or let_back) or job.kill_why is not None:
                continue
            lacks = -self.supervisor.free_beside(job, job.footprint_now())
            if out and load.residents >= load.max_resident:
                lacks = max(lacks, 1)  # its slot too: one resident out at least
            since = self.went_out.get(job.job_id, job.started)
            waiters.append(
                rotation.Waiter(job.job_id, job.user, since, {(load.name, job.lane): lacks})
            )
        for request, since in self.waiting:
            if request.job_id not in pending:
                continue
            short: dict[tuple[str, int], int] = {}
            for load in loads:
                if request.only is not None and load.name not in request.only:
                    continue
                for index, lane in enumerate(load.lanes):
                    need = lane.need(request.footprint) - lane.capacity
                    full = load.residents >= load.max_resident
                    short[load.name, index] = max(need, 1) if full else need
            waiters.append(rotation.Waiter(request.job_id, request.user, since, short))
        return waiters

    def _carry_out(self, chosen: rotation.Rotation, now: float) -> None:
        jobs = self.supervisor.running
        for job_id in chosen.out:
            job = jobs[job_id]
            turn = now - self.turns.get((job.job_id, job.run), job.started)
            reason = (
                f"Rotated out: its memory to host memory after its turn of {_spoken(turn)}; "
                f"job {chosen.incoming} in"
            )
            if self.preempter.mark(job, True, reason):
                self.went_out[job_id] = now
        incoming = jobs.get(chosen.incoming)
        if incoming is None or chosen.incoming not in self.preempter.out:
            return  # a pending job (admission places it), or one let back already
        memory = incoming.latest.memory if incoming.latest is not None else None
        took = f"; its memory went out in {memory.took:.2f} s" if memory and memory.took else ""
        waited = _spoken(now - self.went_out.get(chosen.incoming, now))
        if self.preempter.mark(incoming, False, f"Rotated in: its turn, after {waited} out{took}"):
            # Its room kept from admission from now on (it counts on its lane again), and
            # resumed by the pass's gated resume once the jobs it replaces are out.
            incoming.wants_back = True
            self.turns[incoming.job_id, incoming.run] = now


def _spoken(seconds: float) -> str:
    """A turn's length as people say it: ``2.0 s``, ``10 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 3 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
