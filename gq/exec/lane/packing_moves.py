"""The host's side of ``--lanes auto``: what it sees of each job, given to
:mod:`gq.exec.lane.packing` twice a second, and the moves of jobs between lanes its plan asks
for. A job moves only between its iterations: one holding its lane under a grant moves once it
gives the lane back, one leased is asked for its lane back first; meanwhile it is granted
nothing where it was (:attr:`Resident.moving`).

**Work, as the host counts it.** Taking turns, a job's work is the lane time the host billed
it, grants and leases alike: under fair, turns are taken a slice at a time under leases
(gq.exec.lane.rule.sliced), whose iterations the host does not time, and a pace timed from
the few it does (the first after each switch, which carry the switch) would misread them.
Its pace is that lane time over the iterations it counted (less its first, warm-up), over
the turns measured last. On a lane of its own, its work is the iterations it counted since
at that pace, believed for no more than the lane time it held there holds at it; a job that
never iterated taking turns has no pace, and its lane time is its work.

The bound: every second of work is a second of lane time the host saw the job hold. Taking
turns its page's count moves only its pace: a count too high makes the pace, and so its
work on a lane of its own, smaller (itself packed worse); one too low, then a count too high
side by side, is believed for its lane time there and no more, as if it ran there as fast
as it could.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from gq.exec.host.messages import PackingReport
from gq.exec.lane import packing
from gq.exec.lane.granting import Granter
from gq.exec.lane.packing import Mode, Packer, Sample
from gq.exec.lane.residents import Lane, Resident
from gq.exec.lane.standings import HOLDS_LANE, Standing

log = logging.getLogger("gq.host")


@dataclass
class _Seen:
    """What the host had counted of a job at the last look: the work it reckoned, the
    iterations it believed, the lane time it billed, and that lane time less its first
    iteration's and its iterations less that one (what its pace is reckoned over)."""

    work: float
    iterations: int
    billed: float
    paced: float
    counted: int


def _pace_figures(resident: Resident) -> tuple[float, int]:
    """Its lane time and iterations, its first timed iteration (warm-up) left out."""
    first = 1 if resident.timed else 0
    return resident.billed - resident.first_iteration, resident.iterations - first


class LanePacking:
    def __init__(self, lanes: list[Lane], granter: Granter, packer: Packer):
        self.lanes = lanes
        self.granter = granter
        self.packer = packer
        self.next_at = 0.0
        self.moves_left = False  # a job waits to move once it gives its lane back
        self._asked: dict[int, float] = {}  # when (monotonic) each was asked to move
        # What the host had counted of each job at the last look, and the lane time and
        # iterations of each while taking turns, since the turns were last measured afresh.
        self._seen: dict[int, _Seen] = {}
        self._turns: dict[int, tuple[float, int]] = {}

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
        self._seen = {job: seen for job, seen in self._seen.items() if job in present}
        self._turns = {job: turns for job, turns in self._turns.items() if job in present}
        self._asked = {job: at for job, at in self._asked.items() if job in present}
        plan = self.packer.plan()  # (as it stood over the lane time since the last look)
        samples = [self._sample(r, plan) for r in residents]
        self.packer.favours = self.granter.policy.name in packing.FAVOURING
        was = self.packer.mode
        changed = self.packer.tick(now, samples)
        if self.packer.mode is Mode.TURNS and was is not Mode.TURNS:
            self._turns.clear()  # the turns measured afresh: their paces too
        if changed:
            log.info(
                "lanes: %s (%s); jobs by lane %s",
                self.packer.mode.value,
                self.packer.last.value if self.packer.last else "-",
                self.packer.plan(),
            )
        self._move(residents)

    def _sample(self, resident: Resident, plan: dict[int, int]) -> Sample:
        billed = resident.billed
        paced, counted = _pace_figures(resident)
        seen = self._seen.get(resident.job_id) or _Seen(0.0, 0, billed, paced, counted)
        held = max(0.0, billed - seen.billed)
        # The lane time since the last look, charged at the share of the device it got
        # side by side over it (its pace as last measured there; taking turns, all of it).
        resident.unbilled += held * (1.0 - self._share(resident, plan))
        done = max(0, counted - seen.counted)
        work, iterations = seen.work, seen.iterations
        turns = self.packer.mode is Mode.TURNS and not resident.moving
        if turns:  # its lane time is its work, and what its pace is reckoned over
            work, iterations = work + held, iterations + done
            lane_time, count = self._turns.get(resident.job_id, (0.0, 0))
            self._turns[resident.job_id] = (lane_time + max(0.0, paced - seen.paced), count + done)
        pace = self._pace(resident.job_id)
        if not turns and pace is not None:  # believed as far as its lane time holds them
            believed = min(done, math.ceil(held / pace)) if pace > 0 else done
            work, iterations = work + believed * pace, iterations + believed
        elif not turns and done:  # no pace: its lane time, where it iterated (a lease held
            work, iterations = work + held, iterations + done  # through a gap bills it too)
        self._seen[resident.job_id] = _Seen(
            work, iterations, max(seen.billed, billed), paced, counted
        )
        # Memory side by side: the figure the job was admitted with (declared or probed,
        # which its cgroup or the worker's cap holds it to), never its own report.
        figure = resident.mem_cap
        return Sample(
            resident.job_id,
            work,
            iterations,
            figure,
            figure,
            resident.user,
            timed=pace is not None,
            billed=billed,
        )

    def _pace(self, job: int) -> float | None:
        """Lane seconds an iteration of ``job`` took taking turns, as last measured (None:
        it iterated none there)."""
        lane_time, count = self._turns.get(job, (0.0, 0))
        return lane_time / count if count > 0 else None

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
