"""A cgroup for each job: every process a job starts (daemonised or not) stays in it, so
the job is killed whole when it ends, is cancelled or its host dies, and its host-side
memory and process count can be read (as Slurm's proctrack/cgroup does).

Two backends behind one interface: cgroup v2 (the unified hierarchy, typically delegated to
the service by systemd with ``Delegate=yes``) and cgroup v1 (the freezer, memory and pids
hierarchies, whichever are mounted). A job's cgroup is ``<base>/<device>/job-<id>.<run>`` in
each hierarchy used, where ``<base>`` is ``gq-<scope>`` under the calling process's own
cgroup (on v2, beside it where that is systemd's ``supervisor`` leaf of a delegated unit: v2
passes controllers only below cgroups that hold no processes): one gq instance (one state
directory) never meets another's cgroups, and its daemon and hosts, which share their
cgroups, work out the same paths. :func:`detect` returns None where there is no hierarchy
this process may use; callers then keep jobs in process groups.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

KINDS = ("auto", "v2", "v1", "off")
V2 = "unified"  # the v2 hierarchy's key in a backend's bases and a job's paths
_V1_HIERARCHIES = ("freezer", "memory", "pids", "cpu")
_V2_CONTROLLERS = ("memory", "pids", "cpu")
# The leaf of its unit's cgroup that systemd starts the daemon in (DelegateSubgroup=, as
# packaging/gq.service asks): gq's cgroups go beside it on v2.
SUPERVISOR = "supervisor"
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
            _put(procs, pid)

    def limit(self, memory: int | None, cpus: int | None) -> list[str]:
        """Cap its memory (bytes, swap included where v1 counts it) and its CPU time (``cpus``
        CPUs' worth per period), as Slurm's task/cgroup does; what it asks for and cannot
        cap here (no such controller) is returned, for the log."""
        unenforced = []
        if memory is not None:
            self.memory_limited = self._limit_memory(memory)
            if not self.memory_limited:
                unenforced.append("its memory limit")
        if cpus is not None:
            quota = f"{cpus * _CPU_PERIOD} {_CPU_PERIOD}"
            done = (
                _write(self.paths[V2], "cpu.max", quota)
                if self.v2
                else "cpu" in self.paths
                and _write(self.paths["cpu"], "cpu.cfs_period_us", str(_CPU_PERIOD))
                and _write(self.paths["cpu"], "cpu.cfs_quota_us", str(cpus * _CPU_PERIOD))
            )
            if not done:
                unenforced.append("its CPU count")
        return unenforced

    def _limit_memory(self, memory: int) -> bool:
        if self.v2:
            # No swapping past the limit either: the job is killed there, as on a cluster.
            done = _write(self.paths[V2], "memory.max", str(memory))
            _write(self.paths[V2], "memory.swap.max", "0")
            return done
        if "memory" not in self.paths:
            return False
        done = _write(self.paths["memory"], "memory.limit_in_bytes", str(memory))
        _write(self.paths["memory"], "memory.memsw.limit_in_bytes", str(memory))
        return done

    def pids(self) -> list[int]:
        """The processes in it now, in any of its hierarchies (none where it does not exist)."""
        found: set[int] = set()
        for path in self.paths.values():
            found.update(int(pid) for pid in _read(path, "cgroup.procs").split())
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
        if self.v2 and _write(self.paths[V2], "cgroup.kill", "1"):
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
        if not _write(path, control, value):
            return False
        deadline = time.monotonic() + _FREEZE_WAIT
        while frozen and not self._is_frozen() and time.monotonic() < deadline:
            time.sleep(0.001)
        return True

    def _is_frozen(self) -> bool:
        """Whether the freeze holds (or there is nothing left to wait for)."""
        if self.v2:
            events = _read(self.paths[V2], "cgroup.events")
            return not events or "frozen 1" in events.splitlines()
        return _read(self.paths["freezer"], "freezer.state").strip() in ("FROZEN", "")

    def usage(self, processes_summed: int = 0) -> Usage:
        """What it holds: the memory charged to it, or where no memory controller serves
        it, its processes' resident sizes summed (a few microseconds each, whatever the
        process; pages they share count in each: the watch reads what they hold, at a cost
        the job decides, in the host's thread). None where it has no processes, or more
        than ``processes_summed``."""
        memory = None
        for hierarchy, control in _MEMORY_FILES.items():
            if hierarchy in self.paths:
                memory = _number(_read(self.paths[hierarchy], control))
        pids = self.pids()
        if memory is None and 0 < len(pids) <= processes_summed:
            return Usage(memory=resident_bytes(pids), processes=len(pids), summed=len(pids))
        return Usage(memory=memory, processes=len(pids))

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed at its memory limit (0 where no
        memory hierarchy serves it, or the kernel does not count them)."""
        if self.v2:
            text = _read(self.paths[V2], "memory.events")
        elif "memory" in self.paths:
            text = _read(self.paths["memory"], "memory.oom_control")
        else:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return _number(value) or 0
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
    decides how long it takes (gq.exec.memory_watch reads it in a thread)."""
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
        """Make the run's cgroup (and its parents) in every hierarchy; OSError on failure."""
        cgroup = self.job(device, job_id, run)
        for hierarchy, path in cgroup.paths.items():
            device_dir = os.path.dirname(path)
            _make(device_dir)
            if hierarchy == V2:
                base = self.bases[V2]
                _offer_controllers(os.path.dirname(base), base, device_dir)
            _make(path)
        return cgroup

    def holds_memory(self) -> bool:
        """Whether its jobs' cgroups can hold a memory limit: v1's memory hierarchy, or v2's
        memory controller passed on to the base (offered to it as it was detected)."""
        if self.kind == "v1":
            return "memory" in self.bases
        return "memory" in _read(self.bases[V2], "cgroup.controllers").split()

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
    mounts, own = _mounts(), _own_cgroups()
    if kind in ("auto", "v2") and V2 in mounts:
        # Hybrid machines mount an empty v2 hierarchy beside v1's: auto leaves that alone.
        if kind == "v2" or "memory" in _read(mounts[V2][0], "cgroup.controllers").split():
            bases = _bases(mounts, own, (V2,), base_name)
            if bases:
                _offer_controllers(os.path.dirname(bases[V2]), bases[V2])
                return Cgroups("v2", bases)
    if kind in ("auto", "v1"):
        bases = _bases(mounts, own, _V1_HIERARCHIES, base_name)
        if bases:
            return Cgroups("v1", bases)
    return None


def _bases(
    mounts: dict[str, tuple[str, str]],
    own: dict[str, str],
    hierarchies: tuple[str, ...],
    base_name: str,
) -> dict[str, str]:
    """The base directory in each of ``hierarchies`` where this process may make cgroups."""
    bases = {}
    for hierarchy in hierarchies:
        if hierarchy not in mounts or hierarchy not in own:
            continue
        directory = _directory(*mounts[hierarchy], own[hierarchy])
        if directory is not None and hierarchy == V2:
            directory = _beside_supervisor(directory, base_name)
        if directory is not None and _usable(os.path.join(directory, base_name)):
            bases[hierarchy] = os.path.join(directory, base_name)
    return bases


def _beside_supervisor(directory: str, base_name: str) -> str:
    """Where gq's base goes on v2: in the daemon's own cgroup, or where that is the leaf
    systemd starts a delegated unit's main process in (DelegateSubgroup=supervisor), beside
    it, in the unit's cgroup (v2 passes controllers only below cgroups that hold no
    processes). Only where systemd marked that cgroup delegated (its ``trusted.delegate``
    attribute): a cgroup that merely has that name is not gq's to change."""
    if os.path.basename(directory) != SUPERVISOR:
        return directory
    unit = os.path.dirname(directory)
    if _delegated(unit) and _usable(os.path.join(unit, base_name)):
        return unit
    return directory


def _delegated(path: str) -> bool:
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, name).strip() in (b"1", b"yes", b"true"):
                return True
        except OSError:
            continue
    return False


def _mounts() -> dict[str, tuple[str, str]]:
    """Mount point and root of each hierarchy (V2, or a v1 controller of interest)."""
    found: dict[str, tuple[str, str]] = {}
    for line in _read("/proc/self", "mountinfo").splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) < separator + 4:
            continue
        fstype, options = fields[separator + 1], fields[separator + 3].split(",")
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            found.setdefault(V2, (point, root))
        elif fstype == "cgroup":
            for hierarchy in _V1_HIERARCHIES:
                if hierarchy in options:
                    found.setdefault(hierarchy, (point, root))
    return found


def _own_cgroups() -> dict[str, str]:
    """The calling process's cgroup in each hierarchy (V2, or a v1 controller)."""
    found: dict[str, str] = {}
    for line in _read("/proc/self", "cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for hierarchy in controllers.split(",") if controllers else [V2]:
            found[hierarchy] = path
    return found


def _directory(point: str, root: str, path: str) -> str | None:
    """Where cgroup ``path`` lies under a mount of the hierarchy's ``root``; None where that
    mount does not show it (a container's view, another cgroup namespace)."""
    if root != "/":
        if path != root and not path.startswith(root + "/"):
            return None
        path = path[len(root) :]
    parts = [part for part in path.split("/") if part]
    if ".." in parts:
        return None
    return os.path.join(point, *parts)


def _usable(base: str) -> bool:
    """Whether this process may make cgroups in ``base``, made here where missing (and
    kept: the instance's jobs go there). Never makes the parents: they are our own cgroup."""
    try:
        os.mkdir(base)
    except FileExistsError:
        pass
    except OSError:
        return False
    return os.access(base, os.W_OK | os.X_OK)


def _make(path: str) -> None:
    """mkdir -p, again where another host of the instance removed an empty parent meanwhile
    (``remove_device`` as it exits)."""
    for attempt in range(3):
        try:
            os.makedirs(path, exist_ok=True)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def _offer_controllers(*parents: str) -> None:
    """Offer memory, pids and cpu to the cgroups below each parent, top down, best effort,
    one by one (one the kernel refuses takes no other with it): a cgroup with processes of
    its own may not pass controllers on (v2's no-internal-processes rule), nor one not
    delegated to us; kill, freeze and the process list work without."""
    for parent in parents:
        available = _read(parent, "cgroup.controllers").split()
        enabled = _read(parent, "cgroup.subtree_control").split()
        for controller in _V2_CONTROLLERS:
            if controller in available and controller not in enabled:
                _write(parent, "cgroup.subtree_control", f"+{controller}")


def _plain(name: str) -> str:
    """``name``, where it is a plain directory name; else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{name!r} is not a plain name for a cgroup")
    return name


def _unescape(text: str) -> str:
    """A mountinfo field as the path it stands for (spaces and the like come as \\040)."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), text)


def _put(path: str, data: bytes) -> None:
    """Write a control file: one write, nothing buffered, created never (OSError)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _write(path: str, control: str, value: str) -> bool:
    """Write a control file; False where the kernel refuses (missing, busy, not allowed)."""
    try:
        _put(os.path.join(path, control), value.encode())
    except OSError:
        return False
    return True


def _read(path: str, control: str) -> str:
    """A control file's text; empty where it cannot be read (no such cgroup or file)."""
    try:
        with open(os.path.join(path, control)) as handle:
            return handle.read()
    except OSError:
        return ""


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None
