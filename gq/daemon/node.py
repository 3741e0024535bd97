"""The node daemon: answers clients, admits pending jobs onto devices, supervises one
execution host per device and records what happens. It is the only process that opens the
queue.

The daemon may stop or die at any time while jobs run on: the execution hosts outlive it,
and a starting daemon re-adopts them, collects what happened meanwhile (jobs that ended,
with their exit codes and end times) and carries on. Only a job whose host is gone is lost
(node failure), and --requeue jobs go back to the queue then.
"""

from __future__ import annotations

import logging
import math
import os
import selectors
import signal
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from gq import defaults, policies
from gq.daemon import admission, handlers, metrics, recovery
from gq.daemon.access import Caller, Rules
from gq.daemon.devices import Device, discover, emulated
from gq.daemon.guard import Guard, Limits
from gq.daemon.hosts import HostHandle, HostUnavailable
from gq.daemon.launch import launch_spec
from gq.daemon.sampling import Sampler
from gq.daemon.server import Connection, Server
from gq.exec.protocol import HOST_VERSION
from gq.errors import UserError
from gq.home import Home
from gq.messages import DeviceReading
from gq.queue import dependencies, queries, transitions
from gq.queue import settings as queue_settings
from gq.queue.engine import Database
from gq.queue.models import Job
from gq.queue.states import JobState
from gq.units import format_duration
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.daemon")
# squeue's reasons for a pending job
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
    cpu_devices: int | None = None  # emulate this many devices on the cpu instead
    operator_group: str | None = None  # its members may act on every job and the node
    priority_cap: int = defaults.PRIORITY_CAP  # system mode: highest priority for users
    max_temp: float | None = None  # the guard: no new job onto a device hotter than this
    max_power: float | None = None  # ... or drawing more watts than this
    readings: str | None = None  # a file of recorded readings overlaid on the samples
    metrics: str | None = None  # ADDR:PORT to serve Prometheus metrics on
    client_timeout: float = defaults.CONNECTION_IDLE  # drop a client silent this long

    def to_argv(self) -> list[str]:
        """The command-line options that start a daemon with these options."""
        argv = ["--lanes", str(self.lanes), "--max-resident", str(self.max_resident),
                "--kill-wait", str(self.kill_grace), "--priority-cap", str(self.priority_cap),
                "--client-timeout", str(self.client_timeout)]
        if self.cpu_memory is not None:
            argv += ["--cpu-memory", str(self.cpu_memory)]
        if self.cpu_devices is not None:
            argv += ["--cpu-devices", str(self.cpu_devices)]
        if self.operator_group is not None:
            argv += ["--operators", self.operator_group]
        for flag, value in (("--max-temp", self.max_temp), ("--max-power", self.max_power),
                            ("--readings", self.readings), ("--metrics", self.metrics)):
            if value is not None:
                argv += [flag, str(value)]
        return argv


@dataclass
class Running:
    job_id: int
    run: int  # the job's run_count for this run: host reports name it
    started: float  # wall clock: with the time limit, when its devices are free at the latest
    devices: list[Device]
    lane: int
    host: str
    time_limit: int | None
    requeue: bool
    footprint: admission.Footprint
    exclusive: bool
    priority: int
    measured: admission.Footprint | None = None  # from the job's own memory reports
    pid: int | None = None  # its process, once its host has started it
    holds_lane: bool = False  # as its host last reported
    kill_why: str | None = None  # cancel | requeue | timeout | shutdown


class Daemon:
    def __init__(self, home: Home, options: DaemonOptions):
        self.home = home
        self.options = options
        self.db = Database(home)
        self.devices, self.device_note = discover()
        if options.cpu_devices:
            memory = options.cpu_memory or next(d for d in self.devices
                                                if d.kind == "cpu").memory_total
            self.devices = emulated(options.cpu_devices, memory)
            self.device_note = (f"{options.cpu_devices} devices emulated on the cpu "
                                "(--cpu-devices), each with its own execution host")
        elif options.cpu_memory is not None:
            self.devices = [replace(d, memory_total=options.cpu_memory) if d.kind == "cpu" else d
                            for d in self.devices]
        self.hosts: dict[str, HostHandle] = {}
        self.host_down_since: dict[str, float] = {}
        self.running: dict[int, Running] = {}
        self.progress: dict[int, transitions.Progress] = {}
        self.selector = selectors.DefaultSelector()
        self.policy_setting: tuple[str, str, str] | None = None  # name, fill, quantum
        self.stopping = False
        self.keep_jobs = False  # stopping leaves running jobs to their hosts
        self.stop_deadline = 0.0
        self.wake = True
        self.started_at = time.time()
        self.rules = Rules(daemon_uid=os.geteuid(), operator_group=options.operator_group,
                           priority_cap=options.priority_cap if home.system else None)
        self.server: Server | None = None
        self.sampler: Sampler | None = None
        self.readings: dict[str, DeviceReading] = {}  # the latest sample of each device
        self.guard = Guard(Limits(options.max_temp, options.max_power))
        self.metrics: metrics.Metrics | None = None
        self.switches: dict[str, int] = {}  # lane switches per device, as its host counts them

    # ----- life cycle -----------------------------------------------------------------
    def run(self, pidfile: IO[str]) -> None:
        """Serve until stopped; ``pidfile`` is the lock that makes this the home's daemon."""
        try:
            wake_read = signal_socket((signal.SIGTERM, signal.SIGINT, signal.SIGCHLD))
            self.selector.register(wake_read, selectors.EVENT_READ, "signal")
            with self.db.read() as session:
                self._apply_policy(queue_settings.get_all(session))
            if self.options.metrics:
                self.metrics = self._serve_metrics(self.options.metrics)
            for device in self.devices:
                self._attach_host(device)
            self.sampler = Sampler(self.devices,
                                   Path(self.options.readings) if self.options.readings else None)
            self.server = Server(self.home, self.selector, self._dispatch, self._identify,
                                 idle=self.options.client_timeout)
            log.info("daemon %d up (%s mode) on %s", os.getpid(), self.home.mode,
                     ", ".join(d.name for d in self.devices))
            self._loop(wake_read)
        finally:
            if self.server is not None:
                # A system socket stays: clients then wait for a restarting daemon instead
                # of starting personal ones.
                self.server.close(unlink=not self.home.system)
            if self.sampler is not None:
                self.sampler.close()
            if self.metrics is not None:
                self.metrics.close()
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
        last_scan = last_flush = last_sample = 0.0
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
                if self.keep_jobs or not self.running or now > self.stop_deadline:
                    break
                continue
            self._restart_dead_hosts(now)
            if now - last_sample >= defaults.SAMPLE_PERIOD:
                last_sample = now
                self._sample()
            if self.wake or now - last_scan >= defaults.POLL_PERIOD:
                self.wake = False
                last_scan = now
                self._scan()
            if now - last_flush >= defaults.FLUSH_PERIOD:
                last_flush = now
                self._flush_progress()
        self._flush_progress()
        for host in self.hosts.values():
            if self.keep_jobs:
                host.channel.close()  # the host keeps its jobs until a daemon comes back
            else:
                host.stop(timeout=2.0)

    def _timeout(self, last_scan: float) -> float:
        """Until the next thing the loop must do unprompted; never 0 while nothing is due."""
        now = time.monotonic()
        if self.stopping:  # only exits (events) and the stop deadline matter now
            deadlines = [self.stop_deadline]
        else:
            deadlines = [last_scan + defaults.POLL_PERIOD]
        assert self.server is not None
        if (connection_deadline := self.server.next_deadline()) is not None:
            deadlines.append(connection_deadline)
        return max(0.0, min(min(deadlines) - now, defaults.FLUSH_PERIOD))

    def _on_signals(self, wake_read: socket.socket) -> None:
        signums = received(wake_read)
        # A signal (systemd's stop or restart, say) leaves the jobs running: only
        # 'gq daemon stop' ends them.
        if (signal.SIGTERM in signums or signal.SIGINT in signums) and not self.stopping:
            self.begin_stop(keep_jobs=True)

    def begin_stop(self, keep_jobs: bool) -> None:
        """Stop serving; end the running jobs first unless ``keep_jobs``."""
        self.stopping, self.keep_jobs = True, keep_jobs
        if keep_jobs:
            log.info("stopping; %d running job(s) stay with their hosts", len(self.running))
            return
        log.info("stopping: ending %d running job(s)", len(self.running))
        self.stop_deadline = time.monotonic() + self.options.kill_grace + defaults.STOP_GRACE
        for job in self.running.values():
            job.kill_why = "shutdown"
            self._send(job.host, {"op": "kill", "job": job.job_id, "why": "shutdown"})

    # ----- hosts ----------------------------------------------------------------------
    def _attach_host(self, device: Device) -> None:
        """Connect to the device's host (or start one), adopt its jobs, collect its news."""
        try:
            host, state = HostHandle.attach(device, self.home, self.options.lanes,
                                            self.options.kill_grace)
        except HostUnavailable as exc:
            log.error("%s", exc)
            self.host_down_since[device.name] = time.monotonic()
            return
        self.hosts[device.name] = host
        self.selector.register(host.channel.sock, selectors.EVENT_READ, device.name)
        if host.process is None:
            log.info("re-adopted the execution host of %s (pid %d): %d job(s) running, "
                     "%d ended meanwhile", device.name, host.pid, len(state["residents"]),
                     len(state["exited"]))
        if not host.current and not host.draining:
            log.warning("the execution host of %s runs version %s, this daemon %s: draining "
                        "it (no new jobs; it exits after its last one)", device.name,
                        host.version, HOST_VERSION)
            host.draining = True
            self._send(device.name, {"op": "drain"})
        if self.policy_setting is not None and host.current:
            self._send(device.name, self._policy_message())
        self._adopt(host, state)
        # Only now, with the device's host attached, is a job the queue says runs there and
        # the host does not know lost for sure.
        recovered = recovery.recover(self.db, device.name, set(self.running),
                                     survived=host.process is None)
        if recovered:
            log.warning("jobs left running on %s that its host does not run: %s",
                        device.name, recovered)

    def _adopt(self, host: HostHandle, state: dict) -> None:
        """Take over the jobs a host runs, and record those that ended while no daemon ran.

        A job counts only if the queue says this very run of it is RUNNING on this device;
        anything else the host runs is ended (the queue is the truth: never run twice)."""
        name = host.device.name
        with self.db.read() as session:
            rows = {job.id: job for job in queries.running(session)}

        def this_run(item: dict) -> Job | None:
            row = rows.get(int(item["job"]))
            if row is None or row.run_count != item.get("run"):
                return None
            return row if (row.device or "").split(",")[0] == name else None

        for item in state["residents"]:
            row = this_run(item)
            if row is None:
                log.warning("host of %s runs job %s (run %s), which the queue does not: "
                            "ending it", name, item["job"], item.get("run"))
                self._send(name, {"op": "kill", "job": item["job"], "why": "stray"})
                continue
            job = self.running[row.id] = self._running_from(row, name)
            job.kill_why = item.get("kill_why")
            self.progress[row.id] = _progress(item)
            if row.stop_request and job.kill_why is None:  # asked for while no daemon ran
                job.kill_why = row.stop_request
                self._send(name, {"op": "kill", "job": row.id, "why": row.stop_request})
        for report in state["exited"]:
            row = this_run(report)
            if row is not None:
                self.running[row.id] = self._running_from(row, name)
            self._on_exit(name, report)

    def _running_from(self, row: Job, host: str) -> Running:
        names = (row.device or host).split(",")
        return Running(job_id=row.id, run=row.run_count, started=row.start_time or time.time(),
                       devices=[d for d in self.devices if d.name in names],
                       lane=row.lane or 0, host=host, time_limit=row.time_limit,
                       requeue=row.requeue, footprint=_footprint(row),
                       exclusive=row.exclusive, priority=row.priority, pid=row.pid)

    def _send(self, name: str, message: dict) -> None:
        """To a device's host; a host that cannot be written to has died."""
        host = self.hosts.get(name)
        if host is not None and not host.send(message):
            self._host_died(name)

    def _restart_dead_hosts(self, now: float) -> None:
        for name, since in list(self.host_down_since.items()):
            if now - since >= defaults.HOST_RESTART_DELAY:
                del self.host_down_since[name]
                device = next(d for d in self.devices if d.name == name)
                log.warning("starting a new execution host for %s", name)
                self._attach_host(device)
                self.wake = True

    def _host_died(self, name: str) -> None:
        host = self.hosts.pop(name, None)
        if host is None:
            return
        self.selector.unregister(host.channel.sock)
        host.channel.close()
        if host.alive():  # it hung up but runs on: nothing it does is seen any more
            host.kill()
        lost = [r for r in self.running.values() if r.host == name]
        if host.draining and not lost:
            log.info("the drained execution host of %s has exited", name)
        else:
            log.error("the execution host of %s died with %d job(s)", name, len(lost))
        for job in lost:
            self._end(job, None, JobState.FAILED, f"execution host of {name} died",
                      requeue=job.requeue)
        self.host_down_since[name] = time.monotonic()

    def _from_host(self, name: str) -> None:
        host = self.hosts[name]
        for message in host.channel.receive():
            op = message["op"]
            job = self.running.get(int(message.get("job", -1)))
            if job is not None and message.get("run") not in (None, job.run):
                job = None  # about an earlier run of this job
            if op == "started":
                if job is not None:
                    job.pid = int(message["pid"])
                    with self.db.write() as session:
                        transitions.record_pid(session, job.job_id, int(message["pid"]))
            elif op == "launch_failed":
                if job is not None:
                    self._end(job, None, JobState.FAILED, message["reason"])
            elif op == "exited":
                self._on_exit(name, message)
            elif op == "progress":
                for item in message["jobs"]:
                    self._on_progress(item)
                if "switches" in message:
                    self.switches[name] = sum(message["switches"])
            else:
                log.warning("unknown op from host %s: %r", name, op)
        if host.channel.closed and name in self.hosts:
            self._host_died(name)

    def _on_progress(self, item: dict) -> None:
        job = self.running.get(int(item["job"]))
        if job is None or item.get("run") != job.run:
            return
        progress = self.progress[job.job_id] = _progress(item)
        job.holds_lane = progress.holds_lane
        if progress.mem_persistent is not None:
            job.measured = admission.Footprint(
                progress.mem_persistent, max(0, (progress.mem_peak or 0) - progress.mem_persistent))

    # ----- job ends -------------------------------------------------------------------
    def _on_exit(self, host: str, message: dict) -> None:
        """Record how a run ended (why it was killed, if it was), then acknowledge it so
        the host forgets it; a report about a run already recorded is only acknowledged."""
        job = self.running.get(int(message["job"]))
        if job is not None and job.run == message.get("run"):
            self.progress[job.job_id] = _progress(message)
            self._record_exit(job, message)
        self._send(host, {"op": "ack", "job": message["job"], "run": message.get("run")})

    def _record_exit(self, job: Running, message: dict) -> None:
        code, signum = message.get("code"), message.get("signal")
        exit_code = code if signum is None else 128 + int(signum)
        why = message.get("kill_why") or job.kill_why
        end = message.get("end_time")
        if why == "cancel":
            self._end(job, exit_code, JobState.CANCELLED, "cancelled by user", end=end)
        elif why == "timeout":
            limit = format_duration(job.time_limit)
            self._end(job, exit_code, JobState.TIMEOUT, f"time limit {limit} reached", end=end)
        elif why == "deadline":
            self._end(job, exit_code, JobState.DEADLINE, "deadline reached", end=end)
        elif why == "requeue":
            self._end(job, exit_code, JobState.PENDING, "requeued by user", requeue=True,
                      end=end)
        elif why == "shutdown":
            self._end(job, exit_code, JobState.FAILED, "daemon stopped",
                      requeue=job.requeue, end=end)
        elif signum is not None:
            name = signal.Signals(int(signum)).name if int(signum) in _SIGNALS else str(signum)
            self._end(job, exit_code, JobState.FAILED, f"killed by signal {name}", end=end)
        elif code == 0:
            self._end(job, 0, JobState.COMPLETED, None, end=end)
        else:
            self._end(job, code, JobState.FAILED, f"exit code {code}", end=end)

    def _end(self, job: Running, exit_code: int | None, state: JobState, reason: str | None,
             requeue: bool = False, end: float | None = None) -> None:
        self.running.pop(job.job_id, None)
        progress = self.progress.pop(job.job_id, None)
        with self.db.write() as session:
            if progress is not None:
                transitions.record_progress(session, job.job_id, progress)
            if requeue:
                transitions.requeue(session, job.job_id,
                                    reason if state is JobState.PENDING else f"{reason}; requeued",
                                    now=end)
            else:
                transitions.finish(session, job.job_id, state, exit_code, reason, now=end)
        if self.metrics is not None:
            self.metrics.run_time.labels("REQUEUED" if requeue else state.value).observe(
                max(0.0, (end or time.time()) - job.started))
        log.info("job %d %s%s", job.job_id, "requeued" if requeue else state.value,
                 f" ({reason})" if reason else "")
        self.wake = True

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
                self._send(job.host, {"op": "kill", "job": row.id, "why": row.stop_request})
            if (row.priority, row.time_limit) != (job.priority, job.time_limit):
                job.priority, job.time_limit = row.priority, row.time_limit
                self._send(job.host, {"op": "update", "job": row.id, "priority": row.priority,
                                      "time_limit": row.time_limit})

    def _eligible(self, pending: list[Job],
                  runs: dict[int, list[tuple[JobState, bool]]]) -> list[Job]:
        """Pending jobs that may start now; the others get squeue's reason."""
        eligible, reasons, never, late = [], {}, [], []
        now = time.time()
        for job in pending:
            if job.deadline is not None and now + (job.time_limit or 0) > job.deadline:
                late.append(job)  # as Slurm: removed once it can no longer end in time
                continue
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
            for job in late:
                transitions.cancel_pending(session, job.id, _too_late(job, now),
                                           state=JobState.DEADLINE)
            for job in pending:
                if job.id in reasons and job.reason != reasons[job.id]:
                    transitions.set_pending_reason(session, job.id, reasons[job.id])
        if never or late:
            self.wake = True  # their dependants may now be unsatisfiable too
        return eligible

    def _apply_policy(self, config: dict) -> None:
        wanted = (config[queue_settings.POLICY], config[queue_settings.FILL],
                  config[queue_settings.QUANTUM])
        if wanted == self.policy_setting:
            return
        self.policy_setting = wanted
        self.policy = policies.make(*wanted)
        for name in list(self.hosts):
            self._send(name, self._policy_message())
        log.info("policy is now %s (fill %s, quantum %s)", *wanted)

    def _policy_message(self) -> dict:
        assert self.policy_setting is not None
        name, fill, quantum = self.policy_setting
        return {"op": "policy", "name": name, "fill": fill, "quantum": quantum}

    def _admit(self, pending: list[Job], array_running: dict[int, int]) -> None:
        by_id = {job.id: job for job in pending}
        views = [policies.JobView(id=j.id, user=j.user, submit_time=j.submit_time,
                                  priority=j.priority, steps_total=j.steps_total,
                                  deadline=j.deadline)
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
            requests.append(admission.Request(job.id, job.gpus, _footprint(job), job.exclusive,
                                              time_limit=job.time_limit))
        outcome = admission.place(requests, self.loads(), now=time.time())
        placements = outcome.placements
        reasons = dict(outcome.reasons)  # Resources for the first blocked job, as squeue
        reasons.update({job_id: ARRAY_LIMIT for job_id in throttled})
        changed = {job_id: reason for job_id, reason in reasons.items()
                   if by_id[job_id].reason != reason}
        if changed:
            with self.db.write() as session:
                for job_id, reason in changed.items():
                    transitions.set_pending_reason(session, job_id, reason)
        for placement in placements:
            self._launch(by_id[placement.job_id], placement)

    # ----- sampling -------------------------------------------------------------------
    def _sample(self) -> None:
        """Read every device; a device the guard starts or stops holding wakes admission."""
        assert self.sampler is not None
        jobs: dict[str, list[tuple[int, int]]] = {}
        for job in self.running.values():
            if job.pid is not None:
                for device in job.devices:
                    jobs.setdefault(device.name, []).append((job.job_id, job.pid))
        self.readings = self.sampler.sample(jobs)
        if self.guard.limits.any:
            for name, reading in self.readings.items():
                if self.guard.update(name, reading):
                    if name in self.guard.held:
                        log.warning("guard: %s", self.guard.held[name])
                    else:
                        log.info("guard: %s admits jobs again", name)
                    self.wake = True
        if self.metrics is not None:
            self.metrics.snapshot = self._snapshot()

    def _serve_metrics(self, address: str) -> metrics.Metrics:
        try:
            return metrics.Metrics(address, self.devices)
        except (OSError, UserError) as exc:
            message = getattr(exc, "strerror", None) or exc
            log.error("cannot serve metrics on %s: %s", address, message)
            raise SystemExit(2) from None

    def _snapshot(self) -> metrics.Snapshot:
        """What a scrape reports until the next sample."""
        with self.db.read() as session:
            counts = queries.counts_by_state_and_user(session)
        lanes: dict[tuple[str, int], metrics.LaneState] = {}
        for device in self.devices:
            for lane in range(max(1, self.options.lanes)):
                lanes[device.name, lane] = metrics.LaneState(device.name, lane, 0, False)
        for job in self.running.values():
            for device in job.devices:
                state = lanes[device.name, job.lane]
                state.residents += 1
                state.held |= job.holds_lane
        return metrics.Snapshot(jobs=counts, readings=dict(self.readings),
                                lanes=list(lanes.values()), switches=dict(self.switches),
                                guard=dict(self.guard.held))

    def loads(self) -> list[admission.DeviceLoad]:
        """Each available device as admission sees it: lanes, memory (less what processes
        outside gq hold), residents, free time, utilization, the guard, topology."""
        loads = {}
        for device in self.devices:
            host = self.hosts.get(device.name)
            if host is None or host.draining:
                continue  # its host is restarting, or being replaced
            lanes = max(1, self.options.lanes)
            reading = self.readings.get(device.name)
            outside = reading.external_memory // lanes if reading is not None else 0
            loads[device.name] = admission.DeviceLoad(
                name=device.name, gpu=device.whole, index=device.index or 0,
                lanes=[admission.LaneLoad(self.lane_memory(device) - outside)
                       for _ in range(lanes)],
                max_resident=self.options.max_resident,
                utilization=(reading.utilization or 0.0) if reading is not None else 0.0,
                held=self.guard.held.get(device.name), links=device.links)
        for job in self.running.values():
            ends = job.started + job.time_limit if job.time_limit is not None else math.inf
            for device in job.devices:
                load = loads.get(device.name)
                if load is None:
                    continue
                load.free_at = max(load.free_at, ends)
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
        running = Running(job_id=job.id, run=job.run_count + 1, started=time.time(),
                          devices=devices,
                          lane=placement.lane, host=placement.devices[0],
                          time_limit=job.time_limit, requeue=job.requeue,
                          footprint=_footprint(job), exclusive=job.exclusive,
                          priority=job.priority)
        self.running[job.id] = running
        if self.metrics is not None:
            self.metrics.wait.observe(max(0.0, running.started - job.submit_time))
        try:
            spec = launch_spec(job, devices, placement.lane, self.home)
        except (OSError, KeyError) as exc:  # KeyError: the submitter's account is gone
            self._end(running, None, JobState.FAILED, f"cannot launch job {job.id}: {exc}")
            return
        spec["run"] = running.run
        self._send(running.host, {"op": "launch", "job": spec})


_SIGNALS = {s.value for s in signal.Signals}


def _too_late(job: Job, now: float) -> str:
    if now >= (job.deadline or 0):
        return "deadline passed before it could start"
    return (f"cannot end before its deadline: its time limit {format_duration(job.time_limit)} "
            "ends after it")


def _footprint(job: Job) -> admission.Footprint:
    return admission.Footprint(persistent=job.mem or 0, ephemeral=0)


def _progress(item: dict) -> transitions.Progress:
    return transitions.Progress(
        steps_done=int(item.get("steps_done", 0)), attained=float(item.get("attained", 0.0)),
        mean_iteration=item.get("mean_iteration"), mean_gap=item.get("mean_gap"),
        mem_persistent=item.get("mem_persistent"),
        mem_peak=item.get("mem_peak"), holds_lane=bool(item.get("holds_lane", False)),
        steps_total=item.get("steps_total"))
