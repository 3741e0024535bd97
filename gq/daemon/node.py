"""The node daemon: answers clients, admits pending jobs onto devices, supervises one
execution host per device, records what happens, enforces time limits, and recovers after a
crash. It is the only process that opens the queue."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import time
from dataclasses import dataclass, replace
from typing import IO

from gq import defaults, policies
from gq.daemon import admission, handlers, recovery
from gq.daemon.access import Caller, Rules
from gq.daemon.devices import Device, discover
from gq.daemon.hosts import HostHandle
from gq.daemon.launch import launch_spec
from gq.daemon.server import Connection, Server
from gq.home import Home
from gq.queue import dependencies, queries, transitions
from gq.queue import settings as queue_settings
from gq.queue.engine import Database
from gq.queue.models import Job
from gq.queue.states import JobState
from gq.units import format_duration
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.daemon")
# squeue's reasons for a pending job
RESOURCES = "Resources"
PRIORITY = "Priority"
DEPENDENCY = "Dependency"
HELD = "JobHeldUser"
ARRAY_LIMIT = "JobArrayTaskLimit"
NEVER_SATISFIED = "DependencyNeverSatisfied"


@dataclass(frozen=True)
class DaemonOptions:
    lanes: int = defaults.LANES
    max_resident: int = defaults.MAX_RESIDENT
    kill_grace: float = defaults.KILL_WAIT
    cpu_memory: int | None = None  # bytes the cpu device offers jobs [all of RAM]
    operator_group: str | None = None  # its members may act on every job and the node
    priority_cap: int = defaults.PRIORITY_CAP  # system mode: highest priority for users


@dataclass
class Running:
    job_id: int
    devices: list[Device]
    lane: int
    host: str
    started: float  # monotonic
    time_limit: int | None
    requeue: bool
    footprint: admission.Footprint
    exclusive: bool
    priority: int
    measured: admission.Footprint | None = None  # from the job's own memory reports
    kill_why: str | None = None  # cancel | requeue | timeout | shutdown


class Daemon:
    def __init__(self, home: Home, options: DaemonOptions):
        self.home = home
        self.options = options
        self.db = Database(home)
        self.devices, self.device_note = discover()
        if options.cpu_memory is not None:
            self.devices = [replace(d, memory_total=options.cpu_memory) if d.kind == "cpu" else d
                            for d in self.devices]
        self.hosts: dict[str, HostHandle] = {}
        self.host_down_since: dict[str, float] = {}
        self.running: dict[int, Running] = {}
        self.progress: dict[int, transitions.Progress] = {}
        self.selector = selectors.DefaultSelector()
        self.policy_setting: tuple[str, str] | None = None
        self.stopping = False
        self.stop_deadline = 0.0
        self.wake = True
        self.started_at = time.time()
        self.rules = Rules(daemon_uid=os.geteuid(), operator_group=options.operator_group,
                           priority_cap=options.priority_cap if home.system else None)
        self.server: Server | None = None

    # ----- life cycle -----------------------------------------------------------------
    def run(self, pidfile: IO[str]) -> None:
        """Serve until stopped; ``pidfile`` is the lock that makes this the home's daemon."""
        try:
            recovered = recovery.recover(self.db)
            if recovered:
                log.warning("recovered %d job(s) left running: %s", len(recovered), recovered)
            wake_read = signal_socket((signal.SIGTERM, signal.SIGINT, signal.SIGCHLD))
            self.selector.register(wake_read, selectors.EVENT_READ, "signal")
            for device in self.devices:
                self._start_host(device)
            self.server = Server(self.home, self.selector, self._dispatch, self._identify)
            log.info("daemon %d up (%s mode) on %s", os.getpid(), self.home.mode,
                     ", ".join(d.name for d in self.devices))
            self._loop(wake_read)
        finally:
            if self.server is not None:
                # A system socket stays: clients then wait for a restarting daemon instead
                # of starting personal ones.
                self.server.close(unlink=not self.home.system)
            pidfile.close()
            self.db.close()

    def _dispatch(self, caller: Caller, line: bytes) -> tuple[bytes, list[int]]:
        return handlers.dispatch(self, caller, line)

    def _identify(self, pid: int, uid: int, gid: int) -> Caller:
        return self.rules.identify(uid, gid)

    def lane_memory(self, device: Device) -> int:
        """What one lane of the device offers: its memory split evenly between lanes."""
        return device.memory_total // max(1, self.options.lanes)

    def stale(self) -> str | None:
        """Why the queue's progress figures may be out of date, if they may."""
        down = sorted(set(self.host_down_since))
        if down:
            return f"the execution host of {', '.join(down)} is restarting"
        return None

    def _loop(self, wake_read: socket.socket) -> None:
        assert self.server is not None
        last_scan = last_flush = 0.0
        while True:
            for key, mask in self.selector.select(self._timeout(last_scan)):
                if isinstance(key.data, Connection):
                    self.server.service(key.data, mask)
                elif key.data is self.server:
                    self.server.accept()
                elif key.data == "signal":
                    self._on_signals(wake_read)
                else:
                    self._from_host(key.data)
            now = time.monotonic()
            self.server.expire(now)
            if self.stopping:
                if not self.running or now > self.stop_deadline:
                    break
                continue
            self._restart_dead_hosts(now)
            self._enforce_time_limits(now)
            if self.wake or now - last_scan >= defaults.POLL_PERIOD:
                self.wake = False
                last_scan = now
                self._scan()
            if now - last_flush >= defaults.FLUSH_PERIOD:
                last_flush = now
                self._flush_progress()
        self._flush_progress()
        for host in self.hosts.values():
            host.stop(timeout=2.0)

    def _timeout(self, last_scan: float) -> float:
        """Until the next thing the loop must do unprompted; never 0 while nothing is due."""
        now = time.monotonic()
        if self.stopping:  # only exits (events) and the stop deadline matter now
            deadlines = [self.stop_deadline]
        else:
            deadlines = [last_scan + defaults.POLL_PERIOD]
            deadlines += [r.started + r.time_limit for r in self.running.values()
                          if r.time_limit is not None and r.kill_why is None]
        assert self.server is not None
        if (connection_deadline := self.server.next_deadline()) is not None:
            deadlines.append(connection_deadline)
        return max(0.0, min(min(deadlines) - now, defaults.FLUSH_PERIOD))

    def _on_signals(self, wake_read: socket.socket) -> None:
        signums = received(wake_read)
        if (signal.SIGTERM in signums or signal.SIGINT in signums) and not self.stopping:
            self.begin_stop(keep_jobs=False)

    def begin_stop(self, keep_jobs: bool) -> None:
        log.info("stopping: ending %d running job(s)", len(self.running))
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.options.kill_grace + defaults.STOP_GRACE
        for job in self.running.values():
            job.kill_why = "shutdown"
            if job.host in self.hosts:
                self.hosts[job.host].send({"op": "kill", "job": job.job_id})

    # ----- hosts ----------------------------------------------------------------------
    def _start_host(self, device: Device) -> None:
        host = HostHandle.spawn(device, self.options.lanes, self.options.kill_grace)
        self.hosts[device.name] = host
        self.selector.register(host.channel.sock, selectors.EVENT_READ, device.name)
        if self.policy_setting is not None:
            name, fill = self.policy_setting
            host.send({"op": "policy", "name": name, "fill": fill})

    def _restart_dead_hosts(self, now: float) -> None:
        for name, since in list(self.host_down_since.items()):
            if now - since >= defaults.HOST_RESTART_DELAY:
                del self.host_down_since[name]
                device = next(d for d in self.devices if d.name == name)
                log.warning("restarting the execution host of %s", name)
                self._start_host(device)
                self.wake = True

    def _host_died(self, name: str) -> None:
        host = self.hosts.pop(name)
        self.selector.unregister(host.channel.sock)
        host.channel.close()
        host.process.kill()
        host.process.wait()
        log.error("execution host of %s died (exit %s)", name, host.process.returncode)
        for job in [r for r in self.running.values() if r.host == name]:
            reason = f"execution host of {name} died"
            self._end(job, None, JobState.FAILED, reason, requeue=job.requeue)
        self.host_down_since[name] = time.monotonic()

    def _from_host(self, name: str) -> None:
        host = self.hosts[name]
        for message in host.channel.receive():
            op = message["op"]
            if op == "started":
                with self.db.write() as session:
                    transitions.record_pid(session, int(message["job"]), int(message["pid"]))
            elif op == "launch_failed":
                job = self.running.get(int(message["job"]))
                if job is not None:
                    self._end(job, None, JobState.FAILED, message["reason"])
            elif op == "exited":
                self._on_exit(message)
            elif op == "progress":
                for item in message["jobs"]:
                    progress = self.progress[int(item["job"])] = _progress(item)
                    job = self.running.get(int(item["job"]))
                    if job is not None and progress.mem_persistent is not None:
                        job.measured = admission.Footprint(
                            progress.mem_persistent,
                            max(0, (progress.mem_peak or 0) - progress.mem_persistent))
            else:
                log.warning("unknown op from host %s: %r", name, op)
        if host.channel.closed and name in self.hosts:
            self._host_died(name)

    # ----- job ends -------------------------------------------------------------------
    def _on_exit(self, message: dict) -> None:
        job = self.running.get(int(message["job"]))
        if job is None:
            return
        self.progress[job.job_id] = _progress(message)
        code, signum = message.get("code"), message.get("signal")
        exit_code = code if signum is None else 128 + int(signum)
        if job.kill_why == "cancel":
            self._end(job, exit_code, JobState.CANCELLED, "cancelled by user")
        elif job.kill_why == "timeout":
            limit = format_duration(job.time_limit)
            self._end(job, exit_code, JobState.TIMEOUT, f"time limit {limit} reached")
        elif job.kill_why == "requeue":
            self._end(job, exit_code, JobState.PENDING, "requeued by user", requeue=True)
        elif job.kill_why == "shutdown":
            self._end(job, exit_code, JobState.FAILED, "daemon stopped",
                      requeue=job.requeue)
        elif signum is not None:
            name = signal.Signals(int(signum)).name if int(signum) in _SIGNALS else str(signum)
            self._end(job, exit_code, JobState.FAILED, f"killed by signal {name}")
        elif code == 0:
            self._end(job, 0, JobState.COMPLETED, None)
        else:
            self._end(job, code, JobState.FAILED, f"exit code {code}")

    def _end(self, job: Running, exit_code: int | None, state: JobState, reason: str | None,
             requeue: bool = False) -> None:
        self.running.pop(job.job_id, None)
        progress = self.progress.pop(job.job_id, None)
        with self.db.write() as session:
            if progress is not None:
                transitions.record_progress(session, job.job_id, progress)
            if requeue:
                transitions.requeue(session, job.job_id,
                                    reason if state is JobState.PENDING else f"{reason}; requeued")
            else:
                transitions.finish(session, job.job_id, state, exit_code, reason)
        log.info("job %d %s%s", job.job_id, "requeued" if requeue else state.value,
                 f" ({reason})" if reason else "")
        self.wake = True

    def _enforce_time_limits(self, now: float) -> None:
        for job in self.running.values():
            if job.kill_why is None and job.time_limit is not None \
                    and now - job.started >= job.time_limit:
                job.kill_why = "timeout"
                self.hosts[job.host].send({"op": "kill", "job": job.job_id})

    def _flush_progress(self) -> None:
        updates = {k: v for k, v in self.progress.items() if k in self.running}
        self.progress.clear()
        if not updates:
            return
        with self.db.write() as session:
            for job_id, progress in updates.items():
                transitions.record_progress(session, job_id, progress)

    # ----- admission ------------------------------------------------------------------
    def _scan(self) -> None:
        with self.db.read() as session:
            config = queue_settings.get_all(session)
            pending = list(queries.jobs(session, states=[JobState.PENDING]))
            running = list(queries.running(session))
            referenced = set()
            for job in pending:
                if job.dependency:
                    referenced |= dependencies.parse(job.dependency).job_ids
            runs = {job_id: [(JobState(j.state), j.start_time is not None) for j in jobs]
                    for job_id, jobs in queries.runs_of(session, referenced).items()}
        self._apply_policy(config)
        self._follow_running(running)
        if pending:
            array_running: dict[int, int] = {}
            for row in running:
                if row.array_job_id is not None:
                    array_running[row.array_job_id] = array_running.get(row.array_job_id, 0) + 1
            self._admit(self._eligible(pending, runs), array_running)

    def _follow_running(self, rows: list[Job]) -> None:
        """Stop requests and updates that users made to running jobs."""
        for row in rows:
            job = self.running.get(row.id)
            if job is None:
                continue
            if row.stop_request and job.kill_why is None:
                job.kill_why = row.stop_request
                self.hosts[job.host].send({"op": "kill", "job": row.id})
            job.time_limit = row.time_limit
            if row.priority != job.priority:
                job.priority = row.priority
                self.hosts[job.host].send({"op": "update", "job": row.id,
                                           "priority": row.priority})

    def _eligible(self, pending: list[Job],
                  runs: dict[int, list[tuple[JobState, bool]]]) -> list[Job]:
        """Pending jobs that may start now; the others get squeue's reason."""
        eligible, reasons, never = [], {}, []
        for job in pending:
            outcome = (dependencies.evaluate(dependencies.parse(job.dependency), runs)
                       if job.dependency else dependencies.Outcome.SATISFIED)
            if job.held:
                reasons[job.id] = HELD
            elif outcome is dependencies.Outcome.NEVER:
                never.append(job.id)
            elif outcome is dependencies.Outcome.WAITING:
                reasons[job.id] = DEPENDENCY
            else:
                eligible.append(job)
        with self.db.write() as session:
            for job_id in never:
                transitions.cancel_pending(session, job_id, NEVER_SATISFIED)
            for job in pending:
                if job.id in reasons and job.reason != reasons[job.id]:
                    transitions.set_pending_reason(session, job.id, reasons[job.id])
        if never:
            self.wake = True  # their dependants may now be unsatisfiable too
        return eligible

    def _apply_policy(self, config: dict) -> None:
        wanted = (config[queue_settings.POLICY], config[queue_settings.FILL])
        if wanted == self.policy_setting:
            return
        self.policy_setting = wanted
        self.policy = policies.make(*wanted)
        for host in self.hosts.values():
            host.send({"op": "policy", "name": wanted[0], "fill": wanted[1]})
        log.info("policy is now %s (fill %s)", *wanted)

    def _admit(self, pending: list[Job], array_running: dict[int, int]) -> None:
        by_id = {job.id: job for job in pending}
        views = [policies.JobView(id=j.id, user=j.user, submit_time=j.submit_time,
                                  priority=j.priority, steps_total=j.steps_total)
                 for j in pending]
        requests, throttled = [], []
        admitted = dict(array_running)
        for view in self.policy.order(views):
            job = by_id[view.id]
            if job.array_job_id is not None and job.array_max_running is not None:
                if admitted.get(job.array_job_id, 0) >= job.array_max_running:
                    throttled.append(job.id)
                    continue
                admitted[job.array_job_id] = admitted.get(job.array_job_id, 0) + 1
            requests.append(admission.Request(job.id, job.gpus, _footprint(job), job.exclusive))
        placements = admission.place(requests, self._loads())
        placed = {p.job_id for p in placements}
        blocked = [r.job_id for r in requests if r.job_id not in placed]
        # As squeue says it: the first blocked job waits for Resources, the rest behind it.
        reasons = {job_id: RESOURCES if i == 0 else PRIORITY for i, job_id in enumerate(blocked)}
        reasons.update({job_id: ARRAY_LIMIT for job_id in throttled})
        changed = {job_id: reason for job_id, reason in reasons.items()
                   if by_id[job_id].reason != reason}
        if changed:
            with self.db.write() as session:
                for job_id, reason in changed.items():
                    transitions.set_pending_reason(session, job_id, reason)
        for placement in placements:
            self._launch(by_id[placement.job_id], placement)

    def _loads(self) -> list[admission.DeviceLoad]:
        loads = {}
        for device in self.devices:
            if device.name not in self.hosts:
                continue  # its host is restarting
            lanes = max(1, self.options.lanes)
            loads[device.name] = admission.DeviceLoad(
                name=device.name, gpu=device.kind == "cuda",
                lanes=[admission.LaneLoad(self.lane_memory(device)) for _ in range(lanes)],
                max_resident=self.options.max_resident)
        for job in self.running.values():
            for device in job.devices:
                load = loads.get(device.name)
                if load is None:
                    continue
                load.residents += 1
                load.exclusive |= job.exclusive or len(job.devices) > 1
                load.lanes[job.lane].footprints.append(self._footprint_now(job))
        return list(loads.values())

    @staticmethod
    def _footprint_now(job: Running) -> admission.Footprint:
        """What the job asked for (--mem), or what it was measured to use, if more."""
        if job.measured is None:
            return job.footprint
        return max(job.footprint, job.measured, key=lambda f: f.persistent + f.ephemeral)

    def _launch(self, job: Job, placement: admission.Placement) -> None:
        devices = [d for d in self.devices if d.name in placement.devices]
        device_names = ",".join(placement.devices)
        with self.db.write() as session:
            if not transitions.start(session, job.id, device_names, placement.lane):
                return  # cancelled meanwhile
        running = Running(job_id=job.id, devices=devices, lane=placement.lane,
                          host=placement.devices[0], started=time.monotonic(),
                          time_limit=job.time_limit, requeue=job.requeue,
                          footprint=_footprint(job), exclusive=job.exclusive,
                          priority=job.priority)
        self.running[job.id] = running
        try:
            spec = launch_spec(job, devices, placement.lane, self.home.system)
        except OSError as exc:
            self._end(running, None, JobState.FAILED, f"cannot read job script: {exc}")
            return
        if not self.hosts[running.host].send({"op": "launch", "job": spec}):
            self._host_died(running.host)


_SIGNALS = {s.value for s in signal.Signals}


def _footprint(job: Job) -> admission.Footprint:
    return admission.Footprint(persistent=job.mem or 0, ephemeral=0)


def _progress(item: dict) -> transitions.Progress:
    return transitions.Progress(
        steps_done=int(item.get("steps_done", 0)), attained=float(item.get("attained", 0.0)),
        mean_iteration=item.get("mean_iteration"), mem_persistent=item.get("mem_persistent"),
        mem_peak=item.get("mem_peak"), holds_lane=bool(item.get("holds_lane", False)),
        steps_total=item.get("steps_total"))
