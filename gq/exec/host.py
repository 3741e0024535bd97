"""Execution host: one process per device. Keeps workers resident and, at every iteration
boundary, grants the next iteration of each lane to ``policy.pick(...)``.

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
from gq.exec import cgroups, handover
from gq.exec import protocol as wire
from gq.exec.cgroups import JobCgroup
from gq.exec.lease import Figures, LoanPage, SharedPage, implausible
from gq.exec.protocol import FROM_WORKER, HOST_VERSION, TO_HOST, Channel, StopWhy, host_paths
from gq.exec.memory_watch import MemoryWatch, Watched
from gq.exec.residents import Lane, Loan, Resident, ready_to_grant
from gq.exec.spawn import (JobProcess, group_members, is_srun_shim, kill_group,
                           start_as_submitter)
from gq.exec import lanes as lane_rule
from gq.policies.base import JobView
from gq.queue import spool
from gq.units import format_size
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.host")
HOUSEKEEPING_PERIOD = defaults.HOUSEKEEPING_PERIOD
# How long an exited job's leftovers may take to die before its exit is reported all the
# same (they are killed on after); the host never waits for them meanwhile.
_REAP_WAIT = 1.0


class Host:
    def __init__(self, device: str, cuda: bool, lanes: int, listener: socket.socket,
                 kill_grace: float, cgroup_backend: cgroups.Cgroups | None = None):
        self.device = device
        self.cuda = cuda
        self.lanes = [Lane(i) for i in range(max(1, lanes))]
        self.listener = listener
        self.daemon: Channel | None = None  # the daemon now connected, if any
        self.greeted = False  # it said hello: until then it is sent nothing but the state
        self.kill_grace = kill_grace
        self.cgroups = cgroup_backend
        self.policy = policies.make("fifo")
        self.policy_name = ("fifo", "always", policies.DEFAULT_QUANTUM)
        self.residents: dict[int, Resident] = {}
        self.exited: dict[int, wire.Exited] = {}  # exit reports no daemon has acknowledged
        self.lingering: list[JobCgroup] = []  # killed, not empty yet: killed again until so
        self.selector = selectors.DefaultSelector()
        self.stopping = False  # ending every job, then exiting
        self.draining = False  # taking no new job, exiting once the last one has ended
        self.child_exited = False
        self._next_housekeeping = 0.0
        self._last_progress = 0.0
        self._memory_watch_at = 0.0  # monotonic: when _watch_host_memory asks again
        self.memory_watch: MemoryWatch | None = None  # made for the first job it watches
        self._reported_switches: list[int] = []
        self._handovers_armed = 0  # numbers the hand-overs' pipes
        self._loans_made = 0  # numbers the loans
        self._from_daemon_handlers: dict[type, Callable] = {
            wire.Hello: self._on_hello, wire.Launch: self._on_launch,
            wire.Kill: self._on_kill, wire.Ack: self._on_ack, wire.Update: self._on_update,
            wire.Cap: self._on_cap,
            wire.SetPolicy: self._on_policy, wire.Shutdown: lambda _: self._shutdown(),
            wire.Drain: self._on_drain, wire.Suspend: self._on_suspend,
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
                for chore in (self._reap, self._enforce_time_limits, self._enforce_kills,
                              self._close_given_back, self._schedule_waiting_lanes,
                              self._kill_lingering, self._watch_host_memory):
                    self._isolated(chore)
            self._isolated(self._maybe_send_progress)
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
            self._from_worker(data)
        elif isinstance(data, JobProcess):
            self._set_up(data)

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
            self._end_for_protocol(resident, f"the execution host failed on its message "
                                             f"({type(exc).__name__})")

    def _timeout(self) -> float:
        timeout = 0.25 if self.residents else defaults.PROGRESS_PERIOD
        if any(r.exit_status is not None or r.closing for r in self.residents.values()):
            timeout = HOUSEKEEPING_PERIOD  # an exited job's leftovers, a lane asked back
        for lane in self.lanes:
            if lane.holder is not None or not ready_to_grant(lane):
                continue
            if lane.kept_until is not None:
                timeout = min(timeout, max(0.0, lane.kept_until - time.monotonic()))
            else:
                timeout = min(timeout, 0.01)  # the policy keeps the lane idle; re-ask soon
        return timeout

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
        if (resident is None or resident.run != message.run or resident.exit_status is not None
                or resident.mem_cap == message.mem_cap):
            return
        if not self.cuda:
            log.warning("job %d: a device-memory cap is for a GPU's jobs; ignored here",
                        resident.job_id)
            return
        resident.mem_cap = message.mem_cap
        resident.cap_unsent = resident.channel is not None
        if self._armed_to_follow(resident):  # its cap goes with a Go, not a hand-over
            self._revoke(self.lanes[resident.lane])
        if resident.leased:  # the cap goes with a Go: the next boundary asks for one
            self._end_lease(resident)
            self._schedule(self.lanes[resident.lane])
        log.info("job %d: capped at %d bytes of device memory", resident.job_id,
                 message.mem_cap)

    def _on_suspend(self, message: wire.Suspend) -> None:
        resident = self.residents.get(message.job)
        if resident is None or resident.exit_status is not None \
                or resident.suspended == message.suspended \
                or (message.suspended and resident.kill_deadline is not None):
            return  # gone, as asked already, or being ended: its SIGTERM must be seen
        now = time.monotonic()
        lane = self.lanes[resident.lane]
        if message.suspended and self._armed_to_follow(resident) and not self._revoke(lane):
            # It runs on its grant before its predecessor's DONE: suspended inside an
            # iteration, it goes on with it once granted the lane again.
            resident.thaw_on_grant = True
        if resident.leased:  # whether it is inside an iteration decides what follows
            self._end_lease(resident)
        if message.suspended:
            resident.closing = False  # an iteration it is inside is measured by the host now
            resident.suspended, resident.suspended_at = True, now
            # Inside an iteration (the holder, or a loan's job found inside one beside it):
            # the lane goes to others.
            if lane.holder is resident or resident.state == "running":
                resident.attained += max(0.0, now - resident.granted_at)
                if lane.holder is resident:
                    lane.holder = None
                resident.state, resident.thaw_on_grant = "ready", True
            self._stop_processes(resident, True)
            log.info("job %d suspended", resident.job_id)
        else:
            resident.suspended = False
            resident.paused += now - (resident.suspended_at or now)
            resident.suspended_at = None
            if not resident.thaw_on_grant:
                self._stop_processes(resident, False)
            log.info("job %d resumed", resident.job_id)
        resident.dirty = True
        self._schedule(lane)

    def _stop_processes(self, resident: Resident, stop: bool) -> None:
        """Freeze (or thaw) the job: its cgroup's freezer, else SIGSTOP (SIGCONT)."""
        resident.frozen = stop
        if resident.cgroup is None or not resident.cgroup.freeze(stop):
            self._signal_job(resident, signal.SIGSTOP if stop else signal.SIGCONT)

    def _on_policy(self, message: wire.SetPolicy) -> None:
        try:
            self.policy = policies.make(message.name, message.fill, message.quantum)
        except ValueError as exc:
            log.warning("ignoring policy change: %s", exc)
            return
        self.policy_name = (message.name, message.fill, message.quantum)
        for lane in self.lanes:
            self._schedule(lane)

    def _on_drain(self, _message: wire.Drain) -> None:
        log.info("draining: no new jobs; exiting after the last one")
        self.draining = True

    def _on_kill(self, message: wire.Kill) -> None:
        resident = self.residents.get(message.job)
        if resident is None:
            return
        if message.why is StopWhy.MOVE and (resident.granted_at or resident.iterations):
            return  # it has been granted an iteration since the daemon looked: it stays
        self._kill(resident, message.why)

    def _state(self) -> wire.State:
        """Everything a daemon that (re)connects must know."""
        self._read_leased_pages()
        return wire.State(version=HOST_VERSION, pid=os.getpid(), device=self.device,
                          lanes=len(self.lanes), policy=list(self.policy_name),
                          draining=self.draining,
                          residents=[r.resident_state() for r in self.residents.values()],
                          exited=list(self.exited.values()))

    def _on_launch(self, message: wire.Launch) -> None:
        spec = message.job
        if self.draining or self.stopping:
            self._tell(wire.LaunchFailed(spec.id, spec.run, "its execution host is being "
                                                            "replaced; requeued"))
            return
        if spec.id in self.residents:
            log.warning("job %d is resident already; launch of run %d refused", spec.id,
                        spec.run)
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
        self.selector.register(resident.process.setup_pipe, selectors.EVENT_READ,
                               resident.process)
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
        worker_end = host_end = page = page_fd = None
        try:
            if script is not None:
                fds[wire.SCRIPT_FD] = script
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
            raise
        finally:
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
            lane = min(self.lanes, key=lambda l: len(l.residents)).index
        return Resident(
            job_id=spec.id, run=spec.run, user=spec.user, priority=spec.priority,
            submit_time=spec.submit_time, declared_total=spec.steps_total, lane=lane,
            process=process, channel=channel, started_at=time.monotonic(),
            started_wall=time.time(), cgroup=cgroup, time_limit=spec.time_limit,
            deadline=spec.deadline,
            warning=(spec.warn_signal, spec.warn_before, spec.warn_main)
            if spec.warn_signal is not None else None,
            mem_cap=spec.mem_cap, cgroup_cap=cgroup_cap, probing=spec.probe, page=page,
            host_mem_watched=spec.host_mem if cgroup is None or not cgroup.memory_limited
            else None,
        )

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
        caps = [cap for cap in (spec.host_mem, None if self.cuda else spec.mem_cap)
                if cap is not None]
        unenforced = cgroup.limit(min(caps) if caps else None, spec.cpus)
        if unenforced:
            log.warning("job %d: its cgroup cannot enforce %s here (its host checks its "
                        "memory instead)", spec.id, " or ".join(unenforced))
        # Only where the device figure is the binding limit is a kill there a device
        # shortage (at --host-mem's, the job fails as it always has).
        holds = (not self.cuda and spec.mem_cap is not None and min(caps) == spec.mem_cap
                 and "its memory limit" not in unenforced)
        return cgroup, spec.mem_cap if holds else None

    # ----- worker messages: the hot path ----------------------------------------------
    def _from_worker(self, resident: Resident) -> None:
        channel = resident.channel
        assert channel is not None
        if self._armed_to_follow(resident) and not self._revoke(self.lanes[resident.lane]):
            self._defer(resident)
            return
        for message in channel.receive():
            now = time.monotonic()
            kind = type(message)
            if kind is wire.Ready:
                self._on_ready(resident, now)
            elif kind is wire.Done:
                self._on_done(resident, message, now)
            elif kind is wire.Total:
                resident.declare_total(message.steps)
            elif kind is wire.StepsTaken:
                resident.record_steps(message.steps)
            elif kind is wire.OutOfMemory:
                resident.shortage = wire.Shortage(message.held, message.wanted)
            elif kind is wire.Finished:
                self._leave_lane(resident)
            if resident.channel is not channel:
                return  # dropped meanwhile (its grant could not be sent, say)
        if channel.error:
            self._end_for_protocol(resident, f"its worker sent {channel.error}")
        elif channel.closed:
            self._drop_channel(resident)

    def _end_for_protocol(self, resident: Resident, detail: str) -> None:
        """A worker that breaks the protocol loses its job, at once, and nothing else."""
        log.warning("job %d: %s; ending it", resident.job_id, detail)
        resident.detail = detail[:defaults.MAX_TEXT]
        self._drop_channel(resident)
        self._kill(resident, StopWhy.PROTOCOL, grace=0.0)

    def _on_ready(self, resident: Resident, now: float) -> None:
        resident.unbooked = False  # (its iteration outside its grants is over)
        if resident.leased:  # it saw the host wants the lane back, in its gap
            self._end_lease(resident)
        if resident.closing:  # it missed the request at its iteration's end: that end first
            self._close_iteration(resident, ended=True)
        elif (resident.state == "running" and resident.page is not None
              and resident.page.wanted() and self.lanes[resident.lane].holder is resident):
            # The same, where a suspend took over the measuring of that iteration.
            self._on_done(resident, wire.Done(resident.steps_done, resident.mem_persistent,
                                              resident.mem_peak), now)
        if resident.channel is None or resident.state != "idle":
            return  # ended meanwhile, holds the lane already, or asked already
        if resident.released_at is not None:
            resident.gaps += 1
            resident.gap_total += max(0.0, now - resident.released_at)
        resident.asks_for_iteration()
        resident.state = "ready"
        self._schedule(self.lanes[resident.lane])

    def _on_done(self, resident: Resident, message: wire.Done, now: float) -> None:
        lane = self.lanes[resident.lane]
        if resident.leased:  # asked back, it gave the lane at its iteration's end
            self._end_lease(resident)
            if lane.holder is not resident:
                self._schedule(lane)
                return
        if resident.closing:
            self._close_iteration(resident, ended=True)
            return
        if resident.thaw_on_grant:  # its iteration ended as it was being suspended
            resident.thaw_on_grant = False
            resident.iterations += 1
            resident.record_steps(message.steps)
            resident.state, resident.released_at = "idle", now
            if not resident.suspended:
                self._stop_processes(resident, False)
            return
        if lane.holder is not resident:
            return
        resident.iterations += 1
        resident.attained += max(0.0, now - resident.granted_at)
        if resident.iterations == 1:
            resident.first_iteration = resident.attained
        resident.record_steps(message.steps)
        resident.mem_persistent = message.mem_persistent
        resident.mem_peak = message.mem_peak
        resident.dirty = True
        self._check_memory(resident)
        resident.state = "idle"
        resident.released_at = now
        lane.holder = None
        self._schedule(lane)

    def _check_memory(self, resident: Resident) -> None:
        """After an iteration: a job over its memory cap where no cgroup holds it (the cpu
        and emulated devices without one) has run out of memory, and is ended before its
        neighbours pay for it; a probed job's first figures go to the daemon at once."""
        peak = resident.mem_peak
        if peak is None:
            return
        if (resident.mem_cap is not None and not self.cuda and resident.cgroup_cap is None
                and peak > resident.mem_cap):
            log.warning("job %d: holds %d bytes, over its cap of %d; ending it",
                        resident.job_id, peak, resident.mem_cap)
            resident.shortage = wire.Shortage(held=peak)
            self._kill(resident, StopWhy.MEMORY, grace=0.0)
        elif resident.probing and resident.iterations >= defaults.PROBE_ITERATIONS:
            resident.probing = False
            self._last_progress = -math.inf

    def _schedule(self, lane: Lane) -> None:
        """Grant a free lane's next iteration, or keep it free, as :mod:`gq.exec.lanes`
        decides (the simulator predicts with the same rule). A job alone on its lane gets
        it with a lease, ended as soon as another job is ready for it; two jobs that fit in
        each other's gaps get it lent (a lease each, under one loan), until either asks or
        anything changes. While a job holds the lane, the job it goes to next is told in
        advance (a hand-over)."""
        lane.kept_until = None
        loan = lane.loan
        if loan is not None:
            if loan.recalling:
                return
            if not self._loan_stands(lane, loan) and lane.loan is loan:
                self._recall(lane)
            if lane.loan is not None:
                return
        if lane.holder is None and any(r.closing and r.state == "running"
                                       for r in lane.residents):
            return  # both of a loan's jobs were inside an iteration (its token given twice)
        holder = lane.holder
        if holder is not None and not holder.leased:
            self._prepare_handover(lane, holder)
            return
        ready = ready_to_grant(lane)
        if holder is not None and ready:
            self._end_lease(holder)
        if lane.holder is not None:
            return
        if lane.armed is not None and self._settle(lane):
            return  # the holder's successor has the lane, as armed
        if not ready:
            return
        decision = self._decide(lane, ready, time.monotonic())
        if isinstance(decision, lane_rule.KeepFor):
            lane.kept_until = decision.until
            return
        if decision is None:
            return
        chosen = self.residents[decision.job.id]
        if chosen.channel is None:
            return
        shared = self.cuda and len(lane.residents) > 1
        if chosen.thaw_on_grant:  # resumed inside its iteration: it goes on with the lane
            chosen.thaw_on_grant = False
            self._stop_processes(chosen, False)
        elif chosen.channel.send(wire.Go(
                empty_cache=shared, mem_cap=chosen.mem_cap if chosen.cap_unsent else None,
                lease=self._lease(chosen) or self._lend(lane, chosen))):
            chosen.cap_unsent = False
        else:
            log.warning("job %d's worker hung up before its grant; the lane goes on",
                        chosen.job_id)
            self._drop_channel(chosen)  # its exit is reaped and reported as usual
            return
        self._granted(lane, chosen)
        if not chosen.leased:  # another job waits: who follows it, ahead
            self._prepare_handover(lane, chosen)

    def _decide(self, lane: Lane, ready: list[Resident],
                now: float) -> lane_rule.Grant | lane_rule.KeepFor | None:
        views, in_gaps = self._lane_views(lane)
        return lane_rule.next_step(self.policy, [views[r.job_id] for r in ready],
                                   list(views.values()), in_gaps, now)

    def _lane_views(self, lane: Lane) -> tuple[dict[int, JobView], list[lane_rule.Awaited]]:
        """The residents as policies see them, each made once (a suspended job counts for
        none), and those in their gaps the lane may be kept for."""
        views = {r.job_id: r.view() for r in lane.residents if not r.suspended}
        in_gaps = [awaited for r in lane.residents
                   if r.state == "idle" and not r.suspended and r.released_at is not None
                   and (awaited := lane_rule.awaited(views[r.job_id], r.released_at,
                                                     r.mean_gap))]
        return views, in_gaps

    def _granted(self, lane: Lane, chosen: Resident) -> None:
        chosen.state = "running"
        chosen.granted_at = time.monotonic()
        chosen.handover_messages = 0
        chosen.dirty = True  # the daemon hears of the grant with the next progress
        lane.holder = None if lane.loan is not None else chosen  # lent: the token says
        if lane.last_job not in (None, chosen.job_id):
            lane.switches += 1
        lane.last_job = chosen.job_id

    # ----- hand-overs (gq.exec.handover) ----------------------------------------------
    def _prepare_handover(self, lane: Lane, holder: Resident) -> None:
        """While ``holder`` is inside an iteration: arm a hand-over to the job the lane
        goes to at its release however long the iteration lasts (from some point on: a
        release before it goes through the host), or take back one armed for a job the lane
        would no longer go to, or not from the point armed."""
        successor, after = None, 0.0
        ready = ready_to_grant(lane)
        if (ready and holder.page is not None and holder.channel is not None
                and not holder.closing and not holder.suspended):
            views, in_gaps = self._lane_views(lane)
            held = views.pop(holder.job_id)
            armed = lane.armed
            follows = lane_rule.hand_over(
                self.policy, [views[r.job_id] for r in ready], list(views.values()), in_gaps,
                held, holder.granted_at, time.monotonic(),
                None if armed is None else (armed.successor, armed.after))
            if follows is not None:
                successor, after = self.residents[follows.job.id], follows.after
        if successor is not None and (successor.page is None or successor.channel is None
                                      or successor.thaw_on_grant or successor.cap_unsent):
            successor = None  # its grant must come with a Go
        armed = lane.armed
        if armed is not None:
            if armed.successor == getattr(successor, "job_id", None) and armed.after == after:
                return  # it still holds
            if not self._revoke(lane):
                return  # too late: the lane is the successor's at the holder's release
        if successor is None:
            return
        pipe = lane.pipes.pop((holder.job_id, successor.job_id), None) \
            or self._deliver(holder, successor)
        if pipe is None:
            return
        if not handover.arm(pipe, holder.page, after):
            handover.close(pipe)
            return
        lane.armed = handover.Armed(pipe, holder.job_id, successor.job_id, after)
        # While it waits, the successor is sent the pipe for the turn after this one.
        if (successor.job_id, holder.job_id) not in lane.pipes:
            ahead = self._deliver(successor, holder)
            if ahead is not None:
                lane.pipes[successor.job_id, holder.job_id] = ahead

    def _deliver(self, holder: Resident, successor: Resident) -> handover.Pipe | None:
        """A new pipe from ``holder`` to ``successor`` (see :mod:`gq.exec.handover`), unless
        either has been sent its share of hand-over messages since its last grant."""
        if (holder.channel is None or successor.channel is None
                or max(holder.handover_messages, successor.handover_messages)
                >= defaults.HANDOVER_MESSAGES_PER_GRANT):
            return None
        holder.handover_messages += 1
        successor.handover_messages += 1
        self._handovers_armed += 1
        return handover.deliver(self._handovers_armed, holder.channel, successor.channel,
                                empty_cache=self.cuda)

    def _forget_pipes(self, lane: Lane, job_id: int) -> None:
        for pair in [pair for pair in lane.pipes if job_id in pair]:
            handover.close(lane.pipes.pop(pair))

    def _settle(self, lane: Lane) -> bool:
        """The lane's holder has released it (or gone): the armed successor has it if it
        has taken its grant already (True); else its grant is taken back and the lane is
        granted as usual (to it again, with a Go, if the policy still picks it). A grant
        taken where the holder released before the point armed from is the successor's
        only if the decision now grants it anyway: else it runs outside its grants."""
        armed = lane.armed
        assert armed is not None
        lane.armed = None
        successor = self.residents.get(armed.successor)
        usable = (successor is not None and successor.channel is not None
                  and successor in lane.residents and successor.state == "ready"
                  and not successor.suspended and not successor.thaw_on_grant
                  and not successor.cap_unsent)  # else its grant comes the usual way
        kept = handover.settle(armed, self._page_of(armed.holder))
        self._undefer(armed)
        if not (kept and usable):
            return False
        holder = self.residents.get(armed.holder)
        if holder is not None and holder.released_at is not None \
                and holder.granted_at <= holder.released_at < armed.after \
                and not self._grants_now(lane, successor):
            # Its Done read before the point, and the lane is not the successor's now (one
            # of the two woke or took early): the successor runs outside its grants, booked
            # nothing, and is granted nothing before it asks again.
            log.warning("job %d's hand-over to job %d was taken before its point; the "
                        "lane is granted as usual", holder.job_id, successor.job_id)
            successor.state, successor.released_at, successor.unbooked = "idle", None, True
            return False
        self._granted(lane, successor)
        self._prepare_handover(lane, successor)
        return True

    def _grants_now(self, lane: Lane, job: Resident) -> bool:
        """Whether the free lane's decision now is to grant ``job``."""
        decision = self._decide(lane, ready_to_grant(lane), time.monotonic())
        return isinstance(decision, lane_rule.Grant) and decision.job.id == job.job_id

    def _revoke(self, lane: Lane) -> bool:
        """Take the armed successor's grant back (the host's pick has changed, say): True
        if taken back; False if the successor has taken it, and runs on it already (the
        lane is still its holder's until the holder's DONE, and then the successor's)."""
        armed = lane.armed
        assert armed is not None
        if not handover.take_back(armed, self._page_of(armed.holder)):
            return False
        lane.armed = None
        self._undefer(armed)
        return True

    def _armed_to_follow(self, resident: Resident) -> bool:
        armed = self.lanes[resident.lane].armed
        return armed is not None and armed.successor == resident.job_id

    def _defer(self, resident: Resident) -> None:
        """The successor runs on its grant, and speaks, before the host has heard its
        predecessor release the lane: what it says is read once the hand-over is settled
        (its predecessor's DONE, most often already sent: read that first)."""
        lane = self.lanes[resident.lane]
        holder = lane.holder
        if holder is not None and holder.channel is not None:
            self._from_worker(holder)
            if lane.armed is None or lane.armed.successor != resident.job_id:
                return  # settled: its socket polls readable again
        armed = lane.armed
        if armed is not None and not armed.deferred and resident.channel is not None:
            self.selector.unregister(resident.channel.sock)
            armed.deferred = True

    def _undefer(self, armed: handover.Armed) -> None:
        successor = self.residents.get(armed.successor)
        if armed.deferred and successor is not None and successor.channel is not None:
            self.selector.register(successor.channel.sock, selectors.EVENT_READ, successor)
        armed.deferred = False

    def _page_of(self, job_id: int) -> SharedPage | None:
        resident = self.residents.get(job_id)
        return None if resident is None else resident.page

    def _lease(self, resident: Resident) -> bool:
        """Whether the job's next grant is a lease, and if so the page made ready for it. A
        lease of its own is for a job alone on its lane: lane-mates that take turns would
        end each other's at every switch (two may be lent the lane instead: _lend)."""
        page = resident.page
        alone = all(other is resident or other.suspended or other.channel is None
                    for other in self.lanes[resident.lane].residents)
        if page is None or not alone or not self._leasable(resident):
            return False
        figures = page.read()
        if figures is None:
            return False
        self._begin_lease(resident, figures, 0, time.monotonic(), inside=True)
        return True

    @staticmethod
    def _begin_lease(resident: Resident, figures: Figures, loan: int, started: float,
                     inside: bool) -> None:
        """Make the job's page ready for a lease under ``loan`` (0: one of its own), begun
        at ``started`` with the job's page as ``figures``: its semaphore the host's (the
        grantee's, ``inside`` an iteration), or given, where the job is in its gap, once
        the loan is named (a job that takes it reads the loan after); nothing wanted."""
        page = resident.page
        assert page is not None
        page.drain()
        page.lend(loan)
        page.want(False)
        if not inside:
            page.give()
        resident.leased, resident.lease_started = True, started
        resident.lease_base = resident.page_seen = figures
        resident.lease_in_iteration, resident.page_unread = inside, None

    def _leasable(self, resident: Resident) -> bool:
        """Whether the job may cross boundaries without a message: not where the host
        checks its figures at every boundary."""
        return (resident.page is not None and not resident.probing
                and not resident.cap_unsent
                and not (resident.mem_cap is not None and not self.cuda
                         and resident.cgroup_cap is None))

    # ----- a lane lent to two jobs (gq.exec.lease) ---------------------------------------
    def _lend(self, lane: Lane, chosen: Resident) -> bool:
        """Whether the chosen job's grant starts a loan: the lane lent to it and its one
        lane-mate, in its gap, where they meet none of the policy's choices
        (:func:`gq.exec.lanes.lendable`). Both are sent the loan's page; the grantee holds
        its token, and the mate is offered its lease on its page and takes it up at its
        next acquire."""
        live = [r for r in lane.residents if not r.suspended and r.channel is not None]
        if len(live) != 2 or not any(r is chosen for r in live):
            return False
        mate = live[0] if live[1] is chosen else live[1]
        members = (chosen, mate)
        if (mate.state != "idle" or mate.unbooked or mate.closing or mate.leased
                or mate.thaw_on_grant
                or lane.unlendable == {chosen.job_id, mate.job_id}
                or not all(self._leasable(m) for m in members)
                # a job whose socket the host's messages fill up is sent no more
                or max(m.handover_messages for m in members)
                >= defaults.HANDOVER_MESSAGES_PER_GRANT
                or not lane_rule.lendable(self.policy, chosen.view(), mate.view())):
            return False
        figures = [m.page.read() for m in members]
        if None in figures:
            return False
        try:
            tokens, fd = LoanPage.create()
        except OSError as exc:
            log.warning("lane %d: no page for a loan (%s); its jobs take turns through the "
                        "host", lane.index, exc)
            return False
        # A number is never used twice: a job sent a loan's page it was never lent under
        # keeps it, and must not take that page's token for a later loan's.
        self._loans_made = number = self._loans_made + 1
        try:
            sent = all(m.channel.send_with_descriptors(wire.Lent(number), [fd])
                       for m in members)
        finally:
            os.close(fd)
        if not sent:
            tokens.close()
            return False
        now = time.monotonic()
        for member, seen, inside in zip(members, figures, (True, False)):
            member.handover_messages += 1
            self._begin_lease(member, seen, number,
                              now if inside else _offered_from(member, seen, now), inside)
        mate.state = "running"  # its page says when it is inside an iteration
        lane.loan = Loan(number, tokens, members, (chosen.iterations, mate.iterations))
        return True

    def _loan_stands(self, lane: Lane, loan: Loan) -> bool:
        """Whether the loan goes on: no job waits for the lane, both jobs still may hold it
        (their pages read and checked now), the policy still would not choose between them,
        and the token is kept by the rules."""
        if ready_to_grant(lane):
            return False
        for member in loan.members:
            if (not member.leased or member.channel is None or member.suspended
                    or member.closing or not self._leasable(member)
                    or not any(r is member for r in lane.residents)):
                return False
            if not self._read_page(member) or lane.loan is not loan:
                return False
        self._count_switches(lane, loan)
        return (lane_rule.lendable(self.policy, *(m.view() for m in loan.members))
                and self._token_kept(lane, loan))

    def _token_kept(self, lane: Lane, loan: Loan) -> bool:
        """Whether the loan's token is as the rules keep it: given no more often than taken,
        and held only by a job inside an iteration (for a moment as it begins one, for
        LOAN_SILENT_LIMIT at most). Else one of the two broke the rules, and neither is
        lent the lane with the other again."""
        now = time.monotonic()
        count = loan.page.count()
        own = [m.page.count() for m in loan.members if m.page is not None]
        if count > 1:
            problem = "given back more often than taken"
        elif count < 0 or not all(0 <= c <= 1 for c in own):
            problem = "written over"  # a semaphore's count no sem_post could make
        elif count == 0 and own and min(own) > 0:
            if loan.silent_since is None or now - loan.silent_since < \
                    defaults.LOAN_SILENT_LIMIT:
                loan.silent_since = loan.silent_since or now
                return True
            problem = "held outside any iteration"
        else:
            loan.silent_since = None
            return True
        first, second = sorted(m.job_id for m in loan.members)
        if lane.unlendable != {first, second}:  # (seen once, said once)
            log.warning("lane %d: its token was %s; jobs %d and %d take turns through the "
                        "host from now on", lane.index, problem, first, second)
            lane.unlendable = frozenset((first, second))
        return False

    def _count_switches(self, lane: Lane, loan: Loan) -> None:
        """Switches under a loan, as many as the two jobs' iterations since last counted
        allow (exact where they alternate): no grant says who followed whom."""
        first, second = loan.members
        done = (first.iterations, second.iterations)
        lane.switches += 2 * min(done[0] - loan.counted[0], done[1] - loan.counted[1])
        loan.counted = done

    def _recall(self, lane: Lane) -> None:
        """End the loan: each job's lease ends as a lone lease would (taken back in its
        gap, or at its iteration's end, then the lane's holder until its Done)."""
        loan = lane.loan
        assert loan is not None
        loan.recalling = True
        self._token_kept(lane, loan)  # however the loan ends, a misdeed on it is seen
        try:
            for member in loan.members:
                if member.leased:
                    self._take_lease_back(member)
            self._count_switches(lane, loan)
        finally:  # whatever failed, the lane is granted again, and no lease outlives it
            for member in loan.members:
                if member.leased:
                    if member.page is not None:
                        member.page.want(True)
                    member.leased, member.closing = False, True  # its page says when it is out
            lane.loan, lane.last_job = None, None  # who iterated last under it is unknown
            loan.page.close()

    def _end_lease(self, resident: Resident) -> None:
        """The host wants the lane back: the job's lease ends, and under a loan the
        other's too."""
        loan = self.lanes[resident.lane].loan
        if loan is not None and not loan.recalling and any(m is resident
                                                              for m in loan.members):
            self._recall(self.lanes[resident.lane])
        elif resident.leased:
            self._take_lease_back(resident)

    def _take_lease_back(self, resident: Resident) -> None:
        """The lane is taken back at once where the job is in its gap (it asks with READY
        next time); inside an iteration, the job keeps it until that iteration's end, as it
        would without a lease, and gives it back with a Done."""
        page = resident.page
        assert page is not None and resident.leased
        page.want(True)
        in_gap = page.try_take()
        # Taken in its gap, the page is final: the worker writes it before it gives the lane
        # (a worker that died may have died writing it).
        if not self._read_page(resident, final=in_gap and resident.channel is not None):
            return
        resident.leased = False
        if in_gap:
            self._released_as_on_page(resident)
        else:
            # Its Done (or, where it missed the request, its READY) ends the iteration, whose
            # figures its page will have: the host measures nothing of it again.
            resident.closing = True
            if not resident.lease_in_iteration:
                resident.granted_at = time.monotonic()  # it took the lane as the host asked
            lane = self.lanes[resident.lane]
            if lane.holder is None and resident.state == "running":
                lane.holder = resident  # a loan's job: the lane is its until that Done

    def _close_iteration(self, resident: Resident, ended: bool) -> None:
        """The iteration its lease ended in is over (``ended``: the worker said so; else it
        gave the lane back unasked, or is gone): counted off its page, final where it said so
        (the worker writes it before it gives the lane back, and gives it before it says so),
        and never as less than the host saw of it: the iteration its page said it was in when
        the lease ended, from its start to now."""
        now = time.monotonic()
        least_attained = resident.attained + max(0.0, now - resident.granted_at)
        least_iterations = resident.iterations + resident.lease_in_iteration  # its page's word
        resident.closing = False
        if not self._read_page(resident, final=ended):
            return
        resident.attained = max(resident.attained, least_attained)
        if ended:
            resident.iterations = max(resident.iterations, least_iterations)
        self._released_as_on_page(resident)
        self._schedule(self.lanes[resident.lane])

    def _released_as_on_page(self, resident: Resident) -> None:
        """The lane is free again: its holder (or a job it was lent to) released it when its
        page says it did, or, where it has not iterated under its lease, when the host saw
        it release it before."""
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            lane.holder = None
        elif resident.state != "running":
            return
        seen, base = resident.page_seen, resident.lease_base
        if (seen.iterations, seen.gaps) != (base.iterations, base.gaps) \
                or resident.released_at is None:
            resident.released_at = resident.since_on_page(time.monotonic())
        resident.state = "idle"

    def _read_page(self, resident: Resident, final: bool = False) -> bool:
        """Take in a leased job's figures from its page. Impossible ones end the job
        (False): its lease is over, and its lane with it. A page being written is read next
        time, unless it must be ``final`` now or has been written to for too long."""
        if resident.page is None:
            return True
        figures = resident.page.read()
        now = time.monotonic()
        if figures is None:
            # Half-written: read next time, unless it must be final now or the same write
            # has been going on too long (a live writer's count moves on).
            sequence = resident.page.sequence()
            if resident.page_unread is None or resident.page_unread[0] != sequence:
                resident.page_unread = (sequence, now)
            if not final and now - resident.page_unread[1] < defaults.PAGE_UNREADABLE_SECONDS:
                return True
            problem = "its page stayed half-written"
        else:
            resident.page_unread = None
            problem = implausible(resident.page_seen, figures, resident.lease_base,
                                  int((now - resident.lease_started) * 1e9), time.monotonic_ns())
        if problem is None:
            resident.take_figures(figures, now)
            return True
        resident.leased = False
        self._end_for_protocol(resident, f"its worker wrote impossible figures on its page "
                                         f"({problem})")
        return False

    def _close_given_back(self) -> None:
        """A worker that missed the host's request may give the lane back without a word
        and then run on without a boundary for long: the semaphore says it gave it."""
        for resident in list(self.residents.values()):
            if resident.closing and resident.page is not None and resident.page.try_take():
                self._close_iteration(resident, ended=False)

    def _schedule_waiting_lanes(self) -> None:
        for lane in self.lanes:
            self._schedule(lane)

    def _drop_channel(self, resident: Resident) -> None:
        if resident.channel is None:
            return
        if resident.channel.sock in self.selector.get_map():  # not if its reading is deferred
            self.selector.unregister(resident.channel.sock)
        resident.channel.close()
        resident.channel = None
        self._forget_pipes(self.lanes[resident.lane], resident.job_id)
        self._release_lane(resident)
        if resident.page is not None:
            resident.page.close()
            resident.page = None

    def _leave_lane(self, resident: Resident) -> None:
        """The job will run no more iterations: policies stop counting it as resident."""
        lane = self.lanes[resident.lane]
        if resident in lane.residents:
            lane.residents.remove(resident)
            self._forget_pipes(lane, resident.job_id)
            self._release_lane(resident)

    def _release_lane(self, resident: Resident) -> None:
        if resident.leased:
            self._end_lease(resident)
        if resident.closing:  # what its page has of the iteration, and at least what ran
            self._close_iteration(resident, ended=False)
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            now = time.monotonic()
            resident.attained += max(0.0, now - resident.granted_at)
            lane.holder = None
        resident.state = "idle"
        self._schedule(lane)

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
            self._from_worker(resident)
        if resident.channel is not None:
            self._drop_channel(resident)
        resident.exit_status, resident.exited_at, resident.ended_wall = code, now, time.time()
        if (code != 0 and resident.shortage is None and resident.cgroup_cap is not None
                and resident.kill_why is None and resident.cgroup is not None
                and resident.cgroup.oom_kills()):
            # The kernel killed it at its cgroup's limit: it held that much, and wanted more.
            resident.shortage = wire.Shortage(held=resident.cgroup_cap)
        self._leave_lane(resident)
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
        log.warning("job %d: processes left in %s after SIGKILL; killing them again",
                    resident.job_id, cgroup.name)
        self.lingering.append(cgroup)
        return True

    def _kill_lingering(self) -> None:
        for cgroup in list(self.lingering):
            if cgroup.kill(0.0):
                cgroup.remove()
                self.lingering.remove(cgroup)

    def _kill(self, resident: Resident, why: StopWhy, grace: float | None = None) -> None:
        """SIGTERM to every process of the job now, SIGKILL after the kill wait (or
        ``grace``). A job whose process has exited already is ended as it ended."""
        if resident.exit_status is not None:
            return
        if resident.kill_deadline is not None and grace is None:
            return
        if resident.kill_why is None or why is StopWhy.PROTOCOL:
            resident.kill_why = why
        if resident.frozen:  # stopped processes must go on to see their signal
            resident.thaw_on_grant = False
            self._stop_processes(resident, False)
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
                self._kill(resident, StopWhy.TIMEOUT)
            elif (resident.warning is not None and resident.time_limit is not None
                  and ran >= resident.time_limit - resident.warning[1]):
                self._warn(resident, *resident.warning)
                resident.warning = None  # once, as sbatch's
            elif resident.deadline is not None and wall >= resident.deadline:
                self._kill(resident, StopWhy.DEADLINE)

    def _warn(self, resident: Resident, signum: int, _before: int, main_only: bool) -> None:
        """sbatch's --signal: to the job's main process (B:), or to every other process of
        the job (what srun started), as Slurm sends it to the steps and not the batch shell,
        nor srun (gq's srun passes it on to its tasks: they get it once)."""
        main = resident.process.pid
        if main_only:
            targets = {main}
        else:
            others = set(resident.cgroup.pids()) if resident.cgroup is not None else set()
            if not others:  # no cgroup: its process group
                others = group_members(main)
            targets = {pid for pid in others - {main} if not is_srun_shim(pid)}
        log.info("job %d: signal %d before its time limit to %s", resident.job_id, signum,
                 "its main process" if main_only else f"{len(targets)} process(es)")
        _send(targets, signum)

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
        watched = [Watched(r.job_id, r.run, r.host_mem_watched, r.cgroup, r.process.pid)
                   for r in self.residents.values() if r.host_mem_watched is not None
                   and r.kill_why is None and r.exit_status is None]
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
            if (resident is None or resident.run != job.run or resident.kill_why is not None
                    or resident.exit_status is not None or reading.held <= job.limit):
                continue
            resident.detail = (f"over its --host-mem of {format_size(job.limit)} (its "
                               f"processes held {format_size(reading.held)})")
            log.warning("job %d: %s; ending it", resident.job_id, resident.detail)
            self._kill(resident, StopWhy.HOST_MEMORY, grace=0.0)

    def _enforce_kills(self) -> None:
        now = time.monotonic()
        for resident in self.residents.values():
            if (resident.kill_deadline is not None and now >= resident.kill_deadline
                    and resident.exit_status is None):
                self._signal_job(resident, signal.SIGKILL)

    def _shutdown(self) -> None:
        self.stopping = True
        for resident in list(self.residents.values()):
            self._kill(resident, StopWhy.SHUTDOWN)

    def _maybe_send_progress(self) -> None:
        now = time.monotonic()
        if self.daemon is None or now - self._last_progress < defaults.PROGRESS_PERIOD:
            return
        self._last_progress = now
        self._read_leased_pages()
        # A job inside an iteration is reported each time: its attained time grows.
        changed = [r for r in self.residents.values() if r.dirty or r.state == "running"]
        for resident in changed:
            resident.dirty = False
        switches = [lane.switches for lane in self.lanes]
        if changed or switches != self._reported_switches:
            self._reported_switches = switches
            self._tell(wire.Progress([r.progress() for r in changed], switches))

    def _read_leased_pages(self) -> None:
        for resident in list(self.residents.values()):
            if resident.leased:
                self._read_page(resident)


def _offered_from(mate: Resident, seen: Figures, now: float) -> float:
    """When the lease a loan offers a job in its gap begins: at its release, as its page
    says (its worker wrote it before its Done, which the host may have read late), within
    LOAN_OFFER_REACH of the release the host saw."""
    host_saw = min(now, mate.released_at or now)
    return min(host_saw, max(seen.since_ns / 1e9, host_saw - defaults.LOAN_OFFER_REACH))


def _lane_page(job_id: int) -> tuple[SharedPage | None, int | None]:
    """A new page to share with the job's worker; without one (out of memory or
    descriptors) the job runs as well, with a READY/GO exchange at every boundary."""
    try:
        return SharedPage.create()
    except OSError as exc:
        log.warning("job %d: no page to share with its worker (%s); it runs without leases",
                    job_id, exc)
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
        raise LaunchError(f"cannot open job {spec.id}'s script snapshot: {exc.strerror}; "
                          "submit the script again") from None


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
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(socket_path)
    finally:
        os.umask(old_umask)
    listener.listen(8)
    listener.setblocking(False)
    return pidfile, listener


def main() -> None:
    parser = argparse.ArgumentParser(prog="gq-host",
                                     description="gq execution host (started by the daemon)")
    parser.add_argument("--device", required=True)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--state-dir", required=True, help="where its socket and pidfile live")
    parser.add_argument("--kill-grace", type=float, default=defaults.KILL_WAIT)
    parser.add_argument("--cgroup", choices=cgroups.KINDS, default=defaults.CGROUP)
    parser.add_argument("--scope", required=True, help="this gq instance's cgroup tag")
    args = parser.parse_args()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    gq_log.configure(f"host[{args.device}]")
    try:
        pidfile, listener = listen(args.state_dir, args.device)
    except AlreadyRunning:
        log.error("another execution host of %s is running", args.device)
        raise SystemExit(defaults.ALREADY_RUNNING_EXIT) from None
    backend = cgroups.detect(args.cgroup, args.scope)
    log.info("jobs' processes are kept in %s", f"cgroup {backend.kind} hierarchies"
             if backend is not None else "process groups (no cgroup hierarchy to use)")
    try:
        Host(args.device, args.cuda, args.lanes, listener, args.kill_grace, backend).run()
    finally:
        os.unlink(host_paths(args.state_dir, args.device)[1])
        pidfile.close()


if __name__ == "__main__":
    main()
