"""Execution host: one process per device. Keeps workers resident and, at every iteration
boundary, grants the next iteration of each lane to ``policy.pick(...)``.

The hot path (READY → pick → GO) touches no database and no disk; the daemon gets
progress about once a second and every start and exit as it happens.

A host outlives the daemon that started it: it listens on its own socket in the state
directory (``hosts/<device>.sock``, its pid locked in ``hosts/<device>.pid``), keeps running
its jobs under the policy it last had, enforces their time limits, and keeps every exit
report until a daemon acknowledges it. A daemon that connects says ``hello`` and gets the
host's whole ``state`` back (see :mod:`gq.exec.protocol`).
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import selectors
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from gq import defaults, policies
from gq.errors import AlreadyRunning, LaunchError
from gq.exec.protocol import HOST_VERSION, Channel, host_paths
from gq.exec.spawn import kill_group, start_as_submitter
from gq.policies.base import JobView, anticipation_window
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.host")
HOUSEKEEPING_PERIOD = defaults.HOUSEKEEPING_PERIOD


@dataclass
class Resident:
    job_id: int
    run: int  # which run of the job this is: exit reports name it, so a rerun is not ended
    user: str
    priority: int
    submit_time: float
    steps_total: int | None
    lane: int
    process: subprocess.Popen
    channel: Channel | None  # None for plain processes (no iteration boundaries)
    started_at: float  # monotonic
    started_wall: float
    time_limit: float | None = None  # seconds; the host enforces it, daemon or not
    deadline: float | None = None  # wall clock; enforced likewise (state DEADLINE)
    kill_why: str | None = None  # cancel | requeue | timeout | shutdown
    state: str = "idle"  # idle (released) | ready (waiting for GO) | running (holds lane)
    steps_done: int = 0
    attained: float = 0.0
    iterations: int = 0
    first_iteration: float = 0.0  # warm-up (allocations, lazy init): kept out of the mean
    gaps: int = 0
    gap_total: float = 0.0
    granted_at: float = 0.0
    released_at: float | None = None
    mem_persistent: int | None = None
    mem_peak: int | None = None
    kill_deadline: float | None = None
    dirty: bool = True

    @property
    def mean_iteration(self) -> float | None:
        """Unknown until a second iteration: the first one's warm-up would mislead srtf,
        and a job it ranks last never runs again to correct it."""
        if self.iterations < 2:
            return None
        return (self.attained - self.first_iteration) / (self.iterations - 1)

    @property
    def mean_gap(self) -> float | None:
        """Idle time from a release to the next acquire (data loading, host-side work)."""
        return self.gap_total / self.gaps if self.gaps else None

    def view(self) -> JobView:
        return JobView(
            id=self.job_id, user=self.user, submit_time=self.submit_time, priority=self.priority,
            steps_done=self.steps_done, steps_total=self.steps_total, attained=self.attained,
            mean_iteration=self.mean_iteration,
            mean_gap=self.mean_gap,
            released_at=self.released_at, deadline=self._deadline_now(),
        )

    def _deadline_now(self) -> float | None:
        """The deadline on the monotonic clock policies are given."""
        if self.deadline is None:
            return None
        return self.deadline - time.time() + time.monotonic()

    def progress(self) -> dict[str, Any]:
        return {"job": self.job_id, "run": self.run, "steps_done": self.steps_done,
                "steps_total": self.steps_total, "attained": self.attained,
                "mean_iteration": self.mean_iteration, "mean_gap": self.mean_gap,
                "mem_persistent": self.mem_persistent,
                "mem_peak": self.mem_peak, "holds_lane": self.state == "running"}


@dataclass
class Lane:
    index: int
    holder: Resident | None = None
    residents: list[Resident] = field(default_factory=list)
    anticipating: int | None = None  # job id the lane is kept free for, briefly
    anticipate_until: float = 0.0
    last_job: int | None = None  # the job granted it last
    switches: int = 0  # grants to a job other than the last one


class Host:
    def __init__(self, device: str, cuda: bool, lanes: int, listener: socket.socket,
                 kill_grace: float):
        self.device = device
        self.cuda = cuda
        self.lanes = [Lane(i) for i in range(max(1, lanes))]
        self.listener = listener
        self.daemon: Channel | None = None  # the daemon now connected, if any
        self.greeted = False  # it said hello: until then it is sent nothing but the state
        self.kill_grace = kill_grace
        self.policy = policies.make("fifo")
        self.policy_name = ("fifo", "always", policies.DEFAULT_QUANTUM)
        self.residents: dict[int, Resident] = {}
        self.exited: dict[int, dict[str, Any]] = {}  # exit reports no daemon has acknowledged
        self.selector = selectors.DefaultSelector()
        self.stopping = False  # ending every job, then exiting
        self.draining = False  # taking no new job, exiting once the last one has ended
        self.child_exited = False
        self._next_housekeeping = 0.0
        self._last_progress = 0.0
        self._reported_switches: list[int] = []

    # ----- the loop -------------------------------------------------------------------
    def run(self) -> None:
        wake_read = signal_socket((signal.SIGCHLD, signal.SIGTERM, signal.SIGINT))
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        self.selector.register(wake_read, selectors.EVENT_READ, "signal")
        while not ((self.stopping or self.draining) and not self.residents):
            events = self.selector.select(self._timeout())
            for key, _ in events:
                if key.data == "listener":
                    self._accept_daemon()
                elif key.data == "daemon":
                    self._from_daemon()
                elif key.data == "signal":
                    self._on_signals(wake_read)
                else:
                    self._from_worker(key.data)
            now = time.monotonic()
            # Busy lanes may never time out: deadlines (kills, anticipation) need a clock too.
            if not events or self.child_exited or now >= self._next_housekeeping:
                self._next_housekeeping = now + HOUSEKEEPING_PERIOD
                self.child_exited = False
                self._reap()
                self._enforce_time_limits(now)
                self._enforce_kills()
                self._schedule_waiting_lanes()
            self._maybe_send_progress()
        log.info("host of %s exits (%s)", self.device, "stopped" if self.stopping else "drained")

    def _timeout(self) -> float:
        timeout = 0.25 if self.residents else defaults.PROGRESS_PERIOD
        for lane in self.lanes:
            if lane.holder is not None or not any(r.state == "ready" for r in lane.residents):
                continue
            if lane.anticipating is not None:
                timeout = min(timeout, max(0.0, lane.anticipate_until - time.monotonic()))
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
        if _peer_uid(sock) != os.geteuid():  # only the daemon's own user may drive a host
            sock.close()
            return
        if self.daemon is not None:
            self._forget_daemon()
        sock.setblocking(False)
        self.daemon, self.greeted = Channel(sock), False
        self.selector.register(sock, selectors.EVENT_READ, "daemon")
        log.info("a daemon connected")

    def _forget_daemon(self) -> None:
        assert self.daemon is not None
        self.selector.unregister(self.daemon.sock)
        self.daemon.close()
        self.daemon = None

    def _tell(self, message: dict[str, Any]) -> None:
        """Send to the daemon if one is connected and greeted; what it must not miss is kept
        anyway, and its state answers its hello first."""
        if self.daemon is not None and self.greeted and not self.daemon.send(message):
            log.warning("the daemon went away")
            self._forget_daemon()

    def _from_daemon(self) -> None:
        assert self.daemon is not None
        for message in self.daemon.receive():
            op = message["op"]
            if op == "hello":
                self.greeted = True
                self._tell(self._state())
            elif op == "launch":
                self._launch(message["job"])
            elif op == "kill":
                self._kill(int(message["job"]), str(message.get("why", "cancel")))
            elif op == "ack":
                report = self.exited.get(int(message["job"]))
                if report is not None and report["run"] == message.get("run"):
                    del self.exited[int(message["job"])]
            elif op == "update":
                resident = self.residents.get(int(message["job"]))
                if resident is not None:
                    resident.priority = int(message["priority"])
                    resident.time_limit = message.get("time_limit")
            elif op == "policy":
                self._set_policy(message.get("name", "fifo"), message.get("fill", "always"),
                                 message.get("quantum", policies.DEFAULT_QUANTUM))
            elif op == "shutdown":
                self._shutdown()
            elif op == "drain":
                log.info("draining: no new jobs; exiting after the last one")
                self.draining = True
            else:
                log.warning("unknown op from daemon: %r", op)
        if self.daemon is not None and self.daemon.closed:
            log.info("the daemon disconnected; jobs keep running")
            self._forget_daemon()

    def _state(self) -> dict[str, Any]:
        """Everything a daemon that (re)connects must know."""
        residents = []
        for resident in self.residents.values():
            item = resident.progress()
            item.update(pid=resident.process.pid, started=resident.started_wall,
                        time_limit=resident.time_limit, kill_why=resident.kill_why)
            residents.append(item)
        return {"op": "state", "version": HOST_VERSION, "pid": os.getpid(),
                "device": self.device, "lanes": len(self.lanes),
                "policy": list(self.policy_name), "draining": self.draining,
                "residents": residents, "exited": list(self.exited.values())}

    def _set_policy(self, name: str, fill: str, quantum: str) -> None:
        try:
            self.policy = policies.make(name, fill, quantum)
        except ValueError as exc:
            log.warning("ignoring policy change: %s", exc)
            return
        self.policy_name = (name, fill, quantum)
        for lane in self.lanes:
            self._schedule(lane)

    def _launch(self, spec: dict[str, Any]) -> None:
        job_id = int(spec["id"])
        if self.draining or self.stopping:
            self._tell({"op": "launch_failed", "job": job_id, "run": spec.get("run"),
                        "reason": "its execution host is being replaced; requeued"})
            return
        try:
            resident = self._spawn(spec)
        except LaunchError as exc:
            self._tell({"op": "launch_failed", "job": job_id, "run": spec.get("run"),
                        "reason": str(exc)})
            return
        self.residents[job_id] = resident
        self.lanes[resident.lane].residents.append(resident)
        if resident.channel is not None:
            self.selector.register(resident.channel.sock, selectors.EVENT_READ, resident)
        self._tell({"op": "started", "job": job_id, "run": resident.run,
                    "pid": resident.process.pid})

    def _spawn(self, spec: dict[str, Any]) -> Resident:
        """Start the job's process as its submitter, in its own process group."""
        job_id = int(spec["id"])
        env = dict(spec["env"])
        worker_end = host_end = None
        pass_fds: tuple[int, ...] = ()
        if spec.get("worker", False):
            host_end, worker_end = socket.socketpair()
            env["GQ_WORKER_FD"] = str(worker_end.fileno())
            pass_fds = (worker_end.fileno(),)
        try:
            process = start_as_submitter(spec, env, pass_fds)
        except LaunchError:
            if host_end is not None:
                host_end.close()
            raise
        finally:
            if worker_end is not None:
                worker_end.close()
        channel = None
        if host_end is not None:
            host_end.setblocking(False)
            channel = Channel(host_end)
        lane = spec.get("lane")
        if lane is None or not 0 <= int(lane) < len(self.lanes):
            lane = min(self.lanes, key=lambda l: len(l.residents)).index
        return Resident(
            job_id=job_id, run=int(spec.get("run", 1)), user=spec.get("user", ""),
            priority=int(spec.get("priority", 0)),
            submit_time=float(spec.get("submit_time", 0.0)), steps_total=spec.get("steps_total"),
            lane=int(lane), process=process, channel=channel, started_at=time.monotonic(),
            started_wall=time.time(), time_limit=spec.get("time_limit"),
            deadline=spec.get("deadline"),
        )

    # ----- worker messages: the hot path ----------------------------------------------
    def _from_worker(self, resident: Resident) -> None:
        channel = resident.channel
        assert channel is not None
        for message in channel.receive():
            op = message["op"]
            now = time.monotonic()
            if op == "ready":
                self._on_ready(resident, now)
            elif op == "done":
                self._on_done(resident, message, now)
            elif op == "total":
                resident.steps_total = max(1, int(message["steps"]))
                resident.dirty = True
            elif op == "progress":
                resident.steps_done = int(message["steps"])
                resident.dirty = True
            elif op == "finished":
                self._leave_lane(resident)
        if channel.closed:
            self._drop_channel(resident)

    def _on_ready(self, resident: Resident, now: float) -> None:
        if resident.released_at is not None:
            resident.gaps += 1
            resident.gap_total += now - resident.released_at
        resident.state = "ready"
        self._schedule(self.lanes[resident.lane])

    def _on_done(self, resident: Resident, message: dict[str, Any], now: float) -> None:
        lane = self.lanes[resident.lane]
        if lane.holder is not resident:
            return
        resident.iterations += 1
        resident.attained += now - resident.granted_at
        if resident.iterations == 1:
            resident.first_iteration = resident.attained
        resident.steps_done = int(message.get("steps", resident.steps_done))
        resident.mem_persistent = message.get("mem_persistent")
        resident.mem_peak = message.get("mem_peak")
        resident.dirty = True
        resident.state = "idle"
        resident.released_at = now
        lane.holder = None
        self._anticipate(lane, resident, now)
        self._schedule(lane)

    def _anticipate(self, lane: Lane, released: Resident, now: float) -> None:
        view = released.view()
        window = anticipation_window(view.mean_gap)
        if window is None:
            return
        ready = [r.view() for r in lane.residents if r.state == "ready"]
        if not ready:
            return
        preferred = self.policy.pick(ready + [view], [r.view() for r in lane.residents], now)
        if preferred is not None and preferred.id == released.job_id:
            lane.anticipating = released.job_id
            lane.anticipate_until = now + window

    def _schedule(self, lane: Lane) -> None:
        if lane.holder is not None:
            return
        ready = [r for r in lane.residents if r.state == "ready"]
        if not ready:
            return
        now = time.monotonic()
        if lane.anticipating is not None:
            awaited = self.residents.get(lane.anticipating)
            if awaited is not None and awaited.state != "ready" and now < lane.anticipate_until:
                return
            lane.anticipating = None
        chosen_view = self.policy.pick([r.view() for r in ready],
                                       [r.view() for r in lane.residents], now)
        if chosen_view is None:
            return
        chosen = self.residents[chosen_view.id]
        shared = self.cuda and len(lane.residents) > 1
        if chosen.channel is None:
            return
        if not chosen.channel.send({"op": "go", "empty_cache": shared}):
            log.warning("job %d's worker hung up before its grant; the lane goes on",
                        chosen.job_id)
            self._drop_channel(chosen)  # its exit is reaped and reported as usual
            return
        chosen.state = "running"
        chosen.granted_at = time.monotonic()
        lane.holder = chosen
        if lane.last_job not in (None, chosen.job_id):
            lane.switches += 1
        lane.last_job = chosen.job_id

    def _schedule_waiting_lanes(self) -> None:
        for lane in self.lanes:
            self._schedule(lane)

    def _drop_channel(self, resident: Resident) -> None:
        if resident.channel is None:
            return
        self.selector.unregister(resident.channel.sock)
        resident.channel.close()
        resident.channel = None
        self._release_lane(resident)

    def _leave_lane(self, resident: Resident) -> None:
        """The job will run no more iterations: policies stop counting it as resident."""
        lane = self.lanes[resident.lane]
        if resident in lane.residents:
            lane.residents.remove(resident)
            self._release_lane(resident)

    def _release_lane(self, resident: Resident) -> None:
        lane = self.lanes[resident.lane]
        if lane.holder is resident:
            now = time.monotonic()
            resident.attained += now - resident.granted_at
            lane.holder = None
        resident.state = "idle"
        self._schedule(lane)

    # ----- exits and kills ------------------------------------------------------------
    def _reap(self) -> None:
        for resident in list(self.residents.values()):
            code = resident.process.poll()
            if code is None:
                continue
            if resident.channel is not None:
                self._from_worker(resident)  # its last messages: a final DONE, say
            if resident.channel is not None:
                self._drop_channel(resident)
            kill_group(resident.process.pid, signal.SIGKILL)  # leftover children
            del self.residents[resident.job_id]
            self._leave_lane(resident)
            report = resident.progress()
            report.update(op="exited", code=code if code >= 0 else None,
                          signal=-code if code < 0 else None, kill_why=resident.kill_why,
                          end_time=time.time())
            self.exited[resident.job_id] = report  # until a daemon acknowledges it
            self._tell(report)

    def _kill(self, job_id: int, why: str) -> None:
        """SIGTERM to the job's process group now, SIGKILL after the kill wait."""
        resident = self.residents.get(job_id)
        if resident is None or resident.kill_deadline is not None:
            return
        resident.kill_why = why
        kill_group(resident.process.pid, signal.SIGTERM)
        resident.kill_deadline = time.monotonic() + self.kill_grace

    def _enforce_time_limits(self, now: float) -> None:
        wall = time.time()
        for resident in list(self.residents.values()):
            if resident.kill_deadline is not None:
                continue
            if resident.time_limit is not None and now - resident.started_at >= resident.time_limit:
                self._kill(resident.job_id, "timeout")
            elif resident.deadline is not None and wall >= resident.deadline:
                self._kill(resident.job_id, "deadline")

    def _enforce_kills(self) -> None:
        now = time.monotonic()
        for resident in self.residents.values():
            if resident.kill_deadline is not None and now >= resident.kill_deadline:
                kill_group(resident.process.pid, signal.SIGKILL)

    def _shutdown(self) -> None:
        self.stopping = True
        for job_id in list(self.residents):
            self._kill(job_id, "shutdown")

    def _maybe_send_progress(self) -> None:
        now = time.monotonic()
        if self.daemon is None or now - self._last_progress < defaults.PROGRESS_PERIOD:
            return
        self._last_progress = now
        changed = [r for r in self.residents.values() if r.dirty]
        for resident in changed:
            resident.dirty = False
        switches = [lane.switches for lane in self.lanes]
        if changed or switches != self._reported_switches:
            self._reported_switches = switches
            self._tell({"op": "progress", "jobs": [r.progress() for r in changed],
                        "switches": switches})


def _peer_uid(sock: socket.socket) -> int:
    import struct

    cred = struct.Struct("3i")
    return cred.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, cred.size))[1]


def listen(state_dir: str, device: str):
    """Lock the device's host pidfile and bind its socket; AlreadyRunning if a live host
    holds them. Returns the pidfile (keep it open) and the listening socket."""
    pidfile_path, socket_path = host_paths(state_dir, device)
    pidfile = open(pidfile_path, "a+")
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
    parser = argparse.ArgumentParser(description="gq execution host (started by the daemon)")
    parser.add_argument("--device", required=True)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--state-dir", required=True, help="where its socket and pidfile live")
    parser.add_argument("--kill-grace", type=float, default=defaults.KILL_WAIT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s host[{args.device}] %(levelname)s %(message)s")
    try:
        pidfile, listener = listen(args.state_dir, args.device)
    except AlreadyRunning:
        log.error("another execution host of %s is running", args.device)
        raise SystemExit(defaults.ALREADY_RUNNING_EXIT) from None
    try:
        Host(args.device, args.cuda, args.lanes, listener, args.kill_grace).run()
    finally:
        os.unlink(host_paths(args.state_dir, args.device)[1])
        pidfile.close()


if __name__ == "__main__":
    main()
