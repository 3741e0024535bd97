"""Execution host: one process per device. Starts each job as its submitter and keeps its
worker resident; what happens at iteration boundaries, the grant of each lane's next
iteration, is :mod:`gq.exec.granting`'s (a suspended job's lane too). This owns the loop, the
daemon's link and the jobs' processes: launches, time limits, freezing, kills and exits.

The hot path (READY → pick → GO) touches no database and no disk; the daemon gets
progress about once a second and every start and exit as it happens.

A host outlives the daemon that started it: it listens on its own socket in the state
directory (``hosts/<device>.sock``, its pid locked in ``hosts/<device>.pid``), keeps running
its jobs under the policy it last had, enforces their time limits, and keeps every exit
report until a daemon acknowledges it. A daemon that connects says Hello and gets the
host's whole State back (see :mod:`gq.exec.protocol`).

Nothing a peer sends can stop the host: every message is checked on decode, a worker that
breaks the protocol loses its job (FAILED, naming the message) and nothing else, and each
event is handled in isolation, so an unexpected error costs at most the job it concerns.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import math
import os
import selectors
import signal
import socket
import struct
import time
from collections.abc import Callable

from gq import defaults, policies
from gq import log as gq_log
from gq.errors import AlreadyRunning, LaunchError
from gq.exec import cgroups, idleness
from gq.exec import protocol as wire
from gq.exec.cgroups import JobCgroup
from gq.exec.granting import Granter
from gq.exec.lease import SharedPage
from gq.exec.memory_watch import MemoryWatch, Watched
from gq.exec.protocol import FROM_WORKER, HOST_VERSION, TO_HOST, Channel, StopWhy, host_paths
from gq.exec.residents import Lane, Resident
from gq.exec.spawn import JobProcess, group_members, kill_group, start_as_submitter, step_tasks
from gq.exec.terminal import Terminal, Terminals, bind_private
from gq.queue import spool
from gq.units import format_duration, format_size
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.host")
HOUSEKEEPING_PERIOD = defaults.HOUSEKEEPING_PERIOD
# How long an exited job's leftovers may take to die before its exit is reported all the
# same (they are killed on after); the host never waits for them meanwhile.
_REAP_WAIT = 1.0


class Host:
    """One device's execution host (see the module's docstring); :meth:`run` is its loop."""

    def __init__(
        self,
        device: str,
        cuda: bool,
        lanes: int,
        listener: socket.socket,
        kill_grace: float,
        cgroup_backend: cgroups.Cgroups | None = None,
        memory: int | None = None,
        terminal_dir: str | None = None,
        attach_wait: float = defaults.ATTACH_WAIT,
    ):
        self.device = device
        self.cuda = cuda
        self.lanes = [Lane(i) for i in range(max(1, lanes))]
        self.listener = listener
        self.daemon: Channel | None = None  # the daemon now connected, if any
        self.greeted = False  # it said hello: until then it is sent nothing but the state
        self.kill_grace = kill_grace
        self.cgroups = cgroup_backend
        self.policy_name = ("fifo", "always", policies.DEFAULT_QUANTUM)
        self.residents: dict[int, Resident] = {}
        self.exited: dict[int, wire.Exited] = {}  # exit reports no daemon has acknowledged
        self.lingering: list[JobCgroup] = []  # killed, not empty yet: killed again until so
        self.selector = selectors.DefaultSelector()
        self.terminals = Terminals(terminal_dir, attach_wait, self.selector)  # gq run --pty's
        self.stopping = False  # ending every job, then exiting
        self.draining = False  # taking no new job, exiting once the last one has ended
        self.child_exited = False
        self._next_housekeeping = 0.0
        self._next_idle_check = 0.0  # interactive jobs' terminals (gq.exec.idleness)
        self._last_progress = 0.0
        self._memory_watch_at = 0.0  # monotonic: when _watch_host_memory asks again
        self.memory_watch: MemoryWatch | None = None  # made for the first job it watches
        self._reported_switches: list[int] = []
        self.granter = Granter(
            self.lanes,
            self.residents,
            self.selector,
            self,
            cuda,
            policies.make(*self.policy_name),
            None if memory is None else memory // len(self.lanes),
        )
        self._from_daemon_handlers: dict[type, Callable] = {
            wire.Hello: self._on_hello,
            wire.Launch: self._on_launch,
            wire.Kill: self._on_kill,
            wire.Ack: self._on_ack,
            wire.Update: self._on_update,
            wire.Cap: self._on_cap,
            wire.SetPolicy: self._on_policy,
            wire.Shutdown: lambda _: self._shutdown(),
            wire.Drain: self._on_drain,
            wire.Suspend: self._on_suspend,
            wire.SignalGroup: self._on_signal,
        }

    # ----- the loop -------------------------------------------------------------------
    def run(self) -> None:
        wake_read = signal_socket((signal.SIGCHLD, signal.SIGTERM, signal.SIGINT))
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(wake_read, selectors.EVENT_READ, "signal")
        while not ((self.stopping or self.draining) and not self.residents):
            events = self.selector.select(self._timeout())
            for key, _ in events:
                self._isolated(self._on_event, key.data, wake_read)
            now = time.monotonic()
            # Busy lanes may never time out: deadlines (kills, anticipation) need a clock too.
            if not events or self.child_exited or now >= self._next_housekeeping:
                self._next_housekeeping = now + HOUSEKEEPING_PERIOD
                self.child_exited = False
                for chore in (
                    self._reap,
                    self._enforce_time_limits,
                    self._enforce_kills,
                    self._hang_up_untaken,
                    self.granter.close_given_back,
                    self.granter.schedule_waiting_lanes,
                    self._kill_lingering,
                    self._watch_host_memory,
                    self._watch_idle,
                ):
                    self._isolated(chore)
            self._isolated(self._maybe_send_progress)
        self.terminals.close()
        for cgroup in self.lingering:
            cgroup.kill(defaults.CGROUP_KILL_TIMEOUT)
            cgroup.remove()
        if self.cgroups is not None:
            self.cgroups.remove_device(self.device)
        log.info("host of %s exits (%s)", self.device, "stopped" if self.stopping else "drained")

    def _on_event(self, data: object, wake_read: socket.socket) -> None:
        if data == "listener":
            self._accept_daemon()
        elif data == "daemon":
            try:
                self._from_daemon()
            except Exception:  # noqa: BLE001 - a link that fails once would fail again
                log.exception("error on the daemon's connection; dropping it")
                if self.daemon is not None:
                    self._forget_daemon()
        elif data == "signal":
            self._on_signals(wake_read)
        elif data == "memory":
            self._on_memory_readings()
        elif isinstance(data, Resident):
            self.granter.from_worker(data)
        elif isinstance(data, JobProcess):
            self._set_up(data)
        elif isinstance(data, Terminal):
            if self.terminals.on_event(data, data.job in self.residents):
                self._hang_up(data.job, data.run, "its terminal was closed")

    def _isolated(self, action: Callable, *args) -> None:
        """Run one event's handling; an unexpected error is logged and ends at most the job
        it concerns, never the loop."""
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001 - the host must outlive any one event
            resident = next((a for a in args if isinstance(a, Resident)), None)
            if resident is None:
                log.exception("error in %s (the host goes on)", action.__name__)
                return
            log.exception("error on job %d's message; ending the job", resident.job_id)
            self.granter.end_for_protocol(
                resident, f"the execution host failed on its message ({type(exc).__name__})"
            )

    def _timeout(self) -> float:
        timeout = 0.25 if self.residents else defaults.PROGRESS_PERIOD
        if any(r.exit_status is not None for r in self.residents.values()):
            timeout = HOUSEKEEPING_PERIOD  # an exited job's leftovers
        return min(timeout, self.granter.due_in(time.monotonic()))

    def _on_signals(self, wake_read: socket.socket) -> None:
        signums = received(wake_read)
        if signal.SIGCHLD in signums:
            self.child_exited = True
        if signal.SIGTERM in signums or signal.SIGINT in signums:
            self._shutdown()

    # ----- the daemon: it may come and go -------------------------------------------
    def _accept_daemon(self) -> None:
        """A daemon connects (a newer one replaces an older connection)."""
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # out of descriptors, say: the connected daemon goes on
            log.warning("cannot accept a daemon: %s", exc)
            return
        if _peer_uid(sock) != os.geteuid():  # only the daemon's own user may drive a host
            sock.close()
            return
        if self.daemon is not None:
            self._forget_daemon()
        sock.setblocking(False)
        self.daemon, self.greeted = Channel(sock, TO_HOST), False
        self.selector.register(sock, selectors.EVENT_READ, "daemon")
        log.info("a daemon connected")

    def _forget_daemon(self) -> None:
        assert self.daemon is not None
        self.selector.unregister(self.daemon.sock)
        self.daemon.close()
        self.daemon = None

    def _tell(self, message: object) -> None:
        """Send to the daemon if one is connected and greeted; what it must not miss is kept
        anyway, and its state answers its hello first."""
        if self.daemon is not None and self.greeted and not self.daemon.send(message):
            log.warning("the daemon went away")
            self._forget_daemon()

    def _from_daemon(self) -> None:
        assert self.daemon is not None
        channel = self.daemon
        for message in channel.receive():
            handler = self._from_daemon_handlers[type(message)]
            self._isolated(handler, message)
            if self.daemon is not channel:
                return  # the handler lost the daemon (it went away mid-answer)
        if channel.error:
            log.error("dropping the daemon's connection: it sent %s", channel.error)
            self._forget_daemon()
        elif channel.closed:
            log.info("the daemon disconnected; jobs keep running")
            self._forget_daemon()

    def _on_hello(self, _message: wire.Hello) -> None:
        self.greeted = True
        self._tell(self._state())

    def _on_ack(self, message: wire.Ack) -> None:
        report = self.exited.get(message.job)
        if report is not None and report.run == message.run:
            del self.exited[message.job]

    def _on_update(self, message: wire.Update) -> None:
        resident = self.residents.get(message.job)
        if resident is not None:
            resident.priority = message.priority
            resident.time_limit = message.time_limit

    def _on_cap(self, message: wire.Cap) -> None:
        """A probed run's figure is its cap on this GPU from now on: its worker's allocator
        is held to it from its next grant. Sent again (a daemon that attached again), it
        changes nothing: a job that lifted its own fraction is not capped anew."""
        resident = self.residents.get(message.job)
        if (
            resident is None
            or resident.run != message.run
            or resident.exit_status is not None
            or resident.mem_cap == message.mem_cap
        ):
            return
        if not self.cuda:
            log.warning(
                "job %d: a device-memory cap is for a GPU's jobs; ignored here", resident.job_id
            )
            return
        self.granter.cap(resident, message.mem_cap)
        log.info("job %d: capped at %d bytes of device memory", resident.job_id, message.mem_cap)

    def _on_suspend(self, message: wire.Suspend) -> None:
        resident = self.residents.get(message.job)
        if (
            resident is None
            or resident.exit_status is not None
            or resident.suspended == message.suspended
            or (message.suspended and resident.kill_deadline is not None)
        ):
            return  # gone, as asked already, or being ended: its SIGTERM must be seen
        self.granter.suspend(resident, message.suspended)

    def _on_signal(self, message: wire.SignalGroup) -> None:
        """Its main process group, as Jupyter signals a kernel's (not its cgroup: what a
        cell started in a session of its own is the cell's to stop)."""
        resident = self.residents.get(message.job)
        if (
            resident is None
            or resident.exit_status is not None
            or resident.kill_deadline is not None
        ):
            return  # gone, or being ended already
        kill_group(resident.process.pid, message.signum)

    def freeze(self, resident: Resident, frozen: bool) -> None:
        """Freeze (or thaw) the job: its cgroup's freezer, else SIGSTOP (SIGCONT)."""
        resident.frozen = frozen
        if resident.cgroup is None or not resident.cgroup.freeze(frozen):
            self._signal_job(resident, signal.SIGSTOP if frozen else signal.SIGCONT)

    def _on_policy(self, message: wire.SetPolicy) -> None:
        try:
            policy = policies.make(message.name, message.fill, message.quantum)
        except ValueError as exc:
            log.warning("ignoring policy change: %s", exc)
            return
        self.policy_name = (message.name, message.fill, message.quantum)
        self.granter.set_policy(policy)

    def _on_drain(self, _message: wire.Drain) -> None:
        log.info("draining: no new jobs; exiting after the last one")
        self.draining = True

    def _on_kill(self, message: wire.Kill) -> None:
        resident = self.residents.get(message.job)
        if resident is None:
            return
        if message.why is StopWhy.MOVE and (resident.granted_at or resident.iterations):
            return  # it has been granted an iteration since the daemon looked: it stays
        self.kill(resident, message.why)

    def _state(self) -> wire.State:
        """Everything a daemon that (re)connects must know."""
        self.granter.read_leased_pages()
        return wire.State(
            version=HOST_VERSION,
            pid=os.getpid(),
            device=self.device,
            lanes=len(self.lanes),
            policy=list(self.policy_name),
            draining=self.draining,
            residents=[r.resident_state() for r in self.residents.values()],
            exited=list(self.exited.values()),
        )

    def _on_launch(self, message: wire.Launch) -> None:
        spec = message.job
        if self.draining or self.stopping:
            self._tell(
                wire.LaunchFailed(
                    spec.id, spec.run, "its execution host is being replaced; requeued"
                )
            )
            return
        if spec.id in self.residents:
            log.warning("job %d is resident already; launch of run %d refused", spec.id, spec.run)
            self._tell(wire.LaunchFailed(spec.id, spec.run, "already running on this host"))
            return
        try:
            resident = self._spawn(spec)
        except LaunchError as exc:
            self._tell(wire.LaunchFailed(spec.id, spec.run, str(exc)))
            return
        self.residents[spec.id] = resident
        self.lanes[resident.lane].residents.append(resident)
        if resident.channel is not None:
            self.selector.register(resident.channel.sock, selectors.EVENT_READ, resident)
        self.selector.register(resident.process.setup_pipe, selectors.EVENT_READ, resident.process)
        self._tell(wire.Started(spec.id, resident.run, resident.process.pid))

    def _set_up(self, process: JobProcess) -> None:
        """A job's process has exec'd, or failed before and says why (it exits then, and
        its exit report carries the reason)."""
        if process.setup_pipe is not None:
            self.selector.unregister(process.setup_pipe)
            process.read_setup()

    def _spawn(self, spec: wire.LaunchSpec) -> Resident:
        """Start the job's process as its submitter, in its own process group and cgroup,
        with its snapshot open as SCRIPT_FD and, for a Python job, its socket as WORKER_FD."""
        env = dict(spec.env)
        fds: dict[int, int] = {}
        script = _open_snapshot(spec)
        worker_end = host_end = page = page_fd = slave = None
        try:
            if script is not None:
                fds[wire.SCRIPT_FD] = script
            if spec.terminal:
                slave = fds[wire.TERMINAL_FD] = self.terminals.open(spec)
            if spec.worker:
                host_end, worker_end = socket.socketpair()
                env["GQ_WORKER_FD"] = str(wire.WORKER_FD)
                fds[wire.WORKER_FD] = worker_end.fileno()
                page, page_fd = _lane_page(spec.id)
                if page_fd is not None:
                    env["GQ_PAGE_FD"] = str(wire.PAGE_FD)
                    fds[wire.PAGE_FD] = page_fd
                if spec.mem_cap is not None and self.cuda:
                    env["GQ_MEM_CAP"] = str(spec.mem_cap)
            cgroup, cgroup_cap = self._make_cgroup(spec)
            try:
                process = start_as_submitter(spec, env, fds, cgroup)
            except LaunchError:
                if cgroup is not None:
                    cgroup.remove()
                raise
        except LaunchError:
            if host_end is not None:
                host_end.close()
            if page is not None:
                page.close()
            self.terminals.discard(spec.id)
            raise
        finally:
            if slave is not None:
                os.close(slave)  # the job's alone: its last close hangs the master up
            if worker_end is not None:
                worker_end.close()
            if page_fd is not None:
                os.close(page_fd)
            if script is not None:
                os.close(script)
        channel = None
        if host_end is not None:
            host_end.setblocking(False)
            channel = Channel(host_end, FROM_WORKER, chunk=defaults.WORKER_READ)
        lane = spec.lane
        if lane is None or not 0 <= lane < len(self.lanes):
            lane = min(self.lanes, key=lambda option: len(option.residents)).index
        return Resident(
            job_id=spec.id,
            run=spec.run,
            user=spec.user,
            priority=spec.priority,
            submit_time=spec.submit_time,
            declared_total=spec.steps_total,
            lane=lane,
            process=process,
            channel=channel,
            started_at=time.monotonic(),
            started_wall=time.time(),
            cgroup=cgroup,
            time_limit=spec.time_limit,
            deadline=spec.deadline,
            interactive=spec.terminal,
            idle_timeout=spec.idle_timeout,
            warning=(spec.warn_signal, spec.warn_before, spec.warn_main)
            if spec.warn_signal is not None
            else None,
            mem_cap=spec.mem_cap,
            cgroup_cap=cgroup_cap,
            probing=spec.probe,
            page=page,
            host_mem_watched=spec.host_mem if cgroup is None or not cgroup.memory_limited else None,
        )

    def _hang_up_untaken(self) -> None:
        for terminal in self.terminals.untaken(time.monotonic()):
            self._hang_up(
                terminal.job,
                terminal.run,
                f"no gq took its terminal within {self.terminals.wait:g} s",
            )

    def _hang_up(self, job: int, run: int, detail: str) -> None:
        """The run's terminal is gone: the kernel has sent its session SIGHUP, which ends a
        shell or a REPL as it ends a login shell; what is left is killed after the kill
        wait."""
        resident = self.residents.get(job)
        if (
            resident is None
            or resident.run != run
            or resident.exit_status is not None
            or resident.kill_why is not None
        ):
            return
        log.info("job %d: hung up (%s)", job, detail)
        resident.kill_why, resident.detail = StopWhy.HANGUP, detail
        if resident.frozen:
            self.freeze(resident, False)
        resident.kill_deadline = time.monotonic() + self.kill_grace

    def _make_cgroup(self, spec: wire.LaunchSpec) -> tuple[JobCgroup | None, int | None]:
        """The run's cgroup, limited to its host memory and CPUs, and on a device that is
        the host's own memory (cpu, emulated) to its device-memory figure too; and the
        cgroup's memory limit where it holds that figure (else the host checks it at each
        boundary)."""
        if self.cgroups is None:
            return None, None
        try:
            cgroup = self.cgroups.create(self.device, spec.id, spec.run)
        except OSError as exc:
            raise LaunchError(f"cannot make job {spec.id}'s cgroup: {exc.strerror}") from None
        caps = [
            cap for cap in (spec.host_mem, None if self.cuda else spec.mem_cap) if cap is not None
        ]
        unenforced = cgroup.limit(min(caps) if caps else None, spec.cpus)
        if unenforced:
            log.warning(
                "job %d: its cgroup cannot enforce %s here (its host checks its memory instead)",
                spec.id,
                " or ".join(unenforced),
            )
        # Only where the device figure is the binding limit is a kill there a device
        # shortage (at --host-mem's, the job fails as it always has).
        holds = (
            not self.cuda
            and spec.mem_cap is not None
            and min(caps) == spec.mem_cap
            and "its memory limit" not in unenforced
        )
        return cgroup, spec.mem_cap if holds else None

    # ----- exits and kills ------------------------------------------------------------
    def _reap(self) -> None:
        """Collect jobs whose process has exited. Whatever a job started dies with it (its
        process group, and its cgroup, which holds what left the group) before its exit is
        reported, so that a requeued run never overlaps the last one; the host never waits
        for that (a process stuck in the kernel would hold every other job up), it looks
        again at its next turns, and after ``_REAP_WAIT`` reports all the same and keeps
        killing what is left."""
        now = time.monotonic()
        for resident in list(self.residents.values()):
            if resident.exit_status is None:
                code = resident.process.poll()
                if code is None:
                    continue
                self._collect(resident, code, now)
            if not self._emptied(resident, now):
                continue
            del self.residents[resident.job_id]
            report = resident.exit_report()
            self.exited[resident.job_id] = report  # until a daemon acknowledges it
            self._tell(report)

    def _collect(self, resident: Resident, code: int, now: float) -> None:
        """Its process has exited: read what it said last, free its lane, kill its group."""
        self._set_up(resident.process)  # a failed set-up's words are in the pipe now
        if resident.channel is not None:
            # Its last messages (a final DONE, say), all of them: it sends no more. A
            # protocol error among them still ends the job as one.
            resident.channel.chunk = defaults.MAX_FRAME
            self.granter.from_worker(resident)
        if resident.channel is not None:
            self.granter.drop_channel(resident)
        resident.exit_status, resident.exited_at, resident.ended_wall = code, now, time.time()
        if self.terminals.job_ended(resident.job_id) and resident.kill_why is None:
            resident.kill_why, resident.detail = StopWhy.HANGUP, "its terminal was closed"
        if (
            code != 0
            and resident.shortage is None
            and resident.cgroup_cap is not None
            and resident.kill_why is None
            and resident.cgroup is not None
            and resident.cgroup.oom_kills()
        ):
            # The kernel killed it at its cgroup's limit: it held that much, and wanted more.
            resident.shortage = wire.Shortage(held=resident.cgroup_cap)
        self.granter.leave_lane(resident)
        kill_group(resident.process.pid, signal.SIGKILL)

    def _emptied(self, resident: Resident, now: float) -> bool:
        """Whether nothing of an exited job is left (killing what is, without waiting)."""
        cgroup = resident.cgroup
        if cgroup is None:
            return True
        if cgroup.kill(0.0):
            cgroup.remove()
            return True
        if now - resident.exited_at < _REAP_WAIT:
            return False
        log.warning(
            "job %d: processes left in %s after SIGKILL; killing them again",
            resident.job_id,
            cgroup.name,
        )
        self.lingering.append(cgroup)
        return True

    def _kill_lingering(self) -> None:
        for cgroup in list(self.lingering):
            if cgroup.kill(0.0):
                cgroup.remove()
                self.lingering.remove(cgroup)

    def kill(self, resident: Resident, why: StopWhy, grace: float | None = None) -> None:
        """SIGTERM to every process of the job now, SIGKILL after the kill wait (or
        ``grace``). A job whose process has exited already is ended as it ended."""
        if resident.exit_status is not None:
            return
        if resident.kill_deadline is not None and grace is None:
            return
        if resident.kill_why is None or why is StopWhy.PROTOCOL:
            resident.kill_why = why
        if resident.frozen:  # stopped processes must go on to see their signal
            self.freeze(resident, False)
        if self.terminals.has(resident.job_id):  # a terminal's job ends as a hang-up ends it
            self._signal_job(resident, signal.SIGHUP)  # (an interactive shell ignores TERM)
        self._signal_job(resident, signal.SIGTERM)
        resident.kill_deadline = time.monotonic() + (self.kill_grace if grace is None else grace)
        if grace == 0.0:
            self._signal_job(resident, signal.SIGKILL)

    def _signal_job(self, resident: Resident, signum: int) -> None:
        kill_group(resident.process.pid, signum)
        if resident.cgroup is None:
            return
        if signum == signal.SIGKILL:
            resident.cgroup.kill(0.0)
            return
        _send(resident.cgroup.pids(), signum)

    def _enforce_time_limits(self) -> None:
        now, wall = time.monotonic(), time.time()
        for resident in list(self.residents.values()):
            if resident.kill_deadline is not None or resident.exit_status is not None:
                continue
            if resident.suspended:
                continue  # its time limit does not run meanwhile
            ran = now - resident.started_at - resident.paused
            if resident.time_limit is not None and ran >= resident.time_limit:
                self.kill(resident, StopWhy.TIMEOUT)
            elif (
                resident.warning is not None
                and resident.time_limit is not None
                and ran >= resident.time_limit - resident.warning[1]
            ):
                self._warn(resident, *resident.warning)
                resident.warning = None  # once, as sbatch's
            elif resident.deadline is not None and wall >= resident.deadline:
                self.kill(resident, StopWhy.DEADLINE)

    def _watch_idle(self) -> None:
        """Interactive jobs' last activity (gq.exec.idleness), reported as it moves on; one
        idle for its --idle-timeout is ended, as Jupyter's culler ends an idle kernel. A
        suspended job's idle time does not run meanwhile, as its time limit does not."""
        now, wall = time.monotonic(), time.time()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + idleness.CHECK_EVERY
        for resident in list(self.residents.values()):
            if (
                not resident.interactive
                or resident.kill_deadline is not None
                or resident.exit_status is not None
            ):
                continue
            seen = (
                wall
                if resident.suspended
                else idleness.last_active(
                    resident.active_at,
                    self.terminals.last_used(resident.job_id),
                    resident.in_iteration,
                    wall,
                    resident.started_wall,
                )
            )
            if seen is not None and (resident.active_at is None or seen > resident.active_at):
                resident.active_at = seen
                if idleness.worth_reporting(resident.active_told, seen):
                    resident.active_told, resident.dirty = seen, True
            idle = idleness.idle_for(resident.active_at, resident.started_wall, wall)
            if resident.idle_timeout is not None and idle >= resident.idle_timeout:
                resident.detail = f"no activity for {format_duration(idle)}"
                log.info(
                    "job %d: idle for %.0f s, its --idle-timeout; ending it", resident.job_id, idle
                )
                self.kill(resident, StopWhy.IDLE)

    def _warn(self, resident: Resident, signum: int, _before: int, batch_only: bool) -> None:
        """sbatch's --signal: with B: to the job's main process (its batch shell); else to
        the job's steps, as Slurm sends it: the tasks srun started where the job has any,
        otherwise the main process (a Python script is its own step). Never to the processes
        a step forked for itself (DataLoader workers die of SIGUSR1, or run the handler they
        inherited in place of the script's), nor to srun, which would pass it on again."""
        main = resident.process.pid
        tasks: set[int] = set()
        if not batch_only:
            members = set(resident.cgroup.pids()) if resident.cgroup is not None else set()
            tasks = step_tasks(members or group_members(main))  # no cgroup: its group
        log.info(
            "job %d: signal %d before its time limit to %s",
            resident.job_id,
            signum,
            f"{len(tasks)} srun task(s)" if tasks else "its main process",
        )
        _send(tasks or {main}, signum)

    def _watch_host_memory(self) -> None:
        """Jobs whose --host-mem no cgroup holds (v2's memory controller not passed on to
        them, or no cgroup): every HOST_MEMORY_WATCH seconds, once the last readings are in,
        their watch (:mod:`gq.exec.memory_watch`) is asked to read what their processes
        hold; :meth:`_on_memory_readings` acts on what it reads."""
        now = time.monotonic()
        watch = self.memory_watch
        if now < self._memory_watch_at or (watch is not None and watch.busy):
            return
        self._memory_watch_at = now + defaults.HOST_MEMORY_WATCH
        watched = [
            Watched(r.job_id, r.run, r.host_mem_watched, r.cgroup, r.process.pid)
            for r in self.residents.values()
            if r.host_mem_watched is not None and r.kill_why is None and r.exit_status is None
        ]
        if not watched:
            return
        if watch is None:  # a thread only where some job needs one
            watch = self.memory_watch = MemoryWatch()
            self.selector.register(watch.wake, selectors.EVENT_READ, "memory")
        watch.ask(watched)

    def _on_memory_readings(self) -> None:
        """A job whose processes were read to hold more than its --host-mem is ended, failed
        as a kill at its cgroup's limit would fail it (Slurm's OverMemoryKill, where its
        cgroups do not hold memory); a reading of a run that has ended or is being ended
        meanwhile is dropped."""
        assert self.memory_watch is not None
        for reading in self.memory_watch.take():
            job = reading.job
            resident = self.residents.get(job.job_id)
            if (
                resident is None
                or resident.run != job.run
                or resident.kill_why is not None
                or resident.exit_status is not None
                or reading.held <= job.limit
            ):
                continue
            resident.detail = (
                f"over its --host-mem of {format_size(job.limit)} (its "
                f"processes held {format_size(reading.held)})"
            )
            log.warning("job %d: %s; ending it", resident.job_id, resident.detail)
            self.kill(resident, StopWhy.HOST_MEMORY, grace=0.0)

    def _enforce_kills(self) -> None:
        now = time.monotonic()
        for resident in self.residents.values():
            if (
                resident.kill_deadline is not None
                and now >= resident.kill_deadline
                and resident.exit_status is None
            ):
                self._signal_job(resident, signal.SIGKILL)

    def _shutdown(self) -> None:
        self.stopping = True
        for resident in list(self.residents.values()):
            self.kill(resident, StopWhy.SHUTDOWN)

    def report_soon(self) -> None:
        self._last_progress = -math.inf

    def _maybe_send_progress(self) -> None:
        now = time.monotonic()
        if self.daemon is None or now - self._last_progress < defaults.PROGRESS_PERIOD:
            return
        self._last_progress = now
        self.granter.read_leased_pages()
        # A job inside an iteration is reported each time: its attained time grows.
        changed = [r for r in self.residents.values() if r.dirty or r.in_iteration]
        for resident in changed:
            resident.dirty = False
        switches = [lane.switches for lane in self.lanes]
        if changed or switches != self._reported_switches:
            self._reported_switches = switches
            self._tell(wire.Progress([r.progress() for r in changed], switches))


def _lane_page(job_id: int) -> tuple[SharedPage | None, int | None]:
    """A new page to share with the job's worker; without one (out of memory or
    descriptors) the job runs as well, with a READY/GO exchange at every boundary."""
    try:
        return SharedPage.create()
    except OSError as exc:
        log.warning(
            "job %d: no page to share with its worker (%s); it runs without leases", job_id, exc
        )
        return None, None


def _send(pids, signum: int) -> None:
    """Signal each process that is still there to be signalled."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _open_snapshot(spec: wire.LaunchSpec) -> int | None:
    """The job's snapshot, opened by the host: the job's user cannot reach the spool."""
    if spec.snapshot is None:
        return None
    try:
        return spool.open_regular(spec.snapshot)
    except OSError as exc:
        raise LaunchError(
            f"cannot open job {spec.id}'s script snapshot: {exc.strerror}; submit the script again"
        ) from None


def _peer_uid(sock: socket.socket) -> int:
    cred = struct.Struct("3i")
    return cred.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, cred.size))[1]


def listen(state_dir: str, device: str):
    """Lock the device's host pidfile and bind its socket; AlreadyRunning if a live host
    holds them. Returns the pidfile (keep it open) and the listening socket."""
    pidfile_path, socket_path = host_paths(state_dir, device)
    fd = os.open(pidfile_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    pidfile = os.fdopen(fd, "r+")
    try:
        fcntl.flock(pidfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pidfile.close()
        raise AlreadyRunning(None) from None
    pidfile.seek(0)
    pidfile.truncate()
    pidfile.write(f"{os.getpid()} {HOST_VERSION}\n")
    pidfile.flush()
    listener = bind_private(socket_path)
    listener.listen(8)
    listener.setblocking(False)
    return pidfile, listener


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="gq-host", description="gq execution host (started by the daemon)"
    )
    parser.add_argument("--device", required=True)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--memory", type=int, help="the device's memory in bytes, where known")
    parser.add_argument("--state-dir", required=True, help="where its socket and pidfile live")
    parser.add_argument("--kill-grace", type=float, default=defaults.KILL_WAIT)
    parser.add_argument("--cgroup", choices=cgroups.KINDS, default=defaults.CGROUP)
    parser.add_argument("--scope", required=True, help="this gq instance's cgroup tag")
    parser.add_argument("--terminals", help="where interactive jobs' terminal sockets go")
    parser.add_argument(
        "--attach-wait",
        type=float,
        default=defaults.ATTACH_WAIT,
        help="seconds a started interactive job waits for its gq",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    gq_log.configure(f"host[{args.device}]")
    try:
        pidfile, listener = listen(args.state_dir, args.device)
    except AlreadyRunning:
        log.error("another execution host of %s is running", args.device)
        raise SystemExit(defaults.ALREADY_RUNNING_EXIT) from None
    backend = cgroups.detect(args.cgroup, args.scope)
    log.info(
        "jobs' processes are kept in %s",
        f"cgroup {backend.kind} hierarchies"
        if backend is not None
        else "process groups (no cgroup hierarchy to use)",
    )
    try:
        Host(
            args.device,
            args.cuda,
            args.lanes,
            listener,
            args.kill_grace,
            backend,
            args.memory,
            args.terminals,
            args.attach_wait,
        ).run()
    finally:
        os.unlink(host_paths(args.state_dir, args.device)[1])
        pidfile.close()


if __name__ == "__main__":
    main()
