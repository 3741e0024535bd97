"""The node daemon: its life cycle and its loop. It answers clients (:mod:`server`, then
:mod:`handlers`), supervises one execution host per device (:mod:`supervision`), admits
pending jobs (:mod:`scheduling`), watches the devices (:mod:`monitoring`) and purges old
jobs (:mod:`retention`). It is the only process that opens the queue.

The daemon may stop or die at any time while jobs run on: the execution hosts outlive it,
and a starting daemon re-adopts them, collects what happened meanwhile (jobs that ended,
with their exit codes and end times) and carries on. Only a job whose host is gone is lost
(node failure), and --requeue jobs go back to the queue then.

Each event of the loop is handled in isolation: an unexpected error is logged and the loop
goes on, so no single request, report or sample can take the node down.
"""

from __future__ import annotations

import logging
import os
import resource
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import IO

from gq import defaults
from gq.daemon import heap_trim, retention
from gq.daemon.devices import Device, discover, emulated
from gq.daemon.forecasts.forecasting import Forecaster, WhatIf
from gq.daemon.monitoring.guard import Limits
from gq.daemon.monitoring.monitor import Monitor
from gq.daemon.mps import Mps
from gq.daemon.options import DaemonOptions
from gq.daemon.pidfiles import release_pidfile
from gq.daemon.scheduling.scheduler import Capacity, Scheduler
from gq.daemon.serving.access import Caller, Rules
from gq.daemon.serving.handlers import dispatch, query
from gq.daemon.serving.listings import Lister, Listing, ListingChild
from gq.daemon.serving.server import Connection, ConnectionLimits, Server
from gq.daemon.serving.waiting import Waiters, Waiting
from gq.daemon.supervision.host_handles import HostSettings
from gq.daemon.supervision.notify import Notifier
from gq.daemon.supervision.supervisor import Supervisor
from gq.exec.cgroups import tasks as cgroup_tasks
from gq.exec.host.messages import StopWhy
from gq.home import Home
from gq.queue import settings as queue_settings
from gq.queue import spool
from gq.queue.engine import Database
from gq.queue.states import JobState
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.daemon")


class Daemon:
    def __init__(self, home: Home, options: DaemonOptions):
        self.home = home
        self.options = options
        self.db = Database(home)
        self.devices, self.device_note = discover()
        if options.cpu_devices:
            memory = (
                options.cpu_memory or next(d for d in self.devices if d.kind == "cpu").memory_total
            )
            self.devices = emulated(options.cpu_devices, memory, options.device_model)
            self.device_note = (
                f"{options.cpu_devices} devices emulated on the cpu "
                "(--cpu-devices), each with its own execution host"
            )
        elif options.cpu_memory is not None:
            self.devices = [
                replace(d, memory_total=options.cpu_memory) if d.kind == "cpu" else d
                for d in self.devices
            ]
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.keep_jobs = False  # stopping leaves running jobs to their hosts
        self.stop_deadline = 0.0
        self.woken = True
        self.started_at = time.time()
        self.rules = Rules(
            daemon_uid=os.geteuid(),
            operator_group=options.operator_group,
            priority_cap=options.priority_cap if home.system else None,
        )
        lanes = max(1, options.lanes)
        self.supervisor = Supervisor(
            home,
            self.db,
            self.devices,
            HostSettings(
                lanes=lanes,
                kill_grace=options.kill_grace,
                cgroup=options.cgroup,
                attach_wait=options.attach_wait,
                packing=options.packing,
                checkpoint=options.checkpoint,
            ),
            self.selector,
            self.rescan,
            lambda: self.monitor.metrics,
            options.probe_wait,
            options.fair_half_life,
            options.max_pids,
        )
        self.ledger = self.supervisor.ledger
        self.mps = Mps(home, self.devices, options.mps, options.lanes, self.lane_memory)
        job_cgroups = self.supervisor.cgroups
        self.monitor = Monitor(
            self.db,
            self.devices,
            lanes,
            Limits(options.max_temp, options.max_power),
            options.readings,
            self.rescan,
            job_cgroups.job_of if job_cgroups else None,
        )
        self.scheduler = Scheduler(
            self.db,
            self.devices,
            Capacity(
                lanes,
                options.max_resident,
                options.probe_mem,
                options.idle_resident,
                options.checkpoint,
                options.rotate,
            ),
            self.supervisor,
            self.monitor,
            self.rescan,
            options.move_margin,
        )
        self.server: Server[Waiting | WhatIf | Listing] | None = None
        self.waiters = Waiters(self.db)
        self.notifier = Notifier(self.db, home, options.on_finish)
        self.forecaster = Forecaster(
            self.db, self.scheduler, self.selector, self._reply, self._connected
        )

    # ----- what handlers see (gq.daemon.serving.handlers.node_view) ----------------------------
    def rescan(self) -> None:
        """Run the scheduling pass soon: something a pending job waits for has changed."""
        self.woken = True

    def signal_job(self, job_id: int, signum: int) -> bool:
        running = self.supervisor.running.get(job_id)
        if running is None:
            return False
        self.supervisor.signal(running, signum)
        return True

    def lane_memory(self, device: Device) -> int:
        return self.scheduler.lane_memory(device)

    def loads(self):
        return self.scheduler.loads()

    def sharing(self, device):
        return self.supervisor.packing.get(device)

    def usage(self, job, processes_summed):
        cgroups = self.supervisor.cgroups
        if cgroups is None or job.state != JobState.RUNNING.value or not job.device:
            return None
        cgroup = cgroups.job(job.device.split(",")[0], job.id, job.run_count)
        return cgroup.usage(processes_summed)

    def device_memory(self, job_id):
        job = self.supervisor.running.get(job_id)
        return None if job is None or job.latest is None else job.latest.memory

    def stale(self) -> str | None:
        """Why the queue's progress figures may be out of date, if they may."""
        down = sorted(set(self.supervisor.down_since))
        if down:
            return f"the execution host of {', '.join(down)} is restarting"
        return None

    @property
    def containment(self) -> str:
        backend = self.supervisor.cgroups
        watched = f"--host-mem checked every {defaults.HOST_MEMORY_WATCH:g} s"
        if backend is None:
            return f"process groups ({watched}), with no limit on a job's tasks"
        kept = f"cgroup {backend.kind}"
        if not backend.holds_memory():
            kept += f", without its memory controller ({watched})"
        if not backend.holds_tasks():
            kept += ", without its pids controller (no limit on a job's tasks)"
        return kept

    @property
    def task_limits(self) -> tuple[int, int] | None:
        backend = self.supervisor.cgroups
        if backend is None or not backend.holds_tasks():
            return None
        return self.options.max_pids, cgroup_tasks.node_bound()

    def _reply(self, connection: Connection, line: bytes) -> None:
        assert self.server is not None
        self.server.reply(connection, line)

    def _connected(self, connection: Connection) -> bool:
        return self.server is not None and connection in self.server.connections

    def _park(self, connection: Connection, later: Waiting | WhatIf | Listing) -> None:
        """A request answered later: gq wait's by the waiters, --test-only's by a forecast,
        a big listing by a child."""
        if isinstance(later, Listing):
            self.lister.park(connection, later)
        elif isinstance(later, WhatIf):
            self.forecaster.park(connection, later)
            self.rescan()  # a pass, and after it the forecast that answers
        else:
            self.waiters.add(connection, later)

    @property
    def connection_limits(self) -> ConnectionLimits:
        assert self.server is not None
        return self.server.limits

    # ----- life cycle -----------------------------------------------------------------
    def run(self, pidfile: IO[str]) -> None:
        """Serve until stopped; ``pidfile`` is the lock that makes this the home's daemon."""
        try:
            wake_read = signal_socket((signal.SIGTERM, signal.SIGINT, signal.SIGCHLD))
            self.selector.register(wake_read, selectors.EVENT_READ, "signal")
            with self.db.read() as session:
                self.scheduler.apply_policy(queue_settings.get_all(session))
            if changed := spool.make_private(self.home):
                log.info("made %d snapshot(s) of an older gq the daemon's own", changed)
            if self.options.metrics:
                self.monitor.serve_metrics(self.options.metrics)
            self._start_mps()
            for device in self.devices:
                self.supervisor.attach(device)
            descriptors = _raise_descriptor_limit()
            limits = ConnectionLimits(
                per_user=self.options.max_connections_per_user,
                total=max(
                    1, min(self.options.max_connections, descriptors - defaults.DESCRIPTOR_RESERVE)
                ),
                request=self.options.max_request,
                idle=self.options.client_timeout,
            )
            self.server = Server(
                self.home, self.selector, self._dispatch, self._identify, limits, park=self._park
            )
            self.lister = Lister(
                self.selector, lambda request: query.listed_apart(self, request), self.server
            )
            log.info(
                "daemon %d up (%s mode) on %s; %d descriptors, at most %d clients (%d per user)",
                os.getpid(),
                self.home.mode,
                ", ".join(d.name for d in self.devices),
                descriptors,
                limits.total,
                limits.per_user,
            )
            if self.task_limits is None:
                log.warning(
                    "--max-pids %d is not enforced here: jobs are kept in %s",
                    self.options.max_pids,
                    self.containment,
                )
            self._loop(wake_read)
        finally:
            if self.server is not None:
                # A system socket stays: clients then wait for a restarting daemon instead
                # of starting personal ones.
                self.server.close(unlink=not self.home.system)
            self.monitor.close()
            self.supervisor.remove_empty_cgroups()
            release_pidfile(self.home, pidfile)
            self.db.close()

    def _dispatch(
        self, caller: Caller, line: bytes
    ) -> tuple[bytes, list[int]] | Waiting | WhatIf | Listing:
        return dispatch.dispatch(self, caller, line)

    def _identify(self, pid: int, uid: int, gid: int) -> Caller:
        return self.rules.identify(uid, gid)

    def _loop(self, wake_read: socket.socket) -> None:
        server = self.server
        assert server is not None
        last_scan = last_flush = last_sample = last_purge = last_trim = last_mps = 0.0
        while True:
            for key, mask in self.selector.select(self._timeout(last_scan)):
                if isinstance(key.data, Connection):
                    _isolated(server.service, key.data, mask)
                elif key.data is server:
                    _isolated(server.accept)
                elif key.data == "signal":
                    _isolated(self._on_signals, wake_read)
                elif key.data is self.forecaster:
                    _isolated(self.forecaster.receive)
                elif isinstance(key.data, ListingChild):
                    _isolated(self.lister.receive, key.data)
                else:
                    _isolated(self.supervisor.receive, key.data)
            _isolated(server.serve)  # one request a turn, in turns across users
            now = time.monotonic()
            _isolated(server.expire, now)
            if self.stopping:
                if not self.keep_jobs:
                    _isolated(self.supervisor.end_let_go)
                if self.keep_jobs or not self.supervisor.running or now > self.stop_deadline:
                    break
                continue
            _isolated(self.supervisor.restart_dead, now)
            if now - last_sample >= defaults.SAMPLE_PERIOD:
                last_sample = now
                _isolated(self.monitor.sample, self.supervisor.running, self.supervisor.switches)
            if (
                self.woken and now - last_scan >= defaults.SCAN_GAP
            ) or now - last_scan >= defaults.POLL_PERIOD:
                self.woken = False
                last_scan = now
                _isolated(self.scheduler.scan)
                _isolated(self.waiters.answer_ended, server)
                _isolated(self.notifier.look)
                _isolated(self.forecaster.tick)
            elif self.notifier.running:
                _isolated(self.notifier.tend)
            if now - last_flush >= defaults.FLUSH_PERIOD:
                last_flush = now
                _isolated(self.supervisor.flush)
                _isolated(self.supervisor.end_probes, time.time())
            if now - last_purge >= defaults.PURGE_PERIOD:
                last_purge = now
                _isolated(retention.purge, self.db, self.home, self.options.retention)
            if now - last_trim >= defaults.HEAP_TRIM_PERIOD:
                last_trim = now
                _isolated(heap_trim.give_back)
            if self.mps.on and now - last_mps >= defaults.MPS_CHECK_PERIOD:
                last_mps = now
                _isolated(self.mps.tend)
        _isolated(self.supervisor.flush)
        _isolated(self.notifier.close)
        _isolated(self.forecaster.close)
        _isolated(self.lister.close)
        self.supervisor.close(self.keep_jobs)
        if not self.keep_jobs:  # (jobs kept are the control daemons' clients: they stay)
            _isolated(self.mps.stop)

    def _start_mps(self) -> None:
        """The devices' MPS control daemons up before their hosts start jobs: those hosts
        keep lanes side by side to one user's jobs, and each job is told its device's."""
        self.mps.start()
        self.supervisor.settings = replace(self.supervisor.settings, mps=frozenset(self.mps.on))
        self.supervisor.mps_environment = self._mps_environment
        log.info("%s", self.mps.line)

    def _mps_environment(
        self, job_id: int, user: str, devices: list[Device]
    ) -> dict[str, str] | None:
        """What a job starting on ``devices`` is told of MPS (None: gq's MPS is off, and
        a job's own settings are left to it), from the users of the jobs running there."""
        if self.mps.reason is not None:
            return None
        names = {d.name for d in devices}
        others = [
            r.user
            for r in self.supervisor.running.values()
            if r.job_id != job_id and names & {d.name for d in r.devices}
        ]
        return self.mps.environment(user, devices, others)

    def _timeout(self, last_scan: float) -> float:
        """Until the next thing the loop must do unprompted; never 0 while nothing is due."""
        assert self.server is not None
        if self.server.turns:
            return 0.0  # a request waits for its turn
        now = time.monotonic()
        if self.stopping:  # only exits (events) and the stop deadline matter now
            deadlines = [self.stop_deadline]
        else:
            deadlines = [last_scan + (defaults.SCAN_GAP if self.woken else defaults.POLL_PERIOD)]
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
        running = self.supervisor.running
        if keep_jobs:
            log.info("stopping; %d running job(s) stay with their hosts", len(running))
            return
        log.info("stopping: ending %d running job(s)", len(running))
        self.stop_deadline = time.monotonic() + self.options.kill_grace + defaults.STOP_GRACE
        for job in list(running.values()):
            self.supervisor.kill(job, StopWhy.SHUTDOWN)


def _isolated(action: Callable, *args) -> None:
    """One event of the loop: an unexpected error is logged, and the loop goes on."""
    try:
        action(*args)
    except Exception:  # noqa: BLE001 - the daemon must outlive any one event
        log.exception("error in %s (the daemon goes on)", getattr(action, "__qualname__", action))


def _raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one (systemd's default soft limit is
    1024); return the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return soft if soft != resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    except (ValueError, OSError):
        return soft
