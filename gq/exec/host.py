"""Execution host: one process per device. Keeps workers resident and, at every iteration
boundary, grants the next iteration of each lane to ``policy.pick(...)``.

The hot path (READY → pick → GO) touches no database and no disk; the daemon gets
progress about once a second and every start and exit as it happens.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import logging
import os
import selectors
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from gq import policies
from gq.errors import LaunchError
from gq.exec.protocol import Channel
from gq.policies.base import JobView
from gq.wakeup import received, signal_socket

log = logging.getLogger("gq.host")
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
PROGRESS_PERIOD = 1.0
# A job whose gap between release and next acquire is this short is in a tight loop: when
# the policy prefers it, the lane waits for it rather than letting a less preferred job in
# for a whole iteration (anticipatory scheduling). Real idle gaps are longer and are filled.
ANTICIPATION_LIMIT = 0.002
HOUSEKEEPING_PERIOD = 0.01  # reap, kill deadlines, lanes a policy keeps idle


@dataclass
class Resident:
    job_id: int
    user: str
    priority: int
    submit_time: float
    steps_total: int | None
    lane: int
    process: subprocess.Popen
    channel: Channel | None  # None for plain processes (no iteration boundaries)
    started_at: float
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

    def view(self) -> JobView:
        return JobView(
            id=self.job_id, user=self.user, submit_time=self.submit_time, priority=self.priority,
            steps_done=self.steps_done, steps_total=self.steps_total, attained=self.attained,
            mean_iteration=self.mean_iteration,
            mean_gap=self.gap_total / self.gaps if self.gaps else None,
            released_at=self.released_at,
        )

    def progress(self) -> dict[str, Any]:
        return {"job": self.job_id, "steps_done": self.steps_done,
                "steps_total": self.steps_total, "attained": self.attained,
                "mean_iteration": self.mean_iteration, "mem_persistent": self.mem_persistent,
                "mem_peak": self.mem_peak, "holds_lane": self.state == "running"}


@dataclass
class Lane:
    index: int
    holder: Resident | None = None
    residents: list[Resident] = field(default_factory=list)
    anticipating: int | None = None  # job id the lane is kept free for, briefly
    anticipate_until: float = 0.0


class Host:
    def __init__(self, device: str, cuda: bool, lanes: int, daemon: Channel,
                 kill_grace: float):
        self.device = device
        self.cuda = cuda
        self.lanes = [Lane(i) for i in range(max(1, lanes))]
        self.daemon = daemon
        self.kill_grace = kill_grace
        self.policy = policies.make("fifo")
        self.residents: dict[int, Resident] = {}
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.child_exited = False
        self._next_housekeeping = 0.0
        self._last_progress = 0.0

    # ----- the loop -------------------------------------------------------------------
    def run(self) -> None:
        wake_read = signal_socket((signal.SIGCHLD, signal.SIGTERM, signal.SIGINT))
        self.selector.register(self.daemon.sock, selectors.EVENT_READ, "daemon")
        self.selector.register(wake_read, selectors.EVENT_READ, "signal")
        while not (self.stopping and not self.residents):
            events = self.selector.select(self._timeout())
            for key, _ in events:
                if key.data == "daemon":
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
                self._enforce_kills()
                self._schedule_waiting_lanes()
            self._maybe_send_progress()

    def _timeout(self) -> float:
        timeout = 0.25 if self.residents else PROGRESS_PERIOD
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

    # ----- daemon messages ------------------------------------------------------------
    def _from_daemon(self) -> None:
        for message in self.daemon.receive():
            op = message["op"]
            if op == "launch":
                self._launch(message["job"])
            elif op == "kill":
                self._kill(int(message["job"]))
            elif op == "update":
                resident = self.residents.get(int(message["job"]))
                if resident is not None:
                    resident.priority = int(message["priority"])
            elif op == "policy":
                self._set_policy(message.get("name", "fifo"), message.get("fill", "always"))
            elif op == "shutdown":
                self._shutdown()
            else:
                log.warning("unknown op from daemon: %r", op)
        if self.daemon.closed:  # the daemon is gone: nobody will record our jobs
            log.error("daemon connection closed; stopping all jobs")
            os._exit(1)  # PDEATHSIG takes the workers down with us

    def _set_policy(self, name: str, fill: str) -> None:
        try:
            self.policy = policies.make(name, fill)
        except ValueError as exc:
            log.warning("ignoring policy change: %s", exc)
            return
        for lane in self.lanes:
            self._schedule(lane)

    def _launch(self, spec: dict[str, Any]) -> None:
        job_id = int(spec["id"])
        try:
            resident = self._spawn(spec)
        except LaunchError as exc:
            self.daemon.send({"op": "launch_failed", "job": job_id, "reason": str(exc)})
            return
        self.residents[job_id] = resident
        self.lanes[resident.lane].residents.append(resident)
        if resident.channel is not None:
            self.selector.register(resident.channel.sock, selectors.EVENT_READ, resident)
        self.daemon.send({"op": "started", "job": job_id, "pid": resident.process.pid})

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
            process = _start_as_submitter(spec, env, pass_fds)
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
            job_id=job_id, user=spec.get("user", ""), priority=int(spec.get("priority", 0)),
            submit_time=float(spec.get("submit_time", 0.0)), steps_total=spec.get("steps_total"),
            lane=int(lane), process=process, channel=channel, started_at=time.monotonic(),
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
        if view.mean_gap is None or view.mean_gap > ANTICIPATION_LIMIT:
            return
        ready = [r.view() for r in lane.residents if r.state == "ready"]
        if not ready:
            return
        preferred = self.policy.pick(ready + [view], [r.view() for r in lane.residents], now)
        if preferred is not None and preferred.id == released.job_id:
            lane.anticipating = released.job_id
            lane.anticipate_until = now + min(ANTICIPATION_LIMIT, 4 * view.mean_gap + 0.0002)

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
        if chosen.channel is None or not chosen.channel.send({"op": "go",
                                                               "empty_cache": shared}):
            return
        chosen.state = "running"
        chosen.granted_at = time.monotonic()
        lane.holder = chosen

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
            _kill_group(resident.process.pid, signal.SIGKILL)  # leftover children
            del self.residents[resident.job_id]
            self._leave_lane(resident)
            report = resident.progress()
            report.update(op="exited", code=code if code >= 0 else None,
                          signal=-code if code < 0 else None)
            self.daemon.send(report)

    def _kill(self, job_id: int) -> None:
        resident = self.residents.get(job_id)
        if resident is None or resident.kill_deadline is not None:
            return
        _kill_group(resident.process.pid, signal.SIGTERM)
        resident.kill_deadline = time.monotonic() + self.kill_grace

    def _enforce_kills(self) -> None:
        now = time.monotonic()
        for resident in self.residents.values():
            if resident.kill_deadline is not None and now >= resident.kill_deadline:
                _kill_group(resident.process.pid, signal.SIGKILL)

    def _shutdown(self) -> None:
        self.stopping = True
        for job_id in list(self.residents):
            self._kill(job_id)

    def _maybe_send_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress < PROGRESS_PERIOD:
            return
        self._last_progress = now
        changed = [r for r in self.residents.values() if r.dirty]
        for resident in changed:
            resident.dirty = False
        if changed:
            self.daemon.send({"op": "progress", "jobs": [r.progress() for r in changed]})


def _start_as_submitter(spec: dict[str, Any], env: dict[str, str],
                        pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """Popen drops to the submitter's uid, gid and groups (when the host runs as root) and
    sets their umask; then, already as them, the child enters the working directory and
    opens the output files, so their rights decide where output may go, and a link planted
    at the output path is not followed."""
    uid, gid = spec.get("uid"), spec.get("gid")
    as_submitter = {}
    if os.geteuid() == 0 and uid is not None and gid is not None and uid != 0:
        as_submitter = {"user": int(uid), "group": int(gid),
                        "extra_groups": [int(g) for g in spec.get("groups") or [gid]]}
    error_read, error_write = os.pipe()
    stdout, stderr, cwd = spec["stdout"], spec["stderr"], spec["cwd"]

    def in_child() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid change
        try:
            os.chdir(cwd)
        except OSError as exc:
            os.write(error_write, f"cannot enter working directory {cwd}: {exc.strerror}"
                     .encode())
            raise
        out = _open_output(stdout, error_write)
        err = out if stderr == stdout else _open_output(stderr, error_write)
        os.dup2(out, 1)
        os.dup2(err, 2)

    try:
        return subprocess.Popen(
            spec["argv"], env=env, stdin=subprocess.DEVNULL, pass_fds=pass_fds,
            start_new_session=True, umask=int(spec.get("umask", 0o022)),
            preexec_fn=in_child, **as_submitter)
    except subprocess.SubprocessError:
        os.set_blocking(error_read, False)
        try:
            reason = os.read(error_read, 4096).decode(errors="replace")
        except BlockingIOError:
            reason = ""
        raise LaunchError(reason or "the job's process could not be set up") from None
    except OSError as exc:
        raise LaunchError(f"cannot start {spec['argv'][0]}: {exc.strerror}") from exc
    finally:
        os.close(error_read)
        os.close(error_write)


def _open_output(path: str, error_write: int) -> int:
    """In the child, as the submitter: append to the output file, never through a link."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            reason = f"output file {path} is a symbolic link; gq does not follow it"
        else:
            reason = f"cannot open output file {path}: {exc.strerror}"
        os.write(error_write, reason.encode())
        raise


def _kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description="gq execution host (started by the daemon)")
    parser.add_argument("--device", required=True)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--fd", type=int, required=True, help="socket connected to the daemon")
    parser.add_argument("--kill-grace", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s host[{args.device}] %(levelname)s %(message)s")
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    daemon_sock = socket.socket(fileno=args.fd)
    daemon_sock.setblocking(False)
    Host(args.device, args.cuda, args.lanes, Channel(daemon_sock), args.kill_grace).run()


if __name__ == "__main__":
    main()
