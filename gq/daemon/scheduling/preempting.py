"""Preemption that frees the device, under ``priority``: the scheduling pass's part.

Whom to preempt and who comes back first is :mod:`gq.daemon.scheduling.preemption` (pure). Here: the
first job admission left waiting for room (the highest, under ``priority``) that would fit
on a device once lower residents' memory went to host memory has them marked preempted
(the queue's flag and state history, Slurm's PREEMPTED) and suspended: their hosts move
their memory out at their next boundaries (gq.exec.host.memory_moves), and a later pass admits
the high job into what they freed. One preemption at a time on a device: while its victims'
memory is on its way, nothing more is preempted there. A victim whose host kept its memory
(the driver refused, no room in host memory) is let go on at once, and is not weighed
again in that run. Victims come back last out, first back, once their memory fits and no
job above them waits for room on their device. Rotation (gq.daemon.scheduling.rotating)
moves jobs out and back through the same books: :meth:`Preempter.follow`, :meth:`mark`,
:meth:`movable` and :meth:`may_move_on`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import astuple

from gq.daemon.devices import Device, context_memory
from gq.daemon.scheduling import admission, preemption
from gq.daemon.supervision.running import Running
from gq.daemon.supervision.supervisor import Supervisor
from gq.queue import job_updates
from gq.queue.engine import Database
from gq.queue.scheduling_rows import SchedulingRow as Row

log = logging.getLogger("gq.daemon")


class Preempter:
    def __init__(
        self,
        db: Database,
        supervisor: Supervisor,
        moves_memory: Callable[[Device], bool],
        fits_back: Callable[[Running], bool],
    ):
        self.db = db
        self.supervisor = supervisor
        self.moves_memory = moves_memory  # whether the device's host can move memory out
        self.fits_back = fits_back  # whether a job's memory fits on its device again
        self.out: list[int] = []  # the jobs preempted, oldest first
        self.kept: set[tuple[int, int]] = set()  # (job, run)s whose memory could not move

    def run(
        self,
        running: Sequence[Row],
        blocked: Sequence[admission.Request],
        reasons: dict[int, str],
        priorities: dict[int, int],
        loads: Sequence[admission.DeviceLoad],
    ) -> None:
        """One pass: ``blocked``, the requests admission did not place, in the policy's
        order, with why each waits and its priority; ``loads`` the devices as admission saw
        them. Only a job that waits for device room (not the node's CPUs, say) preempts."""
        self.follow(running)
        if blocked and reasons.get(blocked[0].job_id) == admission.RESOURCES:
            self._preempt_for(blocked[0], priorities[blocked[0].job_id], loads)
        self._bring_back(blocked, priorities)

    def follow(self, running: Sequence[Row]) -> None:
        """The jobs out as the queue flags them (after a restart too: those the daemon
        marked before it), each let go on where its host kept its memory."""
        flagged = [row.id for row in running if row.preempted]
        self.out = [j for j in self.out if j in flagged] + [j for j in flagged if j not in self.out]
        for job_id in list(self.out):
            self._let_go_where_held(job_id)

    def _let_go_where_held(self, job_id: int) -> None:
        job = self.supervisor.running.get(job_id)
        memory = job.latest.memory if job is not None and job.latest is not None else None
        if job is None or memory is None or not memory.held_why:
            return
        self.kept.add((job.job_id, job.run))
        log.warning("job %d not preempted: its memory stayed (%s)", job_id, memory.held_why)
        self.mark(job, False, f"let go on: its memory could not move ({memory.held_why})")

    def _preempt_for(
        self, request: admission.Request, priority: int, loads: Sequence[admission.DeviceLoad]
    ) -> None:
        if request.gpus > 1 or request.exclusive:
            return  # a job of whole devices waits for them, as before
        for load in loads:
            device = next((d for d in self.supervisor.devices if d.name == load.name), None)
            if request.only is not None and load.name not in request.only:
                continue
            if device is None or not self.may_move_on(load, device):
                continue
            for index, lane in enumerate(load.lanes):
                short = lane.need(request.footprint) - lane.capacity
                residents = [
                    preemption.Candidate(
                        job.job_id,
                        job.priority,
                        sum(astuple(job.footprint_now())) + context_memory(device),
                        job.active_at,
                    )
                    for job in self.movable(load.name, index)
                ]
                chosen = preemption.victims(short, priority, residents)
                if chosen:
                    for job_id in chosen:
                        self.mark(
                            self.supervisor.running[job_id],
                            True,
                            f"Preempted: its memory to host memory for job {request.job_id} "
                            f"(priority {priority})",
                        )
                    return

    def may_move_on(self, load: admission.DeviceLoad, device: Device) -> bool:
        """Whether a job's memory may be moved out on the device now: its host moves memory,
        the guard does not hold it, and no earlier move out there is on its way."""
        if load.held is not None or not self.moves_memory(device):
            return False
        # One preemption at a time: none while an earlier one's memory is on its way.
        return not any(
            not job.away
            for job_id in self.out
            if (job := self.supervisor.running.get(job_id)) is not None
            and load.name in {d.name for d in job.devices}
        )

    def movable(self, device: str, lane: int) -> list[Running]:
        """The residents of a device's lane whose memory may go: gq's worker's batch jobs
        (a plain process has no boundary to stop at, an interactive one is a person's),
        neither suspended nor being ended, their figures known."""
        return [
            job
            for job in self.supervisor.running.values()
            if job.lane == lane
            and [d.name for d in job.devices] == [device]
            and job.worker
            and not job.interactive
            and not job.exclusive
            and not job.probing
            and not job.suspended
            and job.kill_why is None
            and (job.job_id, job.run) not in self.kept
        ]

    def _bring_back(self, blocked: Sequence[admission.Request], priorities: dict[int, int]) -> None:
        """The last one out back first, unless a job above it waits for room on its
        device (it then waits too: its return would take that room)."""
        if not self.out:
            return
        last = self.supervisor.running.get(self.out[-1])
        if last is None or not last.away or not self.fits_back(last):
            return  # on its way out still, gone, or its room not free yet
        names = {d.name for d in last.devices}
        for request in blocked:
            above = priorities[request.job_id] > last.priority
            if above and (request.only is None or names & request.only):
                return
        self.mark(last, False, "brought back: its memory fits again")

    def mark(self, job: Running, preempted: bool, reason: str) -> bool:
        """Move the job out (suspended: its host moves its memory out at its next boundary)
        or let it come back (resumed once its memory fits: the scheduling pass's
        gated resume), with ``reason`` in its state history; whether it changed."""
        with self.db.write() as session:
            changed = job_updates.set_preempted(session, job.job_id, preempted, reason)
        if changed:
            log.info("job %d: %s", job.job_id, reason)
            if preempted:
                self.out.append(job.job_id)
                # Not waiting to come back any more (it may have come back before): what it
                # holds of the device is free once its memory is out.
                job.wants_back = False
                self.supervisor.suspend(job, True)
            else:
                self.out.remove(job.job_id)
        return changed
