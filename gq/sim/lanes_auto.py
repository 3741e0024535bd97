"""``--lanes auto`` on the simulated node: each device's jobs take turns on one lane or run
on lanes of their own at once as the execution host decides it, by the same pure code
(:class:`gq.exec.lane.packing.Packer`), fed what the host would see of them.

The simulated host looks when its jobs change and whenever the packer says a look may
decide something (:meth:`~gq.exec.lane.packing.Packer.next_look`); what it gives the packer
is each job's work as the host counts it: its iterations at its pace alone once that pace
was timed taking turns with another job, else the lane time it held. Admission sees each
device as one lane of all its memory, as the daemon does under ``--lanes auto``; the packer
spreads the jobs over the device's lanes, and a job moves only between its iterations (one
in a stretch is cut at its next boundary and moves then). How fast jobs side by side go is
:mod:`gq.sim.side`'s.

Part of the simulation (:class:`gq.sim.simulator._Simulation`), whose event loop sets up the
state declared here."""

from __future__ import annotations

import math
from collections.abc import Callable

from gq.exec.lane import packing
from gq.exec.lane.packing import Packer, Sample
from gq.policies import Policy
from gq.sim.events import LOOK, EventQueue
from gq.sim.node import EPSILON, JobRun, Lane, SharedWindow, Stretch


class LanesAuto(EventQueue):
    """The simulated host's packing: one packer a device, its looks and its moves."""

    policy: Policy
    lanes_per_device: int
    lanes: list[Lane]
    packers: list[Packer]  # one a device; none unless --lanes auto
    look_at: list[float]  # when each device's next look is due (inf: none)
    moving: set[int]  # jobs to move once their stretch ends
    runs: dict[int, JobRun]
    _cut: Callable[[Lane, float], None]  # the stretches': end a lane's at its next boundary

    def _packable(self, device: int, now: float) -> list[JobRun]:
        """The jobs the host would sample: past their start-up, iterating still, on one
        device (a job on several has them to itself)."""
        per = self.lanes_per_device
        return [
            run
            for lane in self.lanes[device * per : (device + 1) * per]
            for run in lane.residents
            if len(run.lanes) == 1
            and run.start is not None
            and run.start + run.job.startup <= now
            and run.done < run.job.iterations
        ]

    def _looks(self, now: float, due: set[int]) -> set[int]:
        """Look at the devices whose look is ``due`` now and those whose jobs changed; the
        lanes whose jobs moved (their picks may change)."""
        for device, packer in enumerate(self.packers):
            jobs = self._packable(device, now)
            if device in due or packer.jobs != frozenset(run.job.id for run in jobs):
                self._look(device, jobs, now)
        return self._move(now)

    def _look(self, device: int, jobs: list[JobRun], now: float) -> None:
        """Give the device's packer what the host sees; where its plan changed, the jobs on
        another lane than it plans are to move (those in a stretch at its next boundary)."""
        packer = self.packers[device]
        packer.favours = self.policy.name in packing.FAVOURING
        changed = packer.tick(now, [self._sample(run, now) for run in jobs])
        self.look_at[device] = math.inf
        if len(jobs) >= 2 and packer.lanes >= 2:
            self.look_at[device] = packer.next_look(now)
            self._push(self.look_at[device], LOOK, device)
        if not changed:
            return
        plan, per = packer.plan(), self.lanes_per_device
        for run in jobs:
            if run.lanes[0] != device * per + plan.get(run.job.id, 0):
                self.moving.add(run.job.id)
                self._cut(self.lanes[run.lanes[0]], now)

    def _move(self, now: float) -> set[int]:
        """Move the jobs waiting to move that hold no stretch now; the lanes they left and
        joined."""
        touched: set[int] = set()
        per = self.lanes_per_device
        for job_id in sorted(self.moving):
            run = self.runs[job_id]
            if not run.lanes or run.end is not None:
                self.moving.discard(job_id)
                continue
            old = self.lanes[run.lanes[0]]
            if old.stretch is not None and _holds(old.stretch, run):
                continue
            device = old.device
            wanted = device * per + self.packers[device].plan().get(job_id, 0)
            self.moving.discard(job_id)
            if wanted == old.index:
                continue
            old.residents.remove(run)
            self.lanes[wanted].residents.append(run)
            run.lanes = (wanted,)
            touched |= {old.index, wanted}
        return touched

    def _sample(self, run: JobRun, now: float) -> Sample:
        """What the host sees of a job now: the iterations it has ended (in a stretch under
        way, those released by now) and its work, and its memory as admitted."""
        done, held = run.done, run.held
        stretch = self.lanes[run.lanes[0]].stretch
        if isinstance(stretch, Stretch) and stretch.run is run and now > stretch.begin:
            period = run.period
            more = math.floor((now - stretch.begin + run.job.gap) / period + EPSILON)
            done += min(stretch.count, max(0, more))
            held += min(now, stretch.released_at) - stretch.begin
        work = done * run.job.iteration_time if run.timed else held
        memory = run.job.mem or 0
        return Sample(
            run.job.id, work, done, memory, memory, run.job.user, timed=run.timed, billed=held
        )


def _holds(held: Stretch | SharedWindow, run: JobRun) -> bool:
    """Whether ``run`` is inside what holds its lane (until it is settled, even where it
    ends now)."""
    if isinstance(held, Stretch):
        return held.run is run
    return any(other is run for other, _ in held.counts)
