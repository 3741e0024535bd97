"""A job's processes seen from outside, as a host or the daemon (root) signals and reads them:
its process group signalled and listed from /proc, the srun tasks among its processes, and
a name's value in a process's starting environment, read within a bound (a job controls
how much there is). Starting the process is :mod:`gq.exec.host.spawn`'s."""

from __future__ import annotations

import os


def kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_outside_group(pids: list[int], pgid: int, signum: int) -> None:
    """Signal those of ``pids`` (a job's cgroup's) that are not in process group ``pgid``:
    the ones that left it (a session or group of their own). Those in it had the signal
    from :func:`kill_group` already, and a second SIGTERM runs a handler twice."""
    for pid in pids:
        try:
            if os.getpgid(pid) != pgid:
                os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # gone already


def signal_each(pids, signum: int) -> None:
    """Signal each process of ``pids`` that is still there to be signalled."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def warn_steps(main: int, members: set[int], signum: int, batch_only: bool) -> int:
    """sbatch's --signal: with B: (``batch_only``) to the job's main process (its batch
    shell); else to the job's steps, as Slurm sends it: the tasks srun started among
    ``members`` (its cgroup's processes; none known: its group's), otherwise the main
    process (a Python script is its own step). Never to the processes a step forked for
    itself (DataLoader workers die of SIGUSR1, or run the handler they inherited in place of
    the script's), nor to srun, which would pass it on again. How many srun tasks had it."""
    tasks = set() if batch_only else step_tasks(members or group_members(main))
    signal_each(tasks or {main}, signum)
    return len(tasks)


def group_members(pgid: int) -> set[int]:
    """The processes of a process group now (read from /proc; those that are gone or
    cannot be read are left out)."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "(comm)": state, ppid, pgrp
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.add(int(entry))
    return members


def step_tasks(pids: set[int]) -> set[int]:
    """The processes among ``pids`` that srun started: gq's srun puts each task's own pid in
    its environment as ``SLURM_TASK_PID`` (as slurmstepd does), which the processes a task
    forks for itself (DataLoader workers, multiprocessing's helpers) inherit with their
    parent's pid, not their own."""
    return {pid for pid in pids if _task_pid(pid) == pid}


def _task_pid(pid: int) -> int | None:
    """``SLURM_TASK_PID`` as the process was started with it (its /proc environ), or None."""
    value = environ_value(pid, b"SLURM_TASK_PID")
    return int(value) if value is not None and value.isdigit() and len(value) <= 10 else None


# How much of a process's environment root reads: a job can point its environ at gigabytes
# of untouched memory (prctl PR_SET_MM needs no privilege), so no more than this is read.
ENVIRON_READ_LIMIT = 256 << 10


def environ_value(pid: int, name: bytes) -> bytes | None:
    """The value of ``name`` in the environment process ``pid`` was started with, where it
    is within the first :data:`ENVIRON_READ_LIMIT` bytes; None where it is not, or the
    process is gone. For root's reading of a job's processes: bounded, and not split."""
    try:
        fd = os.open(f"/proc/{int(pid)}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    chunks, size, whole = [], 0, False
    try:
        while size < ENVIRON_READ_LIMIT:
            chunk = os.read(fd, ENVIRON_READ_LIMIT - size)
            if not chunk:
                whole = True
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    environ = b"\0" + b"".join(chunks)
    at = environ.find(b"\0" + name + b"=")
    if at < 0:
        return None
    start = at + len(name) + 2
    end = environ.find(b"\0", start)
    if end < 0:  # the last one read: whole only where the environment ended there
        return environ[start:] if whole else None
    return environ[start:end]
