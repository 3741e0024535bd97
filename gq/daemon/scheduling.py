"""The scheduling pass: which pending jobs start now, on which devices, and why the others
wait (squeue's reasons); and the requests users made of running jobs (stop, new priority
or time limit), passed on to their hosts.

Admission itself is pure (:mod:`gq.daemon.admission`, shared with the simulator); this
module reads the queue, builds admission's view of the node (:meth:`Scheduler.loads`) and
acts on the outcome through the supervisor.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from gq import defaults, policies
from gq.daemon import admission, memory
from gq.daemon import devices as devices_mod
from gq.daemon.devices import Device, context_memory
from gq.daemon.monitoring import Monitor
from gq.daemon.supervision import Supervisor, footprint
from gq.exec import protocol as wire
from gq.exec.protocol import StopWhy
from gq.messages import MemoryBasis
from gq.policies.base import time_left
from gq.queue import dependencies, queries, transitions
from gq.queue import settings as queue_settings
from gq.queue.engine import Database
from gq.queue.queries import SchedulingRow as Row
from gq.queue.states import JobState
from gq.sim import forecast
from gq.units import format_duration

log = logging.getLogger("gq.daemon")
# squeue's reasons for a pending job
DEPENDENCY = "Dependency"
ARRAY_LIMIT = "JobArrayTaskLimit"
NEVER_SATISFIED = "DependencyNeverSatisfied"
BEGIN_TIME = "BeginTime"
DRAINING = "ReqNodeNotAvail"
PENDING_DRIFT = "pending jobs' rows read again differ from those kept between passes"


@dataclass(frozen=True)
class Pass:
    """What the last scheduling pass read: the forecast's starting point."""

    pending: Sequence[Row]  # not held
    running: Sequence[Row]
    needs: dict[int, dependencies.Dependency]
    runs: dict[int, list[tuple[JobState, bool]]]


@dataclass(frozen=True)
class Capacity:
    """What the daemon was told each device offers."""

    lanes: int
    max_resident: int
    probe: int = defaults.PROBE_MEMORY  # free memory a job that declares none needs


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
        self.policy_setting: tuple[str, str, str] | None = None  # name, fill, quantum
        self.policy = policies.make("fifo")
        self._dependencies: dict[str, dependencies.Dependency] = {}
        self.drained: dict[str, str] = {}  # device (or the node) -> the operator's reason
        self.move_margin = move_margin  # seconds sooner elsewhere that move an unstarted job
        self.node_memory = psutil.virtual_memory().total
        self.node_cpus = os.cpu_count() or 1
        self._per_row: dict[Row, tuple[policies.JobView, admission.Request]] = {}
        self._pending = queries.PendingRows(defaults.PENDING_REREAD_PERIOD)
        # What a job that declares no memory needs free to start: the probe's first guess,
        # at most a lane of the smallest device (else it could never start there).
        self.probe_guess = min([capacity.probe, *map(self.lane_memory, devices)])
        self.last_pass: Pass | None = None
        # (user, name) -> the pace of their running job of that name, at the last snapshot
        self.running_paces: dict[tuple[str, str], forecast.Past] = {}

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
            late_held = queries.held_with_deadline(session)
            running = queries.for_scheduling(session, JobState.RUNNING)
            needs: dict[int, dependencies.Dependency] = {}
            for job in pending:
                if job.dependency:
                    needs[job.id] = self._parsed(job.dependency)
            referenced = set().union(*(need.job_ids for need in needs.values()))
            runs = {
                job_id: [(JobState(state), started) for state, started in states]
                for job_id, states in queries.run_states(session, referenced).items()
            }
        self.apply_policy(config)
        self._follow_running(running)
        self.drained = dict(config[queue_settings.DRAINED])
        self.last_pass = Pass(pending, running, needs, runs)
        eligible = self._eligible(pending, late_held, needs, runs)
        placed = 0
        if eligible and queue_settings.NODE in self.drained:
            self._hold_for_drain(eligible, self.drained[queue_settings.NODE])
        elif eligible:
            array_running: dict[int, int] = {}
            for row in running:
                if row.array_job_id is not None:
                    array_running[row.array_job_id] = array_running.get(row.array_job_id, 0) + 1
            placed = self._admit(eligible, array_running, self._node_room(running), running)
        # Not in a pass that launched jobs: their lanes' waits are not in the rows read.
        if self.policy.waits_behind and len(self.devices) > 1 and not placed:
            self._move_unstarted(running)

    def _move_unstarted(self, rows: Sequence[Row]) -> None:
        """A resident that has run no iteration, waiting behind jobs that end later than
        another device would start it, goes back to the queue (its process ended, the run
        not counted), and admission places it there: one a pass."""
        now = time.time()
        waiting = []
        lane_rows: dict[tuple[str, int], list[Row]] = {}
        for row in rows:
            job = self.supervisor.running.get(row.id)
            if job is not None and len(job.devices) == 1:
                lane_rows.setdefault((job.devices[0].name, job.lane), []).append(row)
        for (device, _lane), residents in lane_rows.items():
            for row in residents:
                job = self.supervisor.running[row.id]
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
                    self._time_left(other, now)
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
                        only=self._allowed(row.gpu_type, row.nodelist),
                    )
                )
        chosen = admission.move(waiting, self.loads(rows), self.move_margin)
        if chosen is not None:
            # Not marked as being killed: its host refuses if it was granted an iteration
            # meanwhile, and then its run goes on as if nothing had been asked.
            log.info("job %d: moving it to a device that starts it sooner", chosen)
            self.supervisor.ask_to_move(self.supervisor.running[chosen])

    def _hold_for_drain(self, eligible: list[Row], why: str) -> None:
        """The node is drained: every job that could start waits, saying so."""
        reason = _draining(why)
        changed = {job.id: reason for job in eligible if job.reason != reason}
        if changed:
            with self.db.write() as session:
                transitions.set_pending_reasons(session, changed)

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
        if wanted == self.policy_setting:
            return
        self.policy_setting = wanted
        self.policy = policies.make(*wanted)
        self.supervisor.set_policy(wire.SetPolicy(*wanted))
        log.info("policy is now %s (fill %s, quantum %s)", *wanted)

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
            if bool(row.suspended) != job.suspended and job.kill_why is None:
                self.supervisor.suspend(job, bool(row.suspended))

    def _eligible(
        self,
        pending: Sequence[Row],
        late_held: Sequence[Row],
        needs: dict[int, dependencies.Dependency],
        runs: dict[int, list[tuple[JobState, bool]]],
    ) -> list[Row]:
        """Pending jobs that may start now; the others get squeue's reason. Held jobs are
        not read here (holding set their reason) unless their deadline may pass."""
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
            with self.db.write() as session:
                transitions.cancel_pending_many(session, never, NEVER_SATISFIED, now)
                for job in late:
                    transitions.cancel_pending(
                        session, job.id, _too_late(job, now), state=JobState.DEADLINE
                    )
                transitions.set_pending_reasons(session, reasons)
        if never or late:
            self.wake()  # their dependants may now be unsatisfiable too
        return eligible

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
        for view in self.policy.order([view for view, _ in derived.values()]):
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
        reasons = dict(outcome.reasons)  # Resources for the first blocked job, as squeue
        for request in requests:  # one that ran out of memory says how much it waits for
            if (
                reasons.get(request.job_id) == admission.RESOURCES
                and by_id[request.job_id].mem_basis == MemoryBasis.RAISED.value
            ):
                reasons[request.job_id] = memory.shortage_reason(
                    request.footprint.persistent, _most_free(loads, request)
                )
        if self.drained:  # a job that may run only where an operator drains says so
            every = frozenset(d.name for d in self.devices)
            for request in requests:
                allowed = request.only if request.only is not None else every
                if request.job_id in reasons and allowed and allowed <= set(self.drained):
                    why = "; ".join(sorted(set(self.drained[name] for name in allowed)))
                    reasons[request.job_id] = _draining(why)
        reasons.update({job_id: ARRAY_LIMIT for job_id in throttled})
        changed = {
            job_id: reason for job_id, reason in reasons.items() if by_id[job_id].reason != reason
        }
        if changed:
            with self.db.write() as session:
                transitions.set_pending_reasons(session, changed)
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
                footprint(job) if job.mem is not None else admission.Footprint(self.probe_guess),
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
        a job whose host has not been heard from yet holds its share too)."""
        return admission.NodeRoom(
            memory=self.node_memory - sum(job.host_mem or 0 for job in running),
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
                load.residents += 1
                load.exclusive |= job.exclusive or len(job.devices) > 1
                lane = load.lanes[job.lane]
                # A job being probed has its lane to itself until its figures are known.
                lane.footprints.append(
                    admission.Footprint(lane.capacity) if job.probing else job.footprint_now()
                )
        if self.policy.waits_behind:
            self._add_time_left(loads, running)
        return list(loads.values())

    def _add_time_left(self, loads: dict[str, admission.DeviceLoad], rows: Sequence[Row]) -> None:
        now = time.time()
        for row in rows:
            job = self.supervisor.running.get(row.id)
            if job is None:
                continue
            left = self._time_left(row, now)
            for device in job.devices:
                if (load := loads.get(device.name)) is not None:
                    load.lanes[job.lane].starts_in += left

    def _time_left(self, row: Row, now: float) -> float:
        """How long a running job will still hold its lane, as far as its row tells."""
        job = self.supervisor.running[row.id]
        return time_left(_view(row), now - job.started, job.time_limit)

    def snapshot(
        self, past: Callable[[str, str], forecast.Past | None], typical: float | None
    ) -> forecast.Snapshot:
        """The node as the last pass saw it, for a forecast: the devices as admission sees
        them (those that take no job now held), the running jobs with their progress, and
        the pending ones that are not held with their views and requests as admission took
        them; ``past`` gives a user's recent jobs of a name, ``typical`` the node's jobs'
        usual run time. A job whose dependency the forecast cannot follow (on an array,
        afternotok, one of several) is left out."""
        seen = self.last_pass or Pass((), (), {}, {})
        now = time.time()
        running = []
        for row in seen.running:
            job = self.supervisor.running.get(row.id)
            if job is None:
                continue  # its host has not reported it yet
            latest = job.latest  # its host's last report: fresher than its row
            view = _view(row) if latest is None else _view(row, latest)
            footprint_now = job.footprint_now()
            running.append(
                forecast.Running(
                    view,
                    forecast.work(
                        view, job.time_limit, past(row.user, row.name), now - job.started, typical
                    ),
                    tuple(d.name for d in job.devices),
                    job.lane,
                    job.started,
                    footprint_now.persistent + footprint_now.ephemeral,
                    job.time_limit,
                    row.name,
                    startup=None if latest is None else latest.startup,
                    measured_at=None if latest is None else job.latest_at,
                )
            )
        self.running_paces = forecast.running_pace(running)
        pending = (
            self.forecast_pending(seen.pending, seen.needs, seen.runs, past, typical)
            if queue_settings.NODE not in self.drained
            else []
        )
        return forecast.Snapshot(
            now,
            self.policy_setting
            or (
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
        )

    def forecast_pending(
        self,
        rows: Sequence[Row],
        needs: dict[int, dependencies.Dependency],
        runs: dict[int, list[tuple[JobState, bool]]],
        past: Callable[[str, str], forecast.Past | None],
        typical: float | None,
    ) -> list[forecast.Pending]:
        """Pending jobs as a forecast takes them: the view and request admission takes (one
        made for a pass already, else made now), what each will do (from the owner's ended
        jobs of its name, else the pace of one running at the last snapshot), what it waits
        for."""
        pending = []
        for row in rows:
            after = _waits_for(needs.get(row.id), runs)
            if after is None:
                continue
            view, request = self._per_row.get(row) or self._made(row)
            previous = past(row.user, row.name) or self.running_paces.get((row.user, row.name))
            pending.append(
                forecast.Pending(
                    view,
                    request,
                    forecast.work(view, row.time_limit, previous, typical=typical),
                    row.begin_time,
                    after,
                )
            )
        return pending


def _waits_for(
    need: dependencies.Dependency | None, runs: dict[int, list[tuple[JobState, bool]]]
) -> tuple[int, ...] | None:
    """The jobs that must end before a job with this dependency starts (``after``: start; a
    forecast takes its end, the later); None where a forecast cannot say (a dependency on an
    array's tasks, one that needs a failure, or any one of several)."""
    if need is None or dependencies.evaluate(need, runs) is dependencies.Outcome.SATISFIED:
        return ()
    if need.any_of or any(clause.kind == "afternotok" for clause in need.clauses):
        return None
    waits = []
    for clause in need.clauses:
        for job_id in clause.job_ids:
            states = runs.get(job_id, [])
            if len(states) != 1:
                return None
            state, started = states[0]
            if not state.terminal and not (clause.kind == "after" and started):
                waits.append(job_id)
    return tuple(waits)


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


def _view(row: Row, progress: transitions.Progress | None = None) -> policies.JobView:
    """A running job's progress as policies see it: its row's, or ``progress`` (its host's
    last report, not yet flushed to the row)."""
    shown = row if progress is None else progress
    total = shown.steps_total if shown.steps_total is not None else row.steps_total
    return policies.JobView(
        id=row.id,
        user=row.user,
        submit_time=row.submit_time,
        priority=row.priority,
        steps_done=shown.steps_done,
        steps_total=total,
        attained=shown.attained,
        mean_iteration=shown.mean_iteration,
        mean_gap=shown.mean_gap,
    )


def _listed(job_ids: list[int], most: int = 10) -> str:
    shown = ", ".join(map(str, job_ids[:most]))
    return shown + (f" and {len(job_ids) - most} more" if len(job_ids) > most else "")


def _draining(why: str) -> str:
    return f"{DRAINING}: draining ({why})"


def _too_late(job: Row, now: float) -> str:
    if now >= (job.deadline or 0):
        return "deadline passed before it could start"
    return (
        f"cannot end before its deadline: its time limit {format_duration(job.time_limit)} "
        "ends after it"
    )
