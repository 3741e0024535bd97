"""The host's watch on jobs whose --host-mem no cgroup holds (v2 without its memory
controller passed on to gq's cgroups, or no cgroup at all): what their processes hold is
read in a thread of the host's own. Reading a process's proportional set size walks its
mappings under its memory lock, so the job decides how long a reading takes (thousands of
mappings, or threads that keep the lock busy: seconds); the host's loop grants the device's
other jobs their iterations meanwhile, and acts on each reading as it comes
(:class:`HostMemoryLimits`: which jobs are read, and ending those over their limit)."""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gq import defaults
from gq.exec.cgroups.job_cgroups import JobCgroup, held_bytes, resident_bytes
from gq.exec.host.messages import StopWhy
from gq.exec.host.process_groups import group_members
from gq.exec.lane.residents import Resident
from gq.units import format_size

log = logging.getLogger("gq.host")


@dataclass(frozen=True)
class Watched:
    """A job to read: its processes are its cgroup's, or where it has none, its process
    group's (read just before they are summed)."""

    job_id: int
    run: int
    limit: int  # bytes: its --host-mem
    cgroup: JobCgroup | None
    pgid: int


@dataclass(frozen=True)
class Reading:
    job: Watched
    held: int  # bytes its processes held, summed (shared pages split among their sharers)


class MemoryWatch:
    """Reads the jobs it is asked for, one after another, in its thread; the host asks
    again only once the last readings are in (:attr:`busy`), and learns of them through
    :attr:`wake`, a socket it polls with its others."""

    def __init__(self) -> None:
        self.wake, self._waker = socket.socketpair()
        self.wake.setblocking(False)
        self._waker.setblocking(False)
        self._ready = threading.Condition()
        self._asked: list[Watched] | None = None
        self._readings: list[Reading] = []
        self.busy = False
        threading.Thread(target=self._run, name="memory-watch", daemon=True).start()

    def ask(self, jobs: list[Watched]) -> None:
        """Read these jobs (the host calls it only while not :attr:`busy`)."""
        with self._ready:
            self.busy = True
            self._asked = jobs
            self._ready.notify()

    def take(self) -> list[Reading]:
        """The readings made since the last call."""
        try:
            while self.wake.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._ready:
            readings, self._readings = self._readings, []
            return readings

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._asked is None:
                    self._ready.wait()
                jobs, self._asked = self._asked, None
            try:
                self._read(jobs)
            except Exception:  # noqa: BLE001 - the watch must outlive any one round
                log.exception("the memory watch failed a round (it goes on)")
            finally:
                with self._ready:
                    self.busy = False
                self._signal()

    def _read(self, jobs: list[Watched]) -> None:
        """Resident sizes first (microseconds a process, taking no lock of the job's): a
        job within its limit by them holds less still; only the others' processes are read
        for what they share, so that a slow reading costs only the jobs that may be over."""
        over = []
        for job in jobs:
            try:
                pids = job.cgroup.pids() if job.cgroup is not None else group_members(job.pgid)
            except OSError:  # its cgroup gone, no descriptor left for /proc: next round
                continue
            if resident_bytes(pids) > job.limit:
                over.append((job, pids))
        for job, pids in over:
            reading = Reading(job, held_bytes(pids))
            with self._ready:
                self._readings.append(reading)
            self._signal()

    def _signal(self) -> None:
        try:
            self._waker.send(b"r")
        except BlockingIOError:  # a wake-up is pending already
            pass


class HostMemoryLimits:
    """The host's side of the watch: which of its resident jobs (the host's own dict) are
    read, and ending those read to hold more than their --host-mem (through ``kill``, the
    jobs' processes' :meth:`~gq.exec.host.job_processes.JobProcesses.kill`)."""

    def __init__(
        self,
        residents: dict[int, Resident],
        selector: selectors.BaseSelector,
        kill: Callable[[Resident, StopWhy, float], None],
    ):
        self.residents = residents
        self.selector = selector
        self.kill = kill
        self.next_ask = 0.0  # monotonic: when watch asks again
        self.memory_watch: MemoryWatch | None = None  # made for the first job it watches

    def watch(self) -> None:
        """Jobs whose --host-mem no cgroup holds (v2's memory controller not passed on to
        them, or no cgroup): every HOST_MEMORY_WATCH seconds, once the last readings are in,
        their watch (:class:`MemoryWatch`) is asked to read what their processes hold;
        :meth:`on_readings` acts on what it reads."""
        now = time.monotonic()
        watch = self.memory_watch
        if now < self.next_ask or (watch is not None and watch.busy):
            return
        self.next_ask = now + defaults.HOST_MEMORY_WATCH
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

    def on_readings(self) -> None:
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
            self.kill(resident, StopWhy.HOST_MEMORY, 0.0)  # no grace
