"""The scheduling pass: which pending jobs start now, on which devices, and why the others
wait (squeue's reasons, :mod:`gq.daemon.scheduling.pending_reasons`); and the requests users made of
running jobs (stop, new priority or time limit), passed on to their hosts.

Admission itself is pure (:mod:`gq.daemon.scheduling.admission`, shared with the simulator); this
module reads the queue, builds admission's view of the node (:meth:`Scheduler.loads`) and
acts on the outcome through the supervisor. How long a newcomer waits behind a lane's
residents, and moving one that has not started, are :mod:`gq.daemon.scheduling.lane_waits`; the jobs
of a forecast's snapshot of what the pass read, :mod:`gq.daemon.forecasts.snapshot_jobs`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gq import defaults, policies
from gq.daemon import devices as devices_mod
from gq.daemon.devices import Device, context_memory
from gq.daemon.forecasts import snapshot_jobs as forecast_jobs
from gq.daemon.monitoring.monitor import Monitor
from gq.daemon.scheduling import admission, lane_waits, pending_reasons
from gq.daemon.scheduling.preempting import Preempter
from gq.daemon.scheduling.rotating import Rotator
from gq.daemon.supervision.running import Running, footprint
from gq.daemon.supervision.supervisor import Supervisor
from gq.exec.host import messages as wire
from gq.exec.host.checkpoint import moves_memory
from gq.exec.host.messages import StopWhy
from gq.queue import dependencies, job_updates, lookups, scheduling_rows
from gq.queue import settings as queue_settings
from gq.queue.engine import Database
from gq.queue.scheduling_rows import SchedulingRow as Row
from gq.queue.states import JobState
from gq.sim import forecast, work_estimates

log = logging.getLogger("gq.daemon")
PENDING_DRIFT = "pending jobs' rows read again differ from those kept between passes"


@dataclass(frozen=True)
class Capacity:
    """What the daemon was told each device offers."""

    lanes: int
    max_resident: int
    probe: int = defaults.PROBE_MEMORY  # free memory a job that declares none needs
    # Seconds a resident may run no iteration before it gives its slot to a waiting job
    # (of a user over their part of the device's slots; gq.daemon.scheduling.residency).
    idle_resident: float = defaults.IDLE_RESIDENT
    checkpoint: str = "auto"  # how the hosts move suspended jobs' memory (gq.exec.host.checkpoint)
    rotate: float | None = None  # --rotate: a resident's turn while others wait (None: off)

    def moves_memory(self, device: Device) -> bool:
        """Whether the device's host moves a suspended job's memory to host memory (the
        driver may still refuse it: gq.daemon.scheduling.preempting learns that)."""
        return moves_memory(self.checkpoint, device.kind == "cuda")


class Scheduler:
    def __init__(
        self,
        db: Database,
        devices: list[Device],
        capacity: Capacity,
        supervisor: Supervisor,
        monitor: Monitor,
        wake: Callable[[], None],
        move_margin: float = defaults.MOVE_MARGIN,
    ):
        self.db = db
        self.devices = devices
        self.capacity = capacity
        self.supervisor = supervisor
        self.monitor = monitor
        self.wake = wake
        # (name, fill, quantum) and the bound on holds others wait for, as the hosts have it
        self.policy_setting: tuple[tuple[str, str, str], float] | None = None
        self.policy = policies.make("fifo")
        self._dependencies: dict[str, dependencies.Dependency] = {}
        self.drained: dict[str, str] = {}  # device (or the node) -> the operator's reason
        self.move_margin = move_margin  # seconds sooner elsewhere that move an unstarted job
        self.node_cpus = os.cpu_count() or 1
        self._per_row: dict[Row, tuple[policies.JobView, admission.Request]] = {}
        self._pending = scheduling_rows.PendingRows(defaults.PENDING_REREAD_PERIOD)
        # What a job that declares no memory needs free to start: the probe's first guess,
        # at most a lane of the smallest device (else it could never start there).
        self.probe_guess = min([capacity.probe, *map(self.lane_memory, devices)])
        self.last_pass: forecast_jobs.Pass | None = None
        # (user, name) -> the pace of their running job of that name, at the last snapshot
        self.running_paces: dict[tuple[str, str], work_estimates.Past] = {}
        self._unplaced: (
            tuple[
                list[admission.Request], dict[int, str], dict[int, int], list[admission.DeviceLoad]
            ]
            | None
        ) = None
        self.preempter = Preempter(db, supervisor, capacity.moves_memory, self._room_to_come_back)
        self.rotator = Rotator(db, self.preempter, capacity.rotate, wake, self.loads)

    def lane_memory(self, device: Device) -> int:
        """What one lane of the device offers: its memory split evenly between lanes."""
        return device.memory_total // self.capacity.lanes

    def scan(self) -> None:
        config = self.db.settings()
        with self.db.read() as session:  # (changes taken inside it: none lost if it fails)
            pending = self._pending.read(session, self.db.pending_changes(), time.monotonic())
            if self._pending.drifted:
                log.warning(
                    "%s (jobs %s): a write the daemon did not make, or one its watch missed",
                    PENDING_DRIFT,
                    _listed(self._pending.drifted),
                )
                self._pending.drifted = []
            late_held = scheduling_rows.held_with_deadline(session)
            running = scheduling_rows.for_scheduling(session, JobState.RUNNING)
            needs: dict[int, dependencies.Dependency] = {}
            for job in pending:
                if job.dependency:
                    needs[job.id] = self._parsed(job.dependency)
            referenced = set().union(*(need.job_ids for need in needs.values()))
            runs = {
                job_id: [(JobState(state), started) for state, started in states]
                for job_id, states in lookups.run_states(session, referenced).items()
            }
        self.apply_policy(config)
        self._follow_running(running)
        self.drained = dict(config[queue_settings.DRAINED])
        self.last_pass = forecast_jobs.Pass(pending, running, needs, runs)
        eligible = pending_reasons.eligible(self.db, self.wake, pending, late_held, needs, runs)
        self.rotator.run(running, eligible, self.policy.name)  # before admission: rotating.py
        placed = 0
        if eligible and queue_settings.NODE in self.drained:
            pending_reasons.hold_for_drain(self.db, eligible, self.drained[queue_settings.NODE])
        elif eligible:
            array_running: dict[int, int] = {}
            for row in running:
                if row.array_job_id is not None:
                    array_running[row.array_job_id] = array_running.get(row.array_job_id, 0) + 1
            placed = self._admit(eligible, array_running, self._node_room(running), running)
        self._preempt(running)
        # Not in a pass that launched jobs: their lanes' waits are not in the rows read.
        if self.policy.waits_behind and len(self.devices) > 1 and not placed:
            lane_waits.move_unstarted(
                running, self.supervisor, self._allowed, self.loads, self.move_margin
            )

    def _preempt(self, running: Sequence[Row]) -> None:
        """Under priority, room for the first job left waiting (preempting.py); unless jobs
        rotate (rotating.py), the preempted jobs back as their room comes free."""
        blocked, reasons, priorities, loads = self._unplaced or ([], {}, {}, None)
        self._unplaced = None
        if self.rotator.active(self.policy.name):
            return
        if self.policy.name != "priority":
            blocked = []
        if blocked or self.preempter.out or any(row.preempted for row in running):
            self.preempter.run(running, blocked, reasons, priorities, loads or self.loads(running))

    def _parsed(self, text: str) -> dependencies.Dependency:
        """A dependency's parse, kept: the same few texts recur in every pass."""
        parsed = self._dependencies.get(text)
        if parsed is None:
            if len(self._dependencies) > 10_000:
                self._dependencies.clear()
            parsed = self._dependencies[text] = dependencies.parse(text)
        return parsed

    def apply_policy(self, config: dict) -> None:
        wanted = (
            config[queue_settings.POLICY],
            config[queue_settings.FILL],
            config[queue_settings.QUANTUM],
        )
        max_hold = config[queue_settings.MAX_HOLD]
        if (wanted, max_hold) == self.policy_setting:
            return
        self.policy_setting = (wanted, max_hold)
        self.policy = policies.make(*wanted)
        self.supervisor.set_policy(wire.SetPolicy(*wanted, max_hold=max_hold))
        log.info("policy is now %s (fill %s, quantum %s; max hold %g s)", *wanted, max_hold)

    def _follow_running(self, rows: Sequence[Row]) -> None:
        """Stop requests and updates that users made to running jobs."""
        for row in rows:
            job = self.supervisor.running.get(row.id)
            if job is None:
                continue
            if row.stop_request and job.kill_why is None:
                self.supervisor.kill(job, StopWhy(row.stop_request))
            if (row.priority, row.time_limit) != (job.priority, job.time_limit):
                self.supervisor.update(job, row.priority, row.time_limit)
            suspended = bool(row.suspended or row.preempted)  # a user's, or the daemon's
            if suspended != job.suspended and job.kill_why is None:
                # Resumed: what it needs is kept for it from now until its host says its
                # memory is no longer in host memory (gq.daemon.supervision.running.away).
                job.wants_back = not suspended
                if job.wants_back and not self._room_to_come_back(job):
                    continue  # resumed once its memory fits beside what runs there now
                self.supervisor.suspend(job, suspended)

    def _room_to_come_back(self, job: Running) -> bool:
        """Whether a job whose memory went to host memory fits on its lane again: others
        were admitted into what it freed, and its restore must not take theirs."""
        if not job.memory_moved_out:
            return True
        return self.supervisor.free_beside(job, job.footprint_now()) >= 0  # (its context too)

    def _admit(
        self,
        pending: list[Row],
        array_running: dict[int, int],
        node: admission.NodeRoom,
        running: Sequence[Row],
    ) -> int:
        """Start what may start; how many jobs were placed."""
        by_id = {job.id: job for job in pending}
        derived = self._derived(pending)
        requests, throttled = [], []
        admitted = dict(array_running)
        usage = self.supervisor.ledger.usages()  # fair orders users by it
        for view in self.policy.order([view for view, _ in derived.values()], usage):
            job = by_id[view.id]
            if job.array_job_id is not None and job.array_max_running is not None:
                if admitted.get(job.array_job_id, 0) >= job.array_max_running:
                    throttled.append(job.id)
                    continue
                admitted[job.array_job_id] = admitted.get(job.array_job_id, 0) + 1
            requests.append(derived[job][1])
        loads = self.loads(running)
        outcome = admission.place(
            requests, loads, now=time.time(), node=node, waits_behind=self.policy.waits_behind
        )
        lane_waits.give_back_slot(
            requests, outcome.reasons, loads, self.supervisor, self.capacity.idle_resident
        )
        reasons = pending_reasons.blocked(
            outcome, requests, by_id, throttled, loads, self.drained, self.devices
        )
        changed = {
            job_id: reason for job_id, reason in reasons.items() if by_id[job_id].reason != reason
        }
        if changed:
            with self.db.write() as session:
                job_updates.set_pending_reasons(session, changed)
        if outcome.placements:
            self.supervisor.launch(
                [
                    (
                        placement.job_id,
                        [d for d in self.devices if d.name in placement.devices],
                        placement.lane,
                    )
                    for placement in outcome.placements
                ]
            )
        self._unplaced = (  # for the preemptions after it (the launches hold their room)
            [r for r in requests if r.job_id in outcome.reasons],
            outcome.reasons,
            {r.job_id: by_id[r.job_id].priority for r in requests},
            loads,
        )
        self.rotator.note_waiting(self._unplaced[0], outcome.reasons, by_id)  # (next pass)
        return len(outcome.placements)

    def _derived(self, pending: list[Row]) -> dict[Row, tuple[policies.JobView, admission.Request]]:
        """Each pending row's view for the policy and request for admission: made again only
        for a row that changed since the last pass (a pass reads every pending job, and most
        are as they were)."""
        previous, self._per_row = self._per_row, {}
        for job in pending:
            made = previous.get(job)
            self._per_row[job] = made if made is not None else self._made(job)
        return self._per_row

    def _made(self, job: Row) -> tuple[policies.JobView, admission.Request]:
        return (
            policies.JobView(
                id=job.id,
                user=job.user,
                submit_time=job.submit_time,
                priority=job.priority,
                steps_total=job.steps_total,
                deadline=job.deadline,
            ),
            admission.Request(
                job.id,
                job.gpus,
                # A plain process (a shell script) counts as what it holds: it needs no room a
                # probe would (a -G 0 job starts whatever the device's probes are doing).
                footprint(job)
                if job.mem is not None or job.interpreter is None
                else admission.Footprint(self.probe_guess),
                admission.has_devices_alone(
                    job.exclusive,
                    job.interpreter is not None,
                    job.gpus,
                    any(d.whole for d in self.devices),
                ),
                time_limit=job.time_limit,
                only=self._allowed(job.gpu_type, job.nodelist),
                host_mem=job.host_mem or 0,
                cpus=job.cpus or 0,
                user=job.user,
            ),
        )

    def _allowed(self, gpu_type: str | None, nodelist: str | None) -> frozenset[str] | None:
        """The devices a job may use, by the GPU type and the devices it named (None: any)."""
        if gpu_type is None and nodelist is None:
            return None
        allowed = self.devices if gpu_type is None else devices_mod.of_type(self.devices, gpu_type)
        names = frozenset(d.name for d in allowed)
        return names & frozenset(nodelist.split(",")) if nodelist else names

    def _node_room(self, running: Sequence[Row]) -> admission.NodeRoom:
        """The node's RAM and CPUs less what the RUNNING jobs reserved (as the queue says:
        a job whose host has not been heard from yet holds its share too), and less what
        checkpoints of jobs without a reservation hold."""
        checkpoints = sum(job.checkpoint_bytes for job in self.supervisor.running.values())
        return admission.NodeRoom(
            memory=self.supervisor.node_memory
            - sum(job.host_mem or 0 for job in running)
            - checkpoints,
            cpus=self.node_cpus - sum(job.cpus or 0 for job in running),
        )

    def loads(self, running: Sequence[Row] = (), every: bool = False) -> list[admission.DeviceLoad]:
        """Each available device as admission sees it: lanes, memory (less what processes
        outside gq hold), residents, free time, utilization, the guard, topology; and, where
        the policy makes a newcomer wait behind the residents (fifo), when each lane's end,
        from the ``running`` jobs' rows (their progress as last flushed). ``every``: the
        devices that take no job now too, held with the reason (a forecast's node)."""
        loads = {}
        lanes = self.capacity.lanes
        for device in self.devices:
            host = self.supervisor.hosts.get(device.name)
            unavailable = (
                "its execution host is restarting"
                if host is None or host.draining
                else self.drained.get(device.name)
            )
            if unavailable is not None and not every:
                continue  # its host is restarting, or being replaced; or an operator drains it
            reading = self.monitor.readings.get(device.name)
            outside = reading.external_memory // lanes if reading is not None else 0
            loads[device.name] = admission.DeviceLoad(
                name=device.name,
                gpu=device.whole,
                index=device.index or 0,
                lanes=[
                    admission.LaneLoad(
                        self.lane_memory(device) - outside, overhead=context_memory(device)
                    )
                    for _ in range(lanes)
                ],
                max_resident=self.capacity.max_resident,
                utilization=(reading.utilization or 0.0) if reading is not None else 0.0,
                held=unavailable or self.monitor.guard.held.get(device.name),
                links=device.links,
            )
        for job in self.supervisor.running.values():
            ends = job.started + job.time_limit if job.time_limit is not None else math.inf
            for device in job.devices:
                load = loads.get(device.name)
                if load is None:
                    continue
                load.free_at = max(load.free_at, ends)
                if job.away:
                    continue  # suspended, its memory in host memory: the device is free of it
                load.residents += 1
                load.by_user[job.user] = load.by_user.get(job.user, 0) + 1
                load.exclusive |= job.exclusive or len(job.devices) > 1
                lane = load.lanes[job.lane]
                # A job being probed has its lane to itself until its figures are known.
                lane.footprints.append(
                    admission.Footprint(lane.capacity) if job.probing else job.footprint_now()
                )
        if self.policy.waits_behind:
            lane_waits.add_time_left(loads, running, self.supervisor.running)
        return list(loads.values())

    def snapshot(
        self, past: Callable[[str, str], work_estimates.Past | None], typical: float | None
    ) -> forecast.Snapshot:
        """The node as the last pass saw it, for a forecast: devices as admission sees them
        (those that take no job held), running jobs with their progress and how hosts say
        they share them, pending ones not held as admission took them; ``past``: a user's
        recent jobs of a name, ``typical``: the node's usual run time. A job whose dependency
        a forecast cannot follow (on an array, afternotok, one of several) is left out."""
        seen = self.last_pass or forecast_jobs.Pass((), (), {}, {})
        now = time.time()
        running = forecast_jobs.running_jobs(
            seen.running, self.supervisor.running, past, typical, now
        )
        self.running_paces = forecast.running_pace(running)
        pending = (
            self.forecast_pending(seen.pending, seen.needs, seen.runs, past, typical)
            if queue_settings.NODE not in self.drained
            else []
        )
        return forecast.Snapshot(
            now,
            self.policy_setting[0]
            if self.policy_setting is not None
            else (
                queue_settings.DEFAULTS[queue_settings.POLICY],
                queue_settings.DEFAULTS[queue_settings.FILL],
                queue_settings.DEFAULTS[queue_settings.QUANTUM],
            ),
            tuple(self.loads(seen.running, every=True)),
            self.capacity.lanes,
            self.capacity.max_resident,
            tuple(running),
            tuple(pending),
            self.move_margin,
            forecast_jobs.sharing(self.supervisor.settings.packing, self.supervisor.packing),
        )

    def forecast_pending(
        self,
        rows: Sequence[Row],
        needs: dict[int, dependencies.Dependency],
        runs: dict[int, list[tuple[JobState, bool]]],
        past: Callable[[str, str], work_estimates.Past | None],
        typical: float | None,
    ) -> list[forecast.Pending]:
        """Pending jobs as a forecast takes them: the view and request admission takes (one
        made for a pass already, else made now), what each will do (from the owner's ended
        jobs of its name, else the pace of one running at the last snapshot), what it waits
        for."""
        return forecast_jobs.pending_jobs(
            rows,
            needs,
            runs,
            lambda row: self._per_row.get(row) or self._made(row),
            past,
            self.running_paces,
            typical,
        )


def _listed(job_ids: list[int], most: int = 10) -> str:
    shown = ", ".join(map(str, job_ids[:most]))
    return shown + (f" and {len(job_ids) - most} more" if len(job_ids) > most else "")
