"""Admission on the simulated node: each device as the daemon's admission code sees it,
pending jobs placed on lanes in the policy's order, and residents that have not started moved
to a device that would start them sooner, as the daemon's scheduler asks at each pass.

Part of the simulation (:class:`gq.sim.simulator._Simulation`), whose event loop sets up the
state declared here."""

from __future__ import annotations

import math
from dataclasses import replace

from gq.daemon.scheduling import admission
from gq.policies import Policy
from gq.policies.base import time_left
from gq.sim.events import READY, EventQueue
from gq.sim.node import EPSILON, JobRun, Lane, Stretch


class Placement(EventQueue):
    """Placing jobs on the simulated node's lanes and moving them between devices."""

    policy: Policy
    gpus: int
    lanes_per_device: int
    admitted_lanes: int  # lanes a device has as admission sees it (--lanes auto: one)
    lanes: list[Lane]
    lane_capacity: list[int]  # a lane's memory for jobs, by device
    overheads: tuple[int, ...]
    max_resident: int
    backfill: bool
    move_margin: float
    names: tuple[str, ...]
    device_index: dict[str, int]
    held: dict[int, str]
    runs: dict[int, JobRun]
    pending: dict[int, JobRun]

    def _device_residents(self) -> list[list[JobRun]]:
        """Each device's resident jobs (a multi-GPU job on each of its devices)."""
        residents: list[list[JobRun]] = [[] for _ in range(self.gpus)]
        for lane in self.lanes:
            residents[lane.device] += lane.residents
        return residents

    def _sharing(self, lane: Lane) -> list[JobRun]:
        """The jobs admission counts on the lane: its own; under --lanes auto, all of its
        device's (whatever lane the host's packer put them on)."""
        if self.admitted_lanes == self.lanes_per_device:
            return lane.residents
        per = self.lanes_per_device
        device = self.lanes[lane.device * per : (lane.device + 1) * per]
        return [run for other in device for run in other.residents]

    def _room(self) -> bool:
        """Whether any device could take a job now (else placement is not worth asking)."""
        return any(
            len(jobs) < self.max_resident and not any(r.gpus > 1 for r in jobs)
            for jobs in self._device_residents()
        )

    def _loads(self, now: float) -> list[admission.DeviceLoad]:
        """Each device as admission sees it (the daemon's Scheduler.loads)."""
        per_lane = self.lanes_per_device
        return [
            admission.DeviceLoad(
                name=self.names[device],
                gpu=True,
                index=device,
                held=self.held.get(device),
                lanes=[
                    admission.LaneLoad(
                        self.lane_capacity[device],
                        [
                            admission.Footprint(r.job.mem or 0)
                            for r in self._sharing(self.lanes[device * per_lane + k])
                        ],
                        self._starts_in(self.lanes[device * per_lane + k], now),
                        self.overheads[device] if self.overheads else 0,
                    )
                    for k in range(self.admitted_lanes)
                ],
                max_resident=self.max_resident,
                residents=len(jobs),
                exclusive=any(r.gpus > 1 for r in jobs),
                free_at=max(
                    (r.start + r.job.limit for r in jobs if r.start is not None), default=0.0
                ),
            )
            for device, jobs in enumerate(self._device_residents())
        ]

    def _move_unstarted(self, now: float) -> set[int]:
        """Residents that have run no iteration go back to the queue where another device
        would start them sooner (admission.move, as the daemon's scheduler asks it at each
        of its passes); the lanes they left."""
        left: set[int] = set()
        while moved := self._move_one(now):
            left.update(moved)
        return left

    def _move_one(self, now: float) -> tuple[int, ...]:
        waiting = []
        for lane in self.lanes:
            current = lane.stretch.run if isinstance(lane.stretch, Stretch) else None
            for run in lane.residents:
                if run.done or run.gpus > 1 or run is current or run.start is None:
                    continue
                ahead = [
                    other
                    for other in self._sharing(lane)
                    if (other.job.submit_time, other.job.id) < (run.job.submit_time, run.job.id)
                ]
                waiting.append(
                    admission.Unstarted(
                        run.job.id,
                        self.names[lane.device],
                        admission.Footprint(run.job.mem or 0),
                        self._time_left(lane, ahead, now),
                        gpus=run.gpus,
                        only=None,
                    )
                )
        chosen = admission.move(waiting, self._loads(now), self.move_margin)
        if chosen is None:
            return ()
        run = self.runs[chosen]
        left = run.lanes
        for index in left:
            self.lanes[index].residents.remove(run)
        run.lanes, run.start, run.ready_at = (), None, 0.0
        self.pending[chosen] = run
        return left

    def _place(self, now: float) -> set[int]:
        """Admit pending jobs; the lanes that got one."""
        runs = self.runs
        order = self.policy.order([run.view() for run in self.pending.values()])
        requests = [runs[view.id].request for view in order]
        per_lane = self.lanes_per_device
        loads = self._loads(now)
        outcome = admission.place(
            requests, loads, now=now, backfill=self.backfill, waits_behind=self.policy.waits_behind
        )
        touched: set[int] = set()
        for placement in outcome.placements:
            run = self.pending.pop(placement.job_id)
            run.lanes = tuple(
                self.device_index[name] * per_lane + placement.lane for name in placement.devices
            )
            run.start = now
            run.ready_at = now + run.job.startup
            for index in run.lanes:
                self.lanes[index].residents.append(run)
            touched.update(run.lanes)
            if run.job.startup:
                self._push(run.ready_at, READY, run.job.id)
        return touched

    def _starts_in(self, lane: Lane, now: float) -> float:
        """When a job placed on the lane now would get its first iteration, as the daemon
        predicts it: 0 unless the policy makes a newcomer wait behind the residents."""
        if not self.policy.waits_behind:
            return 0.0
        return self._time_left(lane, self._sharing(lane), now)

    def _time_left(self, lane: Lane, runs: list[JobRun], now: float) -> float:
        """How long ``runs`` of the lane will still hold it, as the daemon predicts it
        (:func:`gq.policies.base.time_left`, from the progress they show by now). A job the
        trace gives no time limit is known perfectly: its steps left at its pace. (Its run
        alone taken as a limit counted from its placement, as the daemon counts a real
        one, made a job waiting behind others seem to end the sooner the longer it had
        waited: jobs were bound behind it, and moved, where it would in fact run its whole
        length.)"""
        total = 0.0
        for run in runs:
            done = 0
            stretch = self.lanes[run.lanes[0]].stretch if run.lanes else lane.stretch
            if isinstance(stretch, Stretch) and stretch.run is run and now > stretch.begin:
                # iterations of the stretch released by now (the k-th at begin + k periods
                # less a gap): what a stretch of one at a time would have counted
                done = min(
                    stretch.count,
                    max(0, math.floor((now - stretch.begin + run.job.gap) / run.period + EPSILON)),
                )
            view = run.projected(done, run.released_at) if done else run.view()
            limit = run.job.time_limit
            if limit is None:
                view = replace(view, mean_iteration=run.job.iteration_time, mean_gap=run.job.gap)
            total += time_left(view, now - (run.start or now), limit)
        return total
