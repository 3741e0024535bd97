"""A cgroup for each job: every process a job starts (daemonised or not) stays in it, so
the job is killed whole when it ends, is cancelled or its host dies, and its host-side
memory and process count can be read (as Slurm's proctrack/cgroup does). Its memory, CPU
time and tasks (processes and threads: ``pids.max``) are capped where the controllers serve
it, and all of an instance's jobs together may hold only a share of the node's PIDs (the
base's ``pids.max``), so that no fork bomb takes the PIDs the rest of the node needs.

Two backends behind one interface: cgroup v2 (the unified hierarchy, typically delegated to
the service by systemd with ``Delegate=yes``) and cgroup v1 (the freezer, memory and pids
hierarchies, whichever are mounted). A job's cgroup is ``<base>/<device>/job-<id>.<run>`` in
each hierarchy used, where ``<base>`` is ``gq-<scope>`` under the calling process's own
cgroup (on v2, beside it where that is systemd's ``supervisor`` leaf of a delegated unit: v2
passes controllers only below cgroups that hold no processes): one gq instance (one state
directory) never meets another's cgroups, and its daemon and hosts, which share their
cgroups, work out the same paths. :func:`detect` returns None where there is no hierarchy
this process may use; callers then keep jobs in process groups. Finding the hierarchies and
the base is :mod:`gq.exec.cgroups.hierarchies`'s; their files are read and written through
:mod:`gq.exec.cgroups.files`; the pids controller's, through :mod:`gq.exec.cgroups.tasks`.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

from gq.exec.cgroups import files, hierarchies
from gq.exec.cgroups import tasks as cgroup_tasks
from gq.exec.cgroups.hierarchies import V2

KINDS = ("auto", "v2", "v1", "off")
_V2_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD = 100_000  # microseconds of the CPU quota's period (the kernel's default)
_MEMORY_FILES = {V2: "memory.current", "memory": "memory.usage_in_bytes"}
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_POLL = 0.01  # kill() looks whether the cgroup is empty this often
_PAGE = os.sysconf("SC_PAGE_SIZE")
# Freezing waits for every task to stop; one that never can (stuck in the kernel) must not
# hold its host up: it is killed unfrozen after this (a later pass kills what it forked).
_FREEZE_WAIT = 0.05


@dataclass(frozen=True)
class Usage:
    memory: int | None  # bytes charged to the cgroup, or its processes' resident sizes summed
    processes: int  # processes in it now
    summed: int = 0  # processes whose resident size was read for ``memory``
    tasks: cgroup_tasks.Tasks | None = None  # what its pids controller counts (None: none)


class JobCgroup:
    """One run of one job: the same relative directory in each hierarchy of its backend."""

    def __init__(self, name: str, paths: dict[str, str]):
        self.name = name  # e.g. cpu0/job-17.2, for logs
        self.paths = paths  # hierarchy (V2, or a v1 controller) -> directory
        self.v2 = V2 in paths
        # Worked out now: enter() runs in a forked child, where only system calls are safe.
        self._procs = [os.path.join(path, "cgroup.procs") for path in paths.values()]
        self._signalled: set[int] = set()  # listed pids kill() has sent SIGKILL already
        # Whether its memory limit holds (limit() says): not where v2's memory controller is
        # not passed on to it (the cgroup above holds processes, or was not delegated).
        self.memory_limited = False

    def enter(self) -> None:
        """Move the calling process in, in every hierarchy (OSError where it cannot). Runs in
        a job's forked child, still as root, before it drops privileges and execs."""
        pid = str(os.getpid()).encode()
        for procs in self._procs:
            files.put(procs, pid)

    def limit(self, memory: int | None, cpus: int | None, tasks: int | None = None) -> list[str]:
        """Cap its memory (bytes, swap included where v1 counts it), its CPU time (``cpus``
        CPUs' worth per period), as Slurm's task/cgroup does, and its tasks (processes and
        threads: a fork past ``tasks`` fails with EAGAIN in this job alone); what it asks
        for and cannot cap here (no such controller) is returned, for the log."""
        unenforced = []
        if tasks is not None and not self._limit_tasks(tasks):
            unenforced.append(f"its limit of {tasks} tasks")
        if memory is not None:
            self.memory_limited = self._limit_memory(memory)
            if not self.memory_limited:
                unenforced.append("its memory limit")
        if cpus is not None:
            quota = f"{cpus * _CPU_PERIOD} {_CPU_PERIOD}"
            done = (
                files.write(self.paths[V2], "cpu.max", quota)
                if self.v2
                else "cpu" in self.paths
                and files.write(self.paths["cpu"], "cpu.cfs_period_us", str(_CPU_PERIOD))
                and files.write(self.paths["cpu"], "cpu.cfs_quota_us", str(cpus * _CPU_PERIOD))
            )
            if not done:
                unenforced.append("its CPU count")
        return unenforced

    def _limit_memory(self, memory: int) -> bool:
        if self.v2:
            # No swapping past the limit either: the job is killed there, as on a cluster.
            done = files.write(self.paths[V2], "memory.max", str(memory))
            files.write(self.paths[V2], "memory.swap.max", "0")
            return done
        if "memory" not in self.paths:
            return False
        done = files.write(self.paths["memory"], "memory.limit_in_bytes", str(memory))
        files.write(self.paths["memory"], "memory.memsw.limit_in_bytes", str(memory))
        return done

    def _limit_tasks(self, tasks: int) -> bool:
        path = self._pids_path()
        return path is not None and cgroup_tasks.limit(path, tasks)

    def _pids_path(self) -> str | None:
        """Its directory in the hierarchy that counts its tasks (None: none here)."""
        return next((self.paths[h] for h in cgroup_tasks.HIERARCHIES if h in self.paths), None)

    def tasks(self) -> cgroup_tasks.Tasks | None:
        """Its tasks, their limit and the forks refused at it, as the kernel counts them;
        None where no pids controller serves it (or it does not exist)."""
        path = self._pids_path()
        return None if path is None else cgroup_tasks.counted(path)

    def pids(self) -> list[int]:
        """The processes in it now, in any of its hierarchies (none where it does not exist)."""
        found: set[int] = set()
        for path in self.paths.values():
            found.update(int(pid) for pid in files.read(path, "cgroup.procs").split())
        return sorted(found)

    def kill(self, timeout: float) -> bool:
        """SIGKILL every process in it, atomically where the kernel can, then wait up to
        ``timeout`` for it to empty. True when empty (one that does not exist is empty)."""
        deadline = time.monotonic() + timeout
        while True:
            listed = set(self.pids())
            self._signalled &= listed  # a pid that comes back later is another process
            if not listed:
                return True
            # Killed processes may take long to exit (a big address space to tear down):
            # kill again only when one appears that was not there last time.
            if listed - self._signalled:
                self._kill_all()
                self._signalled |= listed
            if time.monotonic() >= deadline:
                return not self.pids()
            time.sleep(_POLL)

    def _kill_all(self) -> None:
        """SIGKILL everything in it, with nothing able to fork meanwhile where the kernel
        allows: v2's cgroup.kill, else the processes frozen while they are signalled."""
        if self.v2 and files.write(self.paths[V2], "cgroup.kill", "1"):
            return
        frozen = self._freeze(True)
        try:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass  # gone already
        finally:
            if frozen:
                self._freeze(False)  # a frozen process dies of its SIGKILL once thawed

    def freeze(self, frozen: bool) -> bool:
        """Freeze every process in it (suspend), or thaw them; False where no freezer
        serves it (the caller stops the processes with signals instead)."""
        return self._freeze(frozen)

    def _freeze(self, frozen: bool) -> bool:
        """Freeze (waiting until it holds) or thaw it; False where no freezer serves it."""
        if self.v2:
            path, control, value = self.paths[V2], "cgroup.freeze", "1" if frozen else "0"
        elif "freezer" in self.paths:
            path, control = self.paths["freezer"], "freezer.state"
            value = "FROZEN" if frozen else "THAWED"
        else:
            return False
        if not files.write(path, control, value):
            return False
        deadline = time.monotonic() + _FREEZE_WAIT
        while frozen and not self._is_frozen() and time.monotonic() < deadline:
            time.sleep(0.001)
        return True

    def _is_frozen(self) -> bool:
        """Whether the freeze holds (or there is nothing left to wait for)."""
        if self.v2:
            events = files.read(self.paths[V2], "cgroup.events")
            return not events or "frozen 1" in events.splitlines()
        return files.read(self.paths["freezer"], "freezer.state").strip() in ("FROZEN", "")

    def usage(self, processes_summed: int = 0) -> Usage:
        """What it holds: the memory charged to it, or where no memory controller serves
        it, its processes' resident sizes summed (a few microseconds each, whatever the
        process; pages they share count in each: the watch reads what they hold, at a cost
        the job decides, in the host's thread). None where it has no processes, or more
        than ``processes_summed``."""
        memory = None
        for hierarchy, control in _MEMORY_FILES.items():
            if hierarchy in self.paths:
                memory = files.number(files.read(self.paths[hierarchy], control))
        pids, tasks = self.pids(), self.tasks()
        if memory is None and 0 < len(pids) <= processes_summed:
            return Usage(resident_bytes(pids), len(pids), summed=len(pids), tasks=tasks)
        return Usage(memory=memory, processes=len(pids), tasks=tasks)

    def memory_room(self) -> int | None:
        """Bytes its processes may still take under its memory limit (None: no limit
        holds here)."""
        if not self.memory_limited:
            return None
        hierarchy = V2 if self.v2 else "memory"
        limit = files.number(
            files.read(self.paths[hierarchy], "memory.max" if self.v2 else "memory.limit_in_bytes")
        )
        used = files.number(files.read(self.paths[hierarchy], _MEMORY_FILES[hierarchy]))
        return None if limit is None else max(0, limit - (used or 0))

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed at its memory limit (0 where no
        memory hierarchy serves it, or the kernel does not count them)."""
        if self.v2:
            text = files.read(self.paths[V2], "memory.events")
        elif "memory" in self.paths:
            text = files.read(self.paths["memory"], "memory.oom_control")
        else:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return files.number(value) or 0
        return 0

    def remove(self) -> None:
        """Remove it from every hierarchy, where it exists and is empty."""
        for path in self.paths.values():
            try:
                os.rmdir(path)
            except OSError:
                pass


def resident_bytes(pids) -> int:
    """The resident sizes of the processes ``pids``, summed (those gone are left out)."""
    return sum(_resident(int(pid)) for pid in pids)


def _resident(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def held_bytes(pids) -> int:
    """The memory the processes ``pids`` hold, summed, where no memory controller counts
    it: each page that several of them share (a fork's copy-on-write pages, libraries)
    split among its sharers, not counted once per process (the proportional set size, as
    Slurm's UsePss counts; the resident size where the kernel gives none). Those gone are
    left out. Reading it walks each process's mappings under its memory lock: the job
    decides how long it takes (gq.exec.host.memory_watch reads it in a thread)."""
    return sum(_proportional(int(pid)) for pid in pids)


def _proportional(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return _resident(pid)


class Cgroups:
    """Where one gq instance keeps its jobs' cgroups: ``bases`` maps each hierarchy used
    to ``<mount><own cgroup>/gq-<scope>``."""

    def __init__(self, kind: str, bases: dict[str, str]):
        self.kind = kind  # "v2" or "v1"
        self.bases = bases

    def job(self, device: str, job_id: int, run: int) -> JobCgroup:
        """The run's cgroup (naming only: nothing is read or made)."""
        name = f"{_plain(device)}/job-{int(job_id)}.{int(run)}"
        return JobCgroup(
            name, {hierarchy: os.path.join(base, name) for hierarchy, base in self.bases.items()}
        )

    def create(self, device: str, job_id: int, run: int) -> JobCgroup:
        """Make the run's cgroup (and its parents) in every hierarchy; OSError on failure.
        All of the instance's jobs together are bounded by the base's pids.max (see
        :func:`gq.exec.cgroups.tasks.node_bound`), where a pids controller serves it; the
        daemon and hosts are above the base, and fork on whatever the jobs hold."""
        cgroup = self.job(device, job_id, run)
        for hierarchy, path in cgroup.paths.items():
            device_dir = os.path.dirname(path)
            files.make(device_dir)
            if hierarchy == V2:
                base = self.bases[V2]
                _offer_controllers(os.path.dirname(base), base, device_dir)
            if hierarchy in cgroup_tasks.HIERARCHIES:
                # Again at every launch: the base goes when its last host exits, and comes
                # back with the next job's directories, unbounded.
                cgroup_tasks.limit(self.bases[hierarchy], cgroup_tasks.node_bound())
            files.make(path)
        return cgroup

    def holds_memory(self) -> bool:
        """Whether its jobs' cgroups can hold a memory limit: v1's memory hierarchy, or v2's
        memory controller passed on to the base (offered to it as it was detected)."""
        if self.kind == "v1":
            return "memory" in self.bases
        return "memory" in files.read(self.bases[V2], "cgroup.controllers").split()

    def holds_tasks(self) -> bool:
        """Whether its jobs' cgroups can hold a limit on their tasks (--max-pids): v1's pids
        hierarchy, or v2's pids controller passed on to the base."""
        if self.kind == "v1":
            return "pids" in self.bases
        return "pids" in files.read(self.bases[V2], "cgroup.controllers").split()

    def job_of(self, pid: int) -> int | None:
        """The job of this instance whose cgroup holds process ``pid``, or None: a process
        a job started stays in its cgroup however it left its parent's tree (daemonised,
        reparented to init), so this is what names the job of a process NVML lists. The
        membership text only proposes a job (a path elsewhere may end the same way): the
        process must be listed in that job's cgroup under this instance's own base."""
        try:
            with open(f"/proc/{int(pid)}/cgroup") as handle:
                text = handle.read(65536)
        except (OSError, ValueError):
            return None
        names = {os.path.basename(base) for base in self.bases.values()}
        for name in names:
            found = job_in(text, name)
            if found is None:
                continue
            device, job_id, run = found
            try:
                cgroup = self.job(device, job_id, run)
            except ValueError:
                continue
            if int(pid) in cgroup.pids():
                return job_id
        return None

    def remove_device(self, device: str) -> None:
        """Remove the device's directory, and the instance's base, where they are empty."""
        for base in self.bases.values():
            for path in (os.path.join(base, _plain(device)), base):
                try:
                    os.rmdir(path)
                except OSError:
                    pass


def job_in(membership: str, base_name: str) -> tuple[str, int, int] | None:
    """The (device, job id, run) a process's ``/proc/PID/cgroup`` text (``ID:CONTROLLERS:
    PATH`` lines) names, where one of its paths has ``<base_name>/<device>/job-<id>.<run>``
    (or a directory below it), else None. Pure, and only a proposal: a path can be anything
    a cgroup may be named (see :meth:`Cgroups.job_of`)."""
    for line in membership.splitlines():
        parts = line.split(":", 2)[-1].split("/")
        for at, part in enumerate(parts[:-2]):
            device = parts[at + 1]
            if part != base_name or not _NAME.fullmatch(device) or device in (".", ".."):
                continue
            matched = _JOB_DIRECTORY.fullmatch(parts[at + 2])
            if matched is not None:
                return device, int(matched.group(1)), int(matched.group(2))
    return None


_JOB_DIRECTORY = re.compile(r"job-([0-9]{1,18})\.([0-9]{1,18})")


def detect(kind: str, scope: str) -> Cgroups | None:
    """The backend to use (``kind``: auto, v2, v1 or off), or None where none is usable.
    ``auto`` takes v2 where its hierarchy offers the memory controller (a v2 machine), else
    v1's hierarchies, else nothing. Makes the instance's base directory, which it keeps."""
    if kind not in KINDS:
        raise ValueError(f"unknown cgroup kind {kind!r}; expected one of {', '.join(KINDS)}")
    base_name = f"gq-{_plain(scope)}"
    if kind == "off":
        return None
    mounts, own = hierarchies.mounts(), hierarchies.own_cgroups()
    if kind in ("auto", "v2") and V2 in mounts:
        # Hybrid machines mount an empty v2 hierarchy beside v1's: auto leaves that alone.
        if kind == "v2" or "memory" in files.read(mounts[V2][0], "cgroup.controllers").split():
            bases = hierarchies.bases(mounts, own, (V2,), base_name)
            if bases:
                _offer_controllers(os.path.dirname(bases[V2]), bases[V2])
                return Cgroups("v2", bases)
    if kind in ("auto", "v1"):
        bases = hierarchies.bases(mounts, own, hierarchies.V1_HIERARCHIES, base_name)
        if bases:
            return Cgroups("v1", bases)
    return None


def _offer_controllers(*parents: str) -> None:
    """Offer memory, pids and cpu to the cgroups below each parent, top down, best effort,
    one by one (one the kernel refuses takes no other with it): a cgroup with processes of
    its own may not pass controllers on (v2's no-internal-processes rule), nor one not
    delegated to us; kill, freeze and the process list work without."""
    for parent in parents:
        available = files.read(parent, "cgroup.controllers").split()
        enabled = files.read(parent, "cgroup.subtree_control").split()
        for controller in _V2_CONTROLLERS:
            if controller in available and controller not in enabled:
                files.write(parent, "cgroup.subtree_control", f"+{controller}")


def _plain(name: str) -> str:
    """``name``, where it is a plain directory name; else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{name!r} is not a plain name for a cgroup")
    return name
