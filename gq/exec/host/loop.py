"""Execution host: one process per device. Starts each job as its submitter and keeps its
worker resident; what happens at iteration boundaries, the grant of each lane's next
iteration, is :mod:`gq.exec.lane.granting`'s (a suspended job's lane too). This owns the loop and
the daemon's link; the jobs' processes (launches, time limits, freezing, kills and exits) are
in ``job_processes.py``, the watch on their --host-mem in ``memory_watch.py``,
and the host's start-up (its command line, pidfile and socket) in :mod:`gq.exec.host.startup`.

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

import logging
import math
import os
import selectors
import signal
import socket
import struct
import time
from collections.abc import Callable

import msgspec

from gq import defaults, policies
from gq.errors import LaunchError
from gq.exec.cgroups import job_cgroups as cgroups
from gq.exec.host import messages as wire
from gq.exec.host.checkpoint import open_checkpoints
from gq.exec.host.job_processes import JobProcesses
from gq.exec.host.memory_moves import MemoryMoves
from gq.exec.host.memory_watch import HostMemoryLimits
from gq.exec.host.messages import HOST_VERSION, StopWhy
from gq.exec.host.process_groups import kill_group
from gq.exec.host.spawn import JobProcess
from gq.exec.host.terminal import Terminal, Terminals
from gq.exec.job.rank_progress import RankProgress
from gq.exec.lane import packing
from gq.exec.lane.granting import Granter
from gq.exec.lane.packing_moves import LanePacking
from gq.exec.lane.residents import Lane, Resident
from gq.exec.protocol import TO_HOST, Channel
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.host")
HOUSEKEEPING_PERIOD = defaults.HOUSEKEEPING_PERIOD


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
        progress_dir: str | None = None,
        pack: bool = False,
        checkpoint: str = "auto",
        mps: bool = False,  # under MPS, jobs side by side are one user's (gq.exec.lane.packing)
    ):
        self.device = device
        self.cuda = cuda
        # --lanes auto: as many lanes as may run at once, used as measurement says
        # (gq.exec.lane.packing); the daemon admits to the device as one lane.
        shared = packing.most_lanes(cuda) if pack else max(1, lanes)
        self.lanes = [Lane(i) for i in range(shared)]
        self.listener = listener
        self.daemon: Channel | None = None  # the daemon now connected, if any
        self.greeted = False  # it said hello: until then it is sent nothing but the state
        self.policy_name = ("fifo", "always", policies.DEFAULT_QUANTUM)
        self.residents: dict[int, Resident] = {}
        self.exited: dict[int, wire.Exited] = {}  # exit reports no daemon has acknowledged
        self.selector = selectors.DefaultSelector()
        self.terminals = Terminals(terminal_dir, attach_wait, self.selector)  # gq run --pty's
        self.rank_progress = RankProgress(progress_dir, device)  # plain processes' steps
        self.stopping = False  # ending every job, then exiting
        self.draining = False  # taking no new job, exiting once the last one has ended
        self.child_exited = False
        self._next_housekeeping = 0.0
        self._last_progress = 0.0
        self._reported_switches: list[int] = []
        self.granter = Granter(
            self.lanes,
            self.residents,
            self.selector,
            self,
            cuda,
            policies.make(*self.policy_name),
            None if memory is None else memory // (1 if pack else len(self.lanes)),
        )
        self.packing = (
            LanePacking(self.lanes, self.granter, packing.Packer(len(self.lanes), memory, mps=mps))
            if pack
            else None
        )
        self._reported_packing: tuple | None = None
        self.jobs = JobProcesses(
            device,
            cuda,
            self.lanes,
            self.residents,
            self.selector,
            self.terminals,
            self.granter,
            self._report_exit,
            kill_grace,
            cgroup_backend,
            self.rank_progress,
        )
        self.memory = MemoryMoves(
            open_checkpoints(checkpoint, cuda), self.residents, self, self.granter
        )
        self.host_memory = HostMemoryLimits(self.residents, self.selector, self.jobs.kill)
        self._from_daemon_handlers: dict[type, Callable] = {
            wire.Hello: self._on_hello,
            wire.Launch: self._on_launch,
            wire.Kill: self._on_kill,
            wire.Ack: self._on_ack,
            wire.Update: self._on_update,
            wire.Cap: self._on_cap,
            wire.SetPolicy: self._on_policy,
            wire.Shares: lambda message: self.granter.set_shares(message.users),
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
                    self.jobs.reap,
                    self.jobs.enforce_time_limits,
                    self.jobs.enforce_kills,
                    self.jobs.hang_up_untaken,
                    self.granter.close_given_back,
                    self.granter.schedule_waiting_lanes,
                    self.jobs.kill_lingering,
                    self.host_memory.watch,
                    self.jobs.watch_idle,
                    self._read_rank_progress,
                    self.memory.tick,
                    *((self.packing.tick,) if self.packing else ()),
                ):
                    self._isolated(chore)
            self._isolated(self._maybe_send_progress)
        self.terminals.close()
        self.memory.close()
        self.jobs.close()
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
            self.host_memory.on_readings()
        elif isinstance(data, Resident):
            self.granter.from_worker(data)
        elif isinstance(data, JobProcess):
            self.jobs.set_up(data)
        elif isinstance(data, Terminal):
            if self.terminals.on_event(data, data.job in self.residents):
                self.jobs.hang_up(data.job, data.run, "its terminal was closed")

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

    def _read_rank_progress(self) -> None:
        self.rank_progress.read_all(self.residents)

    def _report_exit(self, report: wire.Exited) -> None:
        """A job has ended and nothing of it is left: its report is kept until a daemon
        acknowledges it."""
        self.exited[report.job] = report
        self._tell(report)

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
            or resident.memory.asked == message.suspended
            or (message.suspended and resident.kill_deadline is not None)
        ):
            return  # gone, as asked already, or being ended: its SIGTERM must be seen
        self.memory.ask(resident, message.suspended, message.host_room)

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

    def _on_policy(self, message: wire.SetPolicy) -> None:
        try:
            policy = policies.make(message.name, message.fill, message.quantum)
        except ValueError as exc:
            log.warning("ignoring policy change: %s", exc)
            return
        self.policy_name = (message.name, message.fill, message.quantum)
        self.granter.set_policy(policy, message.max_hold)

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
            resident = self.jobs.start(spec)
        except LaunchError as exc:
            self._tell(wire.LaunchFailed(spec.id, spec.run, str(exc)))
            return
        self.residents[spec.id] = resident
        self.lanes[resident.lane].residents.append(resident)
        if resident.channel is not None:
            self.selector.register(resident.channel.sock, selectors.EVENT_READ, resident)
        process = resident.process
        if process.setup_pipe is not None:  # open until its exec, which is still ahead
            self.selector.register(process.setup_pipe, selectors.EVENT_READ, process)
        self._tell(wire.Started(spec.id, resident.run, resident.process.pid))

    def _shutdown(self) -> None:
        self.stopping = True
        for resident in list(self.residents.values()):
            self.kill(resident, StopWhy.SHUTDOWN)

    # ----- what the lanes ask of their host (gq.exec.lane.granting.Processes) ----------------
    def kill(self, resident: Resident, why: StopWhy, grace: float | None = None) -> None:
        self.jobs.kill(resident, why, grace)

    def freeze(self, resident: Resident, frozen: bool) -> None:
        self.jobs.freeze(resident, frozen)

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
        shared = self.packing.report() if self.packing else None
        # (records compare by identity: by their fields here)
        told = None if shared is None else msgspec.structs.astuple(shared)
        if changed or switches != self._reported_switches or told != self._reported_packing:
            self._reported_switches, self._reported_packing = switches, told
            self._tell(wire.Progress([r.progress() for r in changed], switches, shared))


def _peer_uid(sock: socket.socket) -> int:
    cred = struct.Struct("3i")
    return cred.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, cred.size))[1]
