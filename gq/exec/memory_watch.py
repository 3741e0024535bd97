"""The host's watch on jobs whose --host-mem no cgroup holds (v2 without its memory
controller passed on to gq's cgroups, or no cgroup at all): what their processes hold is
read in a thread of the host's own. Reading a process's proportional set size walks its
mappings under its memory lock, so the job decides how long a reading takes (thousands of
mappings, or threads that keep the lock busy: seconds); the host's loop grants the device's
other jobs their iterations meanwhile, and acts on each reading as it comes."""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass

from gq.exec.cgroups import JobCgroup, held_bytes, resident_bytes
from gq.exec.spawn import group_members

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
