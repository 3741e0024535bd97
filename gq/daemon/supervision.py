"""The daemon's side of the execution hosts: starting or re-adopting one per device, what
they report (starts, progress, exits), and the running jobs the daemon learns from them.

Everything a host says arrives decoded and checked (:mod:`gq.exec.protocol`) and is handled
one message at a time: an error is logged with the job and the message and touches nothing
else. An exit report is acknowledged once recorded, or once recorded as a failure when it
cannot be, so no report can keep a host, or the daemon, from moving on. A host that hangs
up while it runs is attached again and keeps its jobs; only a host that died loses them,
and their leftover processes are killed before the jobs are ended or requeued.
"""

from __future__ import annotations

import itertools
import logging
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from gq import defaults, messages
from gq.codec import FrameTooLarge, MessageError
from gq.daemon import admission, memory, recovery
from gq.daemon.devices import Device, context_memory
from gq.daemon.hosts import HostHandle, HostSettings, HostUnavailable
from gq.daemon.launch import launch_spec
from gq.daemon.metrics import Metrics
from gq.exec import cgroups
from gq.exec import protocol as wire
from gq.exec.protocol import HOST_VERSION, StopWhy
from gq.home import Home
from gq.queue import queries, transitions
from gq.queue.engine import Database
from gq.queue.models import Job
from gq.queue.states import JobState
from gq.units import format_duration, format_size

log = logging.getLogger("gq.daemon")
_SIGNALS = {s.value for s in signal.Signals}
# A host's socket closes while its process exits: this long to see which it was.
_EXITING = 0.5


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
    host_mem: int | None = None  # what it holds of the node's RAM and CPUs (admission counts)
    cpus: int | None = None
    suspended: bool | None = None  # as its host was last told (None: not told since attach)
    measured: admission.Footprint | None = None  # from the job's own memory reports
    pid: int | None = None  # its process, once its host has started it
    holds_lane: bool = False  # as its host last reported
    kill_why: StopWhy | None = None
    # It declared no memory: its lane is its own until its first figures are known.
    probing: bool = False
    iterating_since: float | None = None  # wall clock: its first iteration began (probes)
    over: bool = False  # measured over its figure (MEM!), logged once
    interactive: bool = False  # its terminal is its submitter's: never moved elsewhere
    # Its host's last report, and when it came (wall clock): fresher than its row, which is
    # flushed about once a second; a forecast goes on from it.
    latest: transitions.Progress | None = None
    latest_at: float = 0.0

    def footprint_now(self) -> admission.Footprint:
        """What the job asked for (--gpu-mem), or what it was measured to use, if more."""
        if self.measured is None:
            return self.footprint
        return max(self.footprint, self.measured, key=lambda f: f.persistent + f.ephemeral)


def footprint(job) -> admission.Footprint:
    """What a job (a row, or anything with its ``mem``) asked for, or was measured or
    raised to (see :mod:`gq.daemon.memory`)."""
    return admission.Footprint(persistent=job.mem or 0, ephemeral=0)


def probed(job) -> bool:
    """Whether a job is probed: it declared no memory and runs under gq's worker, which
    reports its figures (a plain process counts as what it is measured to hold)."""
    return job.mem is None and job.interpreter is not None


class Supervisor:
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
    ):
        self.home = home
        self.probe_wait = probe_wait  # seconds a probe waits for a first iteration
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
        self.progress: dict[int, transitions.Progress] = {}
        self.switches: dict[str, int] = {}  # lane switches per device, as its host counts them
        self.policy: wire.SetPolicy | None = None
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
            job = self.running[row.id] = self._running_from(row, name)
            job.kill_why = item.kill_why
            if row.mem is not None and row.mem_basis == messages.MemoryBasis.MEASURED:
                # Its probe ended while no daemon ran, or its cap was never sent: again.
                self._send_cap(name, row.id, row.run_count, row.mem)
            progress = self.progress[row.id] = _progress(item)
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
                self.running[row.id] = self._running_from(row, name)
            self._isolated(name, self._on_exit, report)

    def _running_from(self, row: Job, host: str) -> Running:
        names = (row.device or host).split(",")
        devices = [d for d in self.devices if d.name in names]
        return Running(
            job_id=row.id,
            run=row.run_count,
            started=row.start_time or time.time(),
            devices=devices,
            lane=row.lane or 0,
            host=host,
            time_limit=row.time_limit,
            requeue=row.requeue,
            footprint=footprint(row),
            exclusive=_alone(row, devices),
            priority=row.priority,
            pid=row.pid,
            host_mem=row.host_mem,
            cpus=row.cpus,
            probing=probed(row),
            interactive=bool(row.interactive),
        )

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
            jobs, payloads = queries.launching(session, [job_id for job_id, _, _ in started])
            spans = {
                array_id: queries.array_span(session, array_id)
                for array_id in {job.array_job_id for job in jobs.values()} - {None}
            }
        for job_id, devices, lane in started:
            job = jobs[job_id]
            self._send_launch(
                job, payloads.get(job.payload_id), devices, lane, spans.get(job.array_job_id)
            )

    def _send_launch(
        self,
        job: queries.JobRow,
        payload: queries.PayloadRow | None,
        devices: list[Device],
        lane: int,
        span: tuple[int, int, int, int] | None,
    ) -> None:
        """Launch one started job (its row and its payload's, as read in its transaction;
        a job whose payload is missing fails, as any job gq cannot launch)."""
        running = Running(
            job_id=job.id,
            run=job.run_count,
            started=job.start_time,
            devices=devices,
            lane=lane,
            host=devices[0].name,
            time_limit=job.time_limit,
            requeue=job.requeue,
            footprint=footprint(job),
            exclusive=_alone(job, devices),
            priority=job.priority,
            host_mem=job.host_mem,
            cpus=job.cpus,
            suspended=False,
            probing=probed(job),
            interactive=bool(job.interactive),
        )
        self.running[job.id] = running
        if (metrics := self.metrics()) is not None:
            metrics.wait.observe(max(0.0, running.started - job.submit_time))
        try:
            if payload is None:
                raise ValueError("its environment and arguments are missing from the queue")
            spec = launch_spec(job, payload, devices, lane, running.run, self.home, span)
            self.send(running.host, wire.checked(wire.Launch(spec)))
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
        self.send(job.host, wire.Suspend(job.job_id, suspended))

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
                transitions.record_pid(session, job.job_id, pid)
        for job, pid in started:
            job.pid = pid

    def _on_launch_failed(self, name: str, message: wire.LaunchFailed) -> None:
        job = self._this_run(message)
        if job is not None:
            self.end(job, None, JobState.FAILED, message.reason)

    def _on_progress(self, name: str, message: wire.Progress) -> None:
        received = time.time()  # one moment for the whole report: its jobs' progress agrees
        for item in message.jobs:
            job = self.running.get(item.job)
            if job is None or item.run != job.run:
                continue
            progress = self.progress[job.job_id] = _progress(item)
            job.latest, job.latest_at = progress, received
            job.holds_lane = progress.holds_lane
            if job.iterating_since is None and (progress.holds_lane or progress.attained):
                job.iterating_since = time.time()
            if progress.mem_persistent is not None:
                job.measured = self._plausible_footprint(job, progress)
                self._check_figure(job, item.iterations)
        if message.switches:
            self.switches[name] = sum(message.switches)

    def _check_figure(self, job: Running, iterations: int) -> None:
        """A probed job's figure once its first iterations are measured; a job measured over
        its figure is logged (its owner sees MEM! in gq status and gq show)."""
        measured = job.measured
        assert measured is not None
        peak = measured.persistent + measured.ephemeral  # believed up to its lane
        if job.probing and iterations >= defaults.PROBE_ITERATIONS:
            self.end_probe(job, peak)
        elif (
            not job.probing
            and not job.over
            and job.footprint.persistent
            and memory.over_figure(job.footprint.persistent, peak)
        ):
            job.over = True
            log.warning(
                "job %d holds %s of device memory, more than its figure of %s (MEM!)",
                job.job_id,
                format_size(peak),
                format_size(job.footprint.persistent),
            )

    def end_probes(self, now: float) -> None:
        """Probes that ran their time (jobs of fewer iterations, counted from the first, or
        of none, from their start: loading a model may take long): their figure is what
        they were measured to hold so far; where nothing was, they have none, and count as
        what they are seen to hold."""
        for job in list(self.running.values()):
            since, limit = (
                (job.iterating_since, defaults.PROBE_SECONDS)
                if job.iterating_since is not None
                else (job.started, self.probe_wait)
            )
            if job.probing and now - since >= limit:
                measured = job.measured or admission.Footprint()
                self.end_probe(job, measured.persistent + measured.ephemeral)

    def end_probe(self, job: Running, peak: int) -> None:
        """The probe is over: the job's figure is its peak and a margin (kept in the queue,
        shown by gq show; on a GPU its cap from now on), and its lane is open to others
        again."""
        if peak > 0:  # kept in the queue first: a probe whose figure was lost goes on
            figure = min(memory.probed_figure(peak), self._lane_memory(job))
            with self.db.write() as session:
                transitions.set_memory_figure(
                    session, job.job_id, figure, messages.MemoryBasis.MEASURED
                )
            job.footprint = admission.Footprint(persistent=figure)
            self._send_cap(job.host, job.job_id, job.run, figure)
            log.info("job %d: probed at %s of device memory", job.job_id, format_size(figure))
        else:
            log.info(
                "job %d: no memory measured by its probe's end; it counts as what it "
                "is seen to hold",
                job.job_id,
            )
        job.probing = False
        self.wake()

    def _send_cap(self, name: str, job_id: int, run: int, figure: int) -> None:
        """A probed job's figure as its cap, to its GPU's host (a current one: an older host
        would not know the message). On the cpu and emulated devices a probe sees the
        worker's resident memory at its boundaries, not the transient peaks and children its
        cgroup counts: its figure is not made a cap there, and growing past it is MEM!."""
        host = self.hosts.get(name)
        if host is None or not host.current or host.device.kind != "cuda":
            return
        try:
            message = wire.checked(wire.Cap(job_id, run, figure))
        except MessageError as exc:
            log.warning("job %d: its figure of %d bytes cannot be its cap: %s", job_id, figure, exc)
            return
        self.send(name, message)

    def _plausible_footprint(
        self, job: Running, progress: transitions.Progress
    ) -> admission.Footprint:
        """The memory a job's worker reports, believed up to its lane's capacity: as much as
        the job could have asked for with --gpu-mem, never more (the figures are its word)."""
        lane = self._lane_memory(job)
        persistent = min(progress.mem_persistent or 0, lane)
        peak = min(progress.mem_peak or 0, lane)
        return admission.Footprint(persistent, max(0, peak - persistent))

    # ----- job ends -------------------------------------------------------------------
    def _reported_end(
        self, job: Running, report: wire.Exited
    ) -> tuple[Running, Ending, float | None, transitions.Progress]:
        """A run's end as its host reported it, as :meth:`_record_ends` takes it: a run that
        ran out of memory with what its lane had free beside its neighbours."""
        ending = _ending(job, report)
        shortage = report.shortage
        why = report.kill_why or job.kill_why
        if (
            shortage is not None
            and (report.code or report.signal)
            and why in (None, StopWhy.MEMORY)
        ):
            # What a job could get at most: a lane of an empty device of the kind and
            # model it runs on (its words are believed no further).
            largest = (
                max(
                    d.memory_total
                    for d in self.devices
                    if (d.whole, d.model) == (job.devices[0].whole, job.devices[0].model)
                )
                // self.settings.lanes
            )
            ending = Ending(
                JobState.FAILED,
                ending.exit_code,
                None,
                ran_out=RanOut(
                    min(shortage.held, largest + 1),
                    None if shortage.wanted is None else min(shortage.wanted, largest + 1),
                    self._free_beside(job),
                    largest,
                ),
            )
        return job, ending, report.end_time or None, _progress(report)

    def _lane_memory(self, job: Running) -> int:
        """What the job's lane offers: the least of its devices' memory, split by lanes."""
        return min(d.memory_total for d in job.devices) // self.settings.lanes

    def _free_beside(self, job: Running) -> int:
        """What the job's lane had free beside the other jobs there."""
        lane = admission.LaneLoad(
            self._lane_memory(job), overhead=max(map(context_memory, job.devices))
        )
        names = {d.name for d in job.devices}
        lane.footprints = [
            other.footprint_now()
            for other in self.running.values()
            if other is not job
            and other.lane == job.lane
            and names & {d.name for d in other.devices}
        ]
        return lane.headroom()

    def _on_exit(self, name: str, report: wire.Exited) -> None:
        """Record how a run ended (why it was killed, if it was), then acknowledge it so
        the host forgets it; a report about a run already recorded is only acknowledged.
        A report that cannot be recorded fails its job instead; only when even that fails
        is it kept unacknowledged (the host repeats it to the next daemon)."""
        job = self._this_run(report)
        if job is not None:
            try:
                self._record_ends([self._reported_end(job, report)])
            except Exception:  # noqa: BLE001 - recorded as a failure below
                log.exception(
                    "cannot record the exit of job %d (run %d): %r", job.job_id, job.run, report
                )
                self.progress.pop(job.job_id, None)
                self.end(
                    job,
                    None,
                    JobState.FAILED,
                    "its exit could not be recorded; see the daemon's log",
                )
        self.send(name, wire.Ack(report.job, report.run))

    def _on_exits(self, name: str, reports: list[wire.Exited]) -> None:
        """Several exits in one transaction, acknowledged once it has committed."""
        self._record_ends(
            [
                self._reported_end(job, report)
                for report in reports
                if (job := self._this_run(report)) is not None
            ]
        )
        for report in reports:
            self.send(name, wire.Ack(report.job, report.run))

    def end(
        self,
        job: Running,
        exit_code: int | None,
        state: JobState,
        reason: str | None,
        requeue: bool = False,
        end: float | None = None,
        counted: bool = True,
    ) -> None:
        """Record the run's end: the job's end state, or back to the queue (``requeue``;
        ``counted=False``: a run that ran no iteration, not counted among its runs)."""
        self._record_ends([(job, Ending(state, exit_code, reason, requeue, counted), end, None)])

    def _record_ends(
        self, ends: list[tuple[Running, Ending, float | None, transitions.Progress | None]]
    ) -> None:
        """Record runs' ends (each with its end time, and its last progress if its exit
        report carried one) in one transaction; forget the runs once it has committed."""
        requeued, verdicts = set(), {}
        with self.db.write() as session:
            for job, ending, end, last in ends:
                progress = last or self.progress.get(job.job_id)
                reason = ending.reason
                if ending.ran_out is not None:
                    verdict = verdicts[job.job_id] = self._ran_out(
                        session, job, ending, end, progress
                    )
                    if verdict is not None and verdict.requeue:
                        requeued.add(job.job_id)
                    continue
                if not ending.requeue and ending.state is not JobState.FAILED:
                    transitions.finish(
                        session,
                        job.job_id,
                        ending.state,
                        ending.exit_code,
                        reason,
                        now=end,
                        progress=progress,
                    )
                    continue  # the common case: one statement and its event
                if progress is not None:
                    transitions.record_progress(session, job.job_id, progress)
                if ending.requeue:
                    transitions.requeue(
                        session,
                        job.job_id,
                        reason if ending.state is JobState.PENDING else f"{reason}; requeued",
                        now=end,
                        started=ending.counted,
                    )
                    requeued.add(job.job_id)
                elif transitions.retry(
                    session, job.job_id, ending.exit_code, f"{reason or 'failed'}; retried", now=end
                ):
                    requeued.add(job.job_id)  # --retries: it had runs left
                else:
                    transitions.finish(
                        session, job.job_id, ending.state, ending.exit_code, reason, now=end
                    )
        metrics = self.metrics()
        for job, ending, end, _ in ends:
            self.running.pop(job.job_id, None)
            self.progress.pop(job.job_id, None)
            again = job.job_id in requeued
            if metrics is not None:
                metrics.run_time.labels("REQUEUED" if again else ending.state.value).observe(
                    max(0.0, (end or time.time()) - job.started)
                )
            verdict = verdicts.get(job.job_id)
            reason = verdict.reason if verdict is not None else ending.reason
            log.info(
                "job %d %s%s",
                job.job_id,
                "requeued" if again else ending.state.value,
                f" ({reason})" if reason else "",
            )
        self.wake()

    def _ran_out(
        self,
        session,
        job: Running,
        ending: Ending,
        end: float | None,
        progress: transitions.Progress | None,
    ) -> memory.Verdict | None:
        """Record a run that ran out of memory: back to the queue with its figure raised, or
        FAILED (see :mod:`gq.daemon.memory`); the verdict (None: the job was no longer
        RUNNING, and nothing changed)."""
        row = queries.job(session, job.job_id)
        if row is None:
            return None
        ran_out = ending.ran_out
        assert ran_out is not None
        verdict = memory.after_shortage(
            ran_out.held,
            ran_out.wanted,
            row.mem,
            messages.OnOutOfMemory(row.on_oom or messages.OnOutOfMemory.REQUEUE),
            row.ooms or 0,
            row.retries,
            ran_out.free,
            ran_out.largest,
        )
        changed = transitions.ran_out_of_memory(
            session,
            job.job_id,
            verdict.requeue,
            verdict.figure,
            verdict.reason,
            ending.exit_code,
            now=end,
            progress=progress,
        )
        return verdict if changed else None

    def flush(self) -> None:
        """Write the latest progress of running jobs to the queue (about once a second)."""
        updates = {k: v for k, v in self.progress.items() if k in self.running}
        self.progress.clear()
        if not updates:
            return
        try:
            with self.db.write() as session:
                for job_id, progress in updates.items():
                    transitions.record_progress(session, job_id, progress)
        except Exception:  # noqa: BLE001 - find the one that fails; keep the others
            log.exception("cannot record progress together; recording job by job")
            for job_id, progress in updates.items():
                try:
                    with self.db.write() as session:
                        transitions.record_progress(session, job_id, progress)
                except Exception:  # noqa: BLE001
                    log.exception("cannot record job %d's progress %r; dropped", job_id, progress)

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

    def usage(self, job: Job, processes_summed: int) -> cgroups.Usage | None:
        """A running job's host-side memory and processes, where it has a cgroup (what its
        processes hold summed where no memory controller counts it, for
        ``processes_summed`` of them at most)."""
        if self.cgroups is None or job.state != JobState.RUNNING.value or not job.device:
            return None
        cgroup = self.cgroups.job(job.device.split(",")[0], job.id, job.run_count)
        return cgroup.usage(processes_summed)


@dataclass(frozen=True)
class RanOut:
    """A run that ran out of memory: what it held and asked for (None: unknown), what its
    lane had free beside its neighbours, what the largest lane of an empty device offers."""

    held: int
    wanted: int | None
    free: int
    largest: int


@dataclass(frozen=True)
class Ending:
    """How a run ends in the queue."""

    state: JobState
    exit_code: int | None
    reason: str | None
    requeue: bool = False  # back to the queue, PENDING
    counted: bool = True  # False: a run that ran no iteration, not counted among its runs
    ran_out: RanOut | None = None  # it ran out of memory: the verdict is made as recorded


def _ending(job: Running, report: wire.Exited) -> Ending:
    """What a host's exit report means for the job: why it was stopped, if it was; else its
    exit status."""
    code, signum = report.code, report.signal
    exit_code = code if signum is None else 128 + signum
    why = report.kill_why or job.kill_why
    if why is StopWhy.PROTOCOL:
        return Ending(JobState.FAILED, exit_code, f"protocol error: {report.detail}")
    if why is StopWhy.LAUNCH:
        return Ending(JobState.FAILED, None, report.detail or "its process could not be started")
    if why is StopWhy.CANCEL:
        return Ending(JobState.CANCELLED, exit_code, "cancelled by user")
    if why is StopWhy.TIMEOUT:
        return Ending(
            JobState.TIMEOUT, exit_code, f"time limit {format_duration(job.time_limit)} reached"
        )
    if why is StopWhy.DEADLINE:
        return Ending(JobState.DEADLINE, exit_code, "deadline reached")
    if why is StopWhy.IDLE:  # as Jupyter's culler ends an idle kernel
        return Ending(
            JobState.TIMEOUT,
            exit_code,
            f"idle timeout: {report.detail or 'no activity for its --idle-timeout'}",
        )
    if why is StopWhy.REQUEUE:
        return Ending(JobState.PENDING, exit_code, "requeued by user", requeue=True)
    if why is StopWhy.MOVE:
        return Ending(
            JobState.PENDING,
            exit_code,
            "moved: another device starts it sooner",
            requeue=True,
            counted=False,
        )
    if why is StopWhy.HOST_MEMORY:
        return Ending(JobState.FAILED, exit_code, report.detail or "over its --host-mem")
    if why is StopWhy.HANGUP:  # as a login shell's end when its terminal closes
        return Ending(
            JobState.FAILED, exit_code, f"hung up: {report.detail or 'its terminal was closed'}"
        )
    if why is StopWhy.SHUTDOWN:
        return Ending(JobState.FAILED, exit_code, "daemon stopped", requeue=job.requeue)
    if signum is not None:
        name = signal.Signals(signum).name if signum in _SIGNALS else str(signum)
        return Ending(JobState.FAILED, exit_code, f"killed by signal {name}")
    if code == 0:
        return Ending(JobState.COMPLETED, 0, None)
    return Ending(JobState.FAILED, code, f"exit code {code}")


def _progress(item: wire.JobProgress) -> transitions.Progress:
    return transitions.Progress(
        steps_done=item.steps_done,
        attained=item.attained,
        mean_iteration=item.mean_iteration,
        mean_gap=item.mean_gap,
        mem_persistent=item.mem_persistent,
        mem_peak=item.mem_peak,
        holds_lane=item.holds_lane,
        steps_total=item.steps_total,
        startup=item.startup,
        active_at=item.active_at,
    )


def _alone(job: Job | queries.JobRow, devices: list[Device]) -> bool:
    """Whether the running job has its devices to itself (see admission's rule)."""
    return admission.has_devices_alone(
        job.exclusive, job.interpreter is not None, job.gpus, any(d.whole for d in devices)
    )
