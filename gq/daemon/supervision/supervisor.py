"""The daemon's side of the execution hosts: starting or re-adopting one per device, what
they report (starts, progress, exits), and the running jobs the daemon learns from them.

Everything a host says arrives decoded and checked (:mod:`gq.exec.protocol`) and is handled
one message at a time: an error is logged with the job and the message and touches nothing
else. An exit report is acknowledged once recorded (or recorded as a failure where it can't
be), so no report keeps a host, or the daemon, from moving on. A host that hangs up while it
runs is attached again and keeps its jobs; only one that died loses them (their leftover
processes killed before they are ended or requeued). :class:`Supervisor` holds the hosts'
connections and the running jobs; what their reports come to is in its parts, beside it:
``progress.py`` (progress, flushed to the queue), ``probes.py`` (memory probes and caps),
``endings.py`` (exits, and the end state each comes to).
"""

from __future__ import annotations

import itertools
import logging
import selectors
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from gq import defaults, messages
from gq.codec import FrameTooLarge, MessageError, checked
from gq.daemon.devices import Device
from gq.daemon.scheduling.fair_share import Account, Ledger
from gq.daemon.supervision import recovery
from gq.daemon.supervision.endings import Endings
from gq.daemon.supervision.host_handles import HostHandle, HostSettings, HostUnavailable
from gq.daemon.supervision.launch_specs import MpsEnvironment, launch_spec
from gq.daemon.supervision.probes import Probes
from gq.daemon.supervision.progress import ProgressReports
from gq.daemon.supervision.running import Running, running_run, unreserved_memory
from gq.exec.cgroups import job_cgroups as cgroups
from gq.exec.host import messages as wire
from gq.exec.host.messages import HOST_VERSION, StopWhy
from gq.home import Home
from gq.queue import job_updates, lookups, queries, transitions
from gq.queue.engine import Database
from gq.queue.models import Job
from gq.queue.states import JobState

if TYPE_CHECKING:  # prometheus-client is an extra: the exporter is imported where asked for
    from gq.daemon.monitoring.metrics import Metrics

log = logging.getLogger("gq.daemon")
# A host's socket closes while its process exits: this long to see which it was.
_EXITING = 0.5


class Supervisor(ProgressReports, Probes, Endings):
    def __init__(
        self,
        home: Home,
        db: Database,
        devices: list[Device],
        settings: HostSettings,
        selector: selectors.BaseSelector,
        wake: Callable[[], None],
        metrics: Callable[[], Metrics | None],
        probe_wait: float = defaults.PROBE_IDLE_SECONDS,
        fair_half_life: float = defaults.FAIR_HALF_LIFE,
        max_pids: int = defaults.MAX_PIDS,
    ):
        self.home = home
        self.probe_wait = probe_wait  # seconds a probe waits for a first iteration
        self.max_pids = max_pids  # sent in each launch: it holds on adopted hosts too
        self.db = db
        self.devices = devices
        self.settings = settings
        self.selector = selector
        self.wake = wake  # admission should look again: a job ended, a host came back
        self.metrics = metrics
        self.cgroups = cgroups.detect(settings.cgroup, home.tag)
        self.hosts: dict[str, HostHandle] = {}
        self.down_since: dict[str, float] = {}
        self.running: dict[int, Running] = {}
        self.node_memory = psutil.virtual_memory().total  # the node's RAM, reserved or not
        self.progress: dict[int, wire.JobProgress] = {}
        self.switches: dict[str, int] = {}  # lane switches per device, as its host counts them
        self.packing: dict[str, wire.PackingReport] = {}  # --lanes auto: as each host said
        self.policy: wire.SetPolicy | None = None
        self.mps_environment: MpsEnvironment = lambda job_id, user, devices: None  # (node.py's)
        self.ledger = Ledger(fair_half_life)  # each user's fair-share usage
        with db.read() as session:
            self.ledger.load(session)
        self.shared: dict[str, dict[str, float]] = {}
        self._handlers: dict[type, Callable] = {
            wire.Started: self._on_started,
            wire.LaunchFailed: self._on_launch_failed,
            wire.Exited: self._on_exit,
            wire.Progress: self._on_progress,
            wire.State: lambda name, _: log.warning("host %s sent its state unasked", name),
            wire.ForeignState: lambda name, _: None,
        }
        self._together: dict[type, Callable] = {
            wire.Started: self._on_starts,
            wire.Exited: self._on_exits,
        }

    # ----- attaching ------------------------------------------------------------------
    def attach(self, device: Device, start: bool = True) -> None:
        """Connect to the device's host (or start one, unless not ``start``), adopt its jobs,
        collect its news."""
        try:
            host, state = HostHandle.attach(device, self.home, self.settings, start)
        except HostUnavailable as exc:
            (log.error if start else log.info)("%s", exc)
            self.down_since[device.name] = time.monotonic()
            return
        self.hosts[device.name] = host
        self.selector.register(host.channel.sock, selectors.EVENT_READ, device.name)
        if not host.current:
            log.warning(
                "the execution host of %s runs version %s, this daemon %s: draining "
                "it (no new jobs; it exits after its last one)",
                device.name,
                host.version,
                HOST_VERSION,
            )
            if not host.draining:
                host.draining = True
                self.send(device.name, wire.Drain())
        if not isinstance(state, wire.State):
            return  # unreadable: its jobs are recovered once it has gone
        if host.process is None:
            log.info(
                "re-adopted the execution host of %s (pid %d): %d job(s) running, "
                "%d ended meanwhile",
                device.name,
                host.pid,
                len(state.residents),
                len(state.exited),
            )
        if self.policy is not None and host.current:
            self.send(device.name, self.policy)
        self.shared.pop(device.name, None)  # told its users' usage again at the next flush
        for job in [r for r in self.running.values() if r.host == device.name]:
            del self.running[job.job_id]  # known from an earlier attach: the state says now
            self.progress.pop(job.job_id, None)
        self._adopt(host, state)
        # Only now, with the device's host attached, is a job the queue says runs there and
        # the host does not know lost for sure.
        recovered = recovery.recover(
            self.db,
            device.name,
            set(self.running),
            survived=host.process is None,
            cgroups=self.cgroups,
        )
        if recovered:
            log.warning(
                "jobs left running on %s that its host does not run: %s", device.name, recovered
            )

    def _adopt(self, host: HostHandle, state: wire.State) -> None:
        """Take over the jobs a host runs, and record those that ended while no daemon ran.

        A job counts only if the queue says this very run of it is RUNNING on this device;
        anything else the host runs is ended (the queue is the truth: never run twice)."""
        name = host.device.name
        with self.db.read() as session:
            rows = {job.id: job for job in queries.running(session)}

        def this_run(item: wire.JobProgress) -> Job | None:
            row = rows.get(item.job)
            if row is None or row.run_count != item.run:
                return None
            return row if (row.device or "").split(",")[0] == name else None

        for item in state.residents:
            row = this_run(item)
            if row is None:
                log.warning(
                    "host of %s runs job %d (run %d), which the queue does not: ending it",
                    name,
                    item.job,
                    item.run,
                )
                self.send(name, wire.Kill(item.job, StopWhy.STRAY))
                continue
            job = self.running[row.id] = self._running_from(row, name, item)
            job.kill_why = item.kill_why
            if row.mem is not None and row.mem_basis == messages.MemoryBasis.MEASURED:
                # Its probe ended while no daemon ran, or its cap was never sent: again.
                self._send_cap(name, row.id, row.run_count, row.mem)
            progress = self.progress[row.id] = item
            job.latest, job.latest_at = progress, time.time()
            if progress.holds_lane or progress.attained:
                job.iterating_since = time.time()  # a probe's time runs from now on
            if progress.mem_persistent is not None:  # a probe may end with what it says
                job.measured = self._plausible_footprint(job, progress)
                self._check_figure(job, item.iterations)
            if row.stop_request and job.kill_why is None:  # asked for while no daemon ran
                job.kill_why = StopWhy(row.stop_request)
                self.send(name, wire.Kill(row.id, job.kill_why))
        for report in state.exited:
            row = this_run(report)
            if row is not None:
                self.running[row.id] = self._running_from(row, name, report)
            self._isolated(name, self._on_exit, report)

    def _running_from(self, row: Job, host: str, report: wire.JobProgress) -> Running:
        """A run the queue says is running on ``host``, adopted: charged already for what
        it attained by its last recorded progress, less what its host left uncharged (side
        by side); what went so while no daemon ran is charged after all (never less)."""
        names = (row.device or host).split(",")
        devices = [d for d in self.devices if d.name in names]
        job = running_run(row, devices, row.lane or 0, host)
        job.charged.attained = max(0.0, (row.attained or 0.0) - wire.uncharged(report))
        job.charged.share = Account(job.charged.attained, time.time())  # (counted, decaying)
        job.active_at, job.active_attained = time.time(), job.charged.attained  # (as yet unknown)
        return job

    # ----- talking to hosts -----------------------------------------------------------
    def send(self, name: str, message: object) -> None:
        """To a device's host; a host that cannot be written to is let go (attached again
        later if it lives)."""
        host = self.hosts.get(name)
        if host is not None and not host.send(message):
            self._host_gone(name, "it stopped reading")

    def launch(self, placements: list[tuple[int, list[Device], int]]) -> None:
        """Record the starts of a pass's placements (job, devices, lane) in one transaction,
        then send the launches (the queue first: never run twice)."""
        started = []
        with self.db.write() as session:
            for job_id, devices, lane in placements:
                if transitions.start(session, job_id, ",".join(d.name for d in devices), lane):
                    started.append((job_id, devices, lane))  # else cancelled or held meanwhile
            jobs, payloads = lookups.launching(session, [job_id for job_id, _, _ in started])
            spans: dict[int | None, tuple[int, int, int, int]] = {
                array_id: lookups.array_span(session, array_id)
                for array_id in {
                    job.array_job_id for job in jobs.values() if job.array_job_id is not None
                }
            }
        for job_id, devices, lane in started:
            job = jobs[job_id]
            self._send_launch(
                job, payloads.get(job.payload_id), devices, lane, spans.get(job.array_job_id)
            )

    def _send_launch(
        self,
        job: lookups.JobRow,
        payload: lookups.PayloadRow | None,
        devices: list[Device],
        lane: int,
        span: tuple[int, int, int, int] | None,
    ) -> None:
        """Launch one started job (its row and its payload's, as read in its transaction;
        a job whose payload is missing fails, as any job gq cannot launch)."""
        running = running_run(job, devices, lane, devices[0].name)
        running.suspended = False
        self.running[job.id] = running
        if (metrics := self.metrics()) is not None:
            metrics.wait.observe(max(0.0, running.started - job.submit_time))
        try:
            if payload is None:
                raise ValueError("its environment and arguments are missing from the queue")
            mps = self.mps_environment(job.id, job.user, devices)
            spec = launch_spec(
                job, payload, devices, lane, running.run, self.home, span, self.max_pids, mps
            )
            self.send(running.host, checked(wire.Launch(spec)))
        except (OSError, ValueError, FrameTooLarge, MessageError) as exc:
            # FrameTooLarge, MessageError: what the job carries does not fit the host's wire
            # (a row from before a limit, or gq's own additions such as its PYTHONPATH)
            self.end(running, None, JobState.FAILED, f"cannot launch job {job.id}: {exc}")
        except Exception:  # noqa: BLE001 - recorded started, it must not stay RUNNING
            log.exception("cannot launch job %d", job.id)
            self.end(
                running, None, JobState.FAILED, f"cannot launch job {job.id}; see the daemon's log"
            )

    def kill(self, job: Running, why: StopWhy) -> None:
        job.kill_why = why
        self.send(job.host, wire.Kill(job.job_id, why))

    def ask_to_move(self, job: Running) -> None:
        """End a run that has had no iteration, to place the job again (StopWhy.MOVE)."""
        self.send(job.host, wire.Kill(job.job_id, StopWhy.MOVE))

    def suspend(self, job: Running, suspended: bool) -> None:
        job.suspended = suspended
        # Where its memory may go to host memory: a job without --host-mem of its own puts
        # it in what no other job reserved and no other checkpoint holds.
        room = None
        host = self.hosts.get(job.host)
        if suspended and not job.host_mem and host is not None and host.current:
            room = max(0, unreserved_memory(self.node_memory, self.running.values(), job))
        self.send(job.host, wire.Suspend(job.job_id, suspended, room))

    def signal(self, job: Running, signum: int) -> None:
        self.send(job.host, wire.SignalGroup(job.job_id, signum))

    def update(self, job: Running, priority: int, time_limit: int | None) -> None:
        job.priority, job.time_limit = priority, time_limit
        self.send(job.host, wire.Update(job.job_id, priority, time_limit))

    def set_policy(self, message: wire.SetPolicy) -> None:
        self.policy = message
        for name, host in list(self.hosts.items()):
            if host.current:
                self.send(name, message)

    def receive(self, name: str) -> None:
        """Whatever the device's host has sent (its socket polled readable). A run of
        starts or of exits is recorded in one transaction (a host reports many at once when
        jobs are short); should that fail, each is handled on its own."""
        host = self.hosts.get(name)
        if host is None:
            return
        for kind, group in itertools.groupby(host.channel.receive(), type):
            messages = list(group)
            together = self._together.get(kind)
            if together is not None and len(messages) > 1:
                try:
                    together(name, messages)
                    messages = []
                except Exception:  # noqa: BLE001 - each on its own below
                    log.exception(
                        "cannot record %d %s reports from the host of %s together; "
                        "recording them one by one",
                        len(messages),
                        kind.__name__,
                        name,
                    )
            for message in messages:
                self._isolated(name, self._handlers[type(message)], message)
                if self.hosts.get(name) is not host:
                    return
            if self.hosts.get(name) is not host:
                return
        if host.channel.error:
            log.error("the execution host of %s sent %s", name, host.channel.error)
            self._host_gone(name, "it broke the protocol")
        elif host.channel.closed:
            self._host_gone(name, "it hung up")

    def _isolated(self, name: str, handler: Callable, message: object) -> None:
        """Handle one host message; an error is logged with the job and the message."""
        try:
            handler(name, message)
        except Exception:  # noqa: BLE001 - one report must not stop the daemon
            log.exception(
                "error handling %s from the host of %s (job %s)",
                type(message).__name__,
                name,
                getattr(message, "job", "-"),
            )

    def _this_run(self, message: wire.Started | wire.LaunchFailed | wire.Exited) -> Running | None:
        job = self.running.get(message.job)
        return job if job is not None and job.run == message.run else None

    def _on_started(self, name: str, message: wire.Started) -> None:
        self._on_starts(name, [message])

    def _on_starts(self, name: str, messages: list[wire.Started]) -> None:
        started = [
            (job, message.pid)
            for message in messages
            if (job := self._this_run(message)) is not None
        ]
        if not started:
            return
        with self.db.write() as session:
            for job, pid in started:
                job_updates.record_pid(session, job.job_id, pid)
        for job, pid in started:
            job.pid = pid

    def _on_launch_failed(self, name: str, message: wire.LaunchFailed) -> None:
        job = self._this_run(message)
        if job is not None:
            self.end(job, None, JobState.FAILED, message.reason)

    # ----- hosts that go away ---------------------------------------------------------
    def restart_dead(self, now: float) -> None:
        for name, since in list(self.down_since.items()):
            if now - since >= defaults.HOST_RESTART_DELAY:
                del self.down_since[name]
                device = next(d for d in self.devices if d.name == name)
                log.warning("attaching the execution host of %s again", name)
                self.attach(device)
                self.wake()

    def end_let_go(self) -> None:
        """A daemon that stops and ends its jobs: the hosts it let go of and has not attached
        again (alive, their jobs running) are attached now, none started, and their jobs
        ended too; otherwise they would outlive the stop with their jobs."""
        for name in list(self.down_since):
            device = next(d for d in self.devices if d.name == name)
            del self.down_since[name]
            self.attach(device, start=False)
            if name in self.hosts:
                for job in [r for r in self.running.values() if r.host == name]:
                    self.kill(job, StopWhy.SHUTDOWN)

    def _host_gone(self, name: str, why: str) -> None:
        """Let go of a host's connection. A host that still runs keeps its jobs and is
        attached again shortly; one that died takes its jobs with it."""
        host = self.hosts.pop(name, None)
        if host is None:
            return
        self.selector.unregister(host.channel.sock)
        host.channel.close()
        self.down_since[name] = time.monotonic()
        self.packing.pop(name, None)  # (told again by its next host, or by it once back)
        lost = [r for r in self.running.values() if r.host == name]
        if host.alive(grace=_EXITING):  # its jobs stay counted until the next attach
            log.warning(
                "let go of the execution host of %s (%s); it keeps its %d job(s) "
                "and is attached again",
                name,
                why,
                len(lost),
            )
            return
        if host.draining and not lost:
            log.info("the drained execution host of %s has exited", name)
            return
        log.error("the execution host of %s died with %d job(s)", name, len(lost))
        for job in lost:
            recovery.kill_leftovers(self.cgroups, name, job.job_id, job.run, job.pid)
            self.end(
                job, None, JobState.FAILED, f"execution host of {name} died", requeue=job.requeue
            )

    def close(self, keep_jobs: bool) -> None:
        """The daemon stops: hosts keep their jobs (``keep_jobs``) or end them and exit."""
        for host in self.hosts.values():
            if keep_jobs:
                host.channel.close()  # the host keeps its jobs until a daemon comes back
            else:
                host.stop(timeout=2.0)

    def remove_empty_cgroups(self) -> None:
        """The daemon exits: the cgroup directories made for its hosts go where no job is in
        them (a daemon that failed to start made them for nothing; a host that runs on
        makes them again when it starts a job)."""
        if self.cgroups is not None:
            for device in self.devices:
                self.cgroups.remove_device(device.name)
