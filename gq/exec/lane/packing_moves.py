"""The host's side of ``--lanes auto``: what it sees of each job, given to
:mod:`gq.exec.lane.packing` twice a second, and the moves of jobs between lanes its plan asks
for. A job moves only between iterations: one holding its lane under a grant moves once it
gives the lane back, one leased is asked for its lane back first; meanwhile it is granted
nothing where it was (:attr:`Resident.moving`).
"""

from __future__ import annotations

import logging
import time

from gq.exec.host.messages import PackingReport
from gq.exec.lane import packing
from gq.exec.lane.granting import Granter
from gq.exec.lane.packing import Mode, Packer, Sample
from gq.exec.lane.residents import Lane, Resident
from gq.exec.lane.standings import HOLDS_LANE, Standing

log = logging.getLogger("gq.host")


class LanePacking:
    def __init__(self, lanes: list[Lane], granter: Granter, packer: Packer):
        self.lanes = lanes
        self.granter = granter
        self.packer = packer
        self.next_at = 0.0
        self.moves_left = False  # a job waits to move once it gives its lane back
        self._asked: dict[int, float] = {}  # when (monotonic) each was asked to move
        # Work each job's iterations did (gq.exec.lane.packing.Sample), and the iterations the
        # host vouched for and the lane time it billed when last looked at.
        self._work: dict[int, tuple[float, int, float]] = {}

    def tick(self) -> None:
        """Sample and plan every :data:`gq.exec.lane.packing.PERIOD`; move the jobs waiting
        to move at once (called at every turn of the host's housekeeping)."""
        now = time.monotonic()
        if now < self.next_at:
            if self.moves_left:
                self._move(self._packable())
            return
        self.next_at = now + packing.PERIOD
        self.granter.read_leased_pages()
        residents = self._packable()
        present = {r.job_id for r in residents}
        self._work = {job: seen for job, seen in self._work.items() if job in present}
        self._asked = {job: at for job, at in self._asked.items() if job in present}
        plan = self.packer.plan()  # (as it stood over the lane time since the last look)
        samples = [self._sample(r, plan) for r in residents]
        self.packer.favours = self.granter.policy.name in packing.FAVOURING
        if self.packer.tick(now, samples):
            log.info(
                "lanes: %s (%s); jobs by lane %s",
                self.packer.mode.value,
                self.packer.last.value if self.packer.last else "-",
                self.packer.plan(),
            )
        self._move(residents)

    def _sample(self, resident: Resident, plan: dict[int, int]) -> Sample:
        vouched, billed = resident.vouched_iterations(), resident.billed
        pace = resident.timed_pace
        work, seen, held = self._work.get(resident.job_id, (0.0, vouched, billed))
        # The lane time since the last look, charged at the share of the device it got
        # side by side over it (its pace as last measured there; taking turns, all of it).
        resident.unbilled += max(0.0, billed - held) * (1.0 - self._share(resident, plan))
        # The count the host vouches for shrinks when the pace it timed grows: only what
        # passes the most it ever vouched for is new work (a job that made its pace go
        # up and down would otherwise be counted the same iterations again).
        if pace is not None:
            work += max(0, vouched - seen) * pace
        elif vouched > seen:  # untimed: its lane time, where it iterated (a lease held
            work += max(0.0, billed - held)  # through an idle gap bills it all the same)
        self._work[resident.job_id] = (work, max(seen, vouched), max(held, billed))
        # Memory side by side: the figure the job was admitted with (declared or probed,
        # which its cgroup or the worker's cap holds it to), never its own report.
        figure = resident.mem_cap
        return Sample(
            resident.job_id,
            work,
            max(seen, vouched),
            figure,
            figure,
            resident.user,
            timed=pace is not None,
            billed=billed,
        )

    def _share(self, resident: Resident, plan: dict[int, int]) -> float:
        """The share of the device ``resident`` is charged its lane time at now: on the lane
        the ``plan`` puts it on side by side, its pace measured there against the jobs
        running at once (gq.exec.lane.packing.lane_share); taking turns, or moving, 1."""
        mode, lane = self.packer.mode, plan.get(resident.job_id)
        if mode is Mode.TURNS or resident.moving or lane != resident.lane:
            return 1.0
        running = len(set(plan.values()))
        return packing.lane_share(self.packer.paces.get(resident.job_id), running)

    def _move(self, residents: list[Resident]) -> None:
        plan = self.packer.plan()
        self.moves_left = False
        for resident in residents:
            wanted = plan.get(resident.job_id, 0)
            if wanted >= len(self.lanes) or wanted == resident.lane:
                resident.moving = False
                self._asked.pop(resident.job_id, None)
                continue
            if not resident.moving:
                resident.moving = True
                self._asked[resident.job_id] = time.monotonic()
            if resident.standing is Standing.LEASED:
                self.granter.leases.recall(resident)
            if resident.standing in HOLDS_LANE and not self._overstays(resident):
                self.moves_left = True  # moved once it gives its lane back
                continue
            old = self.lanes[resident.lane]
            if resident not in old.residents:
                continue  # it has left its lane meanwhile: it takes no other
            old.residents.remove(resident)
            new = self.lanes[wanted]
            new.residents.append(resident)
            resident.lane, resident.moving = wanted, False
            self._asked.pop(resident.job_id, None)
            self.granter.schedule(old)
            self.granter.schedule(new)

    def _overstays(self, resident: Resident) -> bool:
        """A holder asked to move that has not given its lane back within --max-hold:
        frozen inside its iteration, it moves (an iteration that never ends would keep it
        side by side with the jobs it was to take turns with)."""
        now = time.monotonic()
        if now - self._asked.get(resident.job_id, now) < self.granter.max_hold:
            return False
        if not self.granter.stop_inside(resident, now, resident.kill_deadline is None):
            return False
        resident.taken += 1
        log.info("job %d kept its lane past --max-hold when asked to move: frozen", resident.job_id)
        return True

    def report(self) -> PackingReport:
        plan = self.packer.plan()
        by_lane: dict[int, list[int]] = {}
        for job, lane in sorted(plan.items()):
            by_lane.setdefault(lane, []).append(job)
        packer = self.packer
        return PackingReport(
            mode=packer.mode.value,
            lanes=[by_lane.get(lane, []) for lane in range(max(by_lane, default=-1) + 1)],
            most=packer.lanes,
            gain=None if packer.gain is None else min(packing.MOST_SHOWN, packer.gain),
            last=packer.last.value if packer.last else None,
            # (wall clock: the same in every report until the next failure)
            retry_at=round(time.time() + packer.retry_at - time.monotonic())
            if packer.mode is Mode.TURNS and packer.retry_at > time.monotonic()
            else None,
            slowest=packer.slowest[1] if packer.slowest else None,
            kept=None if packer.slowest is None else min(packing.MOST_SHOWN, packer.slowest[0]),
        )

    def _packable(self) -> list[Resident]:
        """The jobs that take turns on a lane: speaking the worker protocol, running, and
        on their lane still (one that said it has finished has left it)."""
        return [
            r
            for r in self.granter.residents.values()
            if r.channel is not None
            and not r.suspended
            and r.exit_status is None
            and r in self.lanes[r.lane].residents
        ]
