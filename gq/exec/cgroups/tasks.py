"""A cgroup's tasks (processes and threads), as its pids controller counts and limits them:
a job's limit (--max-pids), what ``gq show`` says of it (tasks now, the limit, the forks
the kernel refused there), and the bound on all of one gq instance's jobs together, a share
of the node's PIDs, so that the rest stay the node's whatever its jobs fork. Read and
written through :mod:`gq.exec.cgroups.files`; used by :mod:`gq.exec.cgroups.job_cgroups`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gq import defaults
from gq.exec.cgroups import files
from gq.exec.cgroups.hierarchies import V2

HIERARCHIES = (V2, "pids")  # where pids.max, pids.current and pids.events are


@dataclass(frozen=True)
class Tasks:
    """What a cgroup's pids controller says: its tasks now, its limit (None: none), and
    how many forks and clones the kernel refused at a limit."""

    current: int
    limit: int | None
    refused: int


def limit(path: str, tasks: int) -> bool:
    """Let the cgroup at ``path`` hold at most ``tasks`` tasks: a fork or clone past it
    fails with EAGAIN in that cgroup alone. False where the kernel refuses (no pids
    controller serves it)."""
    return files.write(path, "pids.max", str(tasks))


def counted(path: str) -> Tasks | None:
    """The cgroup's tasks as the kernel counts them; None where no pids controller serves
    it (or it does not exist)."""
    current = files.number(files.read(path, "pids.current"))
    if current is None:
        return None
    refused = 0
    for line in files.read(path, "pids.events").splitlines():
        key, _, value = line.partition(" ")
        if key == "max":
            refused = files.number(value) or 0
    return Tasks(current, files.number(files.read(path, "pids.max")), refused)


def node_bound() -> int:
    """``defaults.NODE_PIDS_SHARE`` of the tasks the node can have at once: the lower of
    the kernel's pid_max and threads-max (each limits tasks, threads included)."""
    limits = [
        files.number(files.read("/proc/sys/kernel", name)) for name in ("pid_max", "threads-max")
    ]
    known = [value for value in limits if value]
    node = min([*known, defaults.MAX_PIDS_CEILING])
    return max(1, int(node * defaults.NODE_PIDS_SHARE))
