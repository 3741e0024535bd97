"""Turn a queued job into the host's launch message: command line, environment, outputs."""

from __future__ import annotations

import functools
import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path

from gq.daemon import devices as devices_mod
from gq.daemon.devices import Device
from gq.daemon.mps import CLIENT_VARIABLES
from gq.defaults import SCRIPT_PATH
from gq.exec.host.messages import LaunchSpec
from gq.home import Home
from gq.queue import spool
from gq.queue.lookups import JobRow, PayloadRow
from gq.queue.models import Job, Payload
from gq.slurm import environment as slurm_env
from gq.slurm.options import parse_signal

# What a job (its id, user, devices) finds of MPS's in its environment (None: gq's MPS is off
# on the node, and a job's own settings are left to it); the daemon's, from gq.daemon.mps.
MpsEnvironment = Callable[[int, str, list[Device]], "dict[str, str] | None"]

_GQ_PACKAGE = Path(__file__).resolve().parents[2]
_RANK_SITE = _GQ_PACKAGE / "exec" / "job" / "rank_site" / "sitecustomize.py"


@functools.cache
def gq_only_path(home: Home) -> str:
    """A directory holding gq alone (a link to this gq), for the PYTHONPATH of jobs run by
    another interpreter: they find gq's worker, and none of the daemon's other packages.
    Made once per daemon."""
    directory = home.root / "pythonpath"
    directory.mkdir(mode=0o755, exist_ok=True)
    link = directory / "gq"
    if not link.is_symlink() or link.resolve() != _GQ_PACKAGE:
        link.unlink(missing_ok=True)
        link.symlink_to(_GQ_PACKAGE, target_is_directory=True)
    return str(directory)


@functools.cache
def shim_directory(home: Home) -> str:
    """A directory holding gq's ``srun`` and ``scontrol`` (see :mod:`gq.slurm.environment`),
    in the state directory where every job's user can reach it (gq's own install may be out
    of their reach), for the front of jobs' PATH. Written once per daemon, each file whole
    or not at all."""
    directory = home.root / "bin"
    directory.mkdir(mode=0o755, exist_ok=True)
    scontrol = slurm_env.scontrol_shim(
        sys.executable, gq_only_path(home), str(home.root), home.mode
    )
    for name, content in (("srun", slurm_env.SHIM.read_bytes()), ("scontrol", scontrol.encode())):
        _write_whole(directory / name, content)
    return str(directory)


@functools.cache
def rank_site_directory(home: Home) -> str:
    """A directory holding gq's ``sitecustomize`` for jobs its worker does not run (see
    :mod:`gq.exec.job.rank_progress`), where every job's user can reach it, as the shims are."""
    directory = home.root / "rank_site"
    directory.mkdir(mode=0o755, exist_ok=True)
    _write_whole(directory / "sitecustomize.py", _RANK_SITE.read_bytes())
    return str(directory)


def _write_whole(target: Path, content: bytes) -> None:
    """``target`` holding ``content``, executable by all: left as it is where it does."""
    try:
        if target.read_bytes() == content:
            return
    except OSError:
        pass
    partial = target.with_name(f".{target.name}.new")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.replace(partial, target)


def is_python(script: str) -> bool:
    return script.endswith(".py")


def command(job: Job, args: list[str]) -> tuple[list[str], bool]:
    """The argv to run, and whether it speaks the worker protocol (Python scripts do). The
    snapshot is the job's descriptor SCRIPT_FD, named SCRIPT_PATH: the worker reads it; a
    shell script is read by its shell as ``SHELL -c '. "$GQ_SCRIPT_SOURCE"' SUBMITTED
    ARGS...``, so that ``$0`` names the submitted script (``"$(dirname "$0")"`` finds the
    files beside it), and where its host could show the snapshot at the submitted path
    (see :func:`gq.exec.host.spawn.start_as_submitter`), ``BASH_SOURCE`` too; any other ``#!``
    script is run through the kernel, as that path or SCRIPT_PATH."""
    if job.interpreter is not None:
        return [job.interpreter, "-m", "gq.exec.job.worker", SCRIPT_PATH, *args], True
    first = spool.first_line(job.spool_path)
    if first.startswith(b"#!"):
        shell = shell_of(first[2:].decode(errors="replace"))
        if shell is None:
            return [SCRIPT_PATH, *args], False
    else:
        shell = ["bash"]
    return [*shell, "-c", '. "$GQ_SCRIPT_SOURCE"', job.script, *args], False


_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})


def shell_of(shebang: str) -> list[str] | None:
    """The command that starts the shell a ``#!`` line names, with its option (as the
    kernel passes it: the rest of the line, one argument), or None for another program.
    ``/usr/bin/env bash`` is bash found on the job's PATH."""
    program, _, option = shebang.strip().partition(" ")
    option = option.strip()
    if option in ("-", "--"):  # "no more options": the -c gq adds must still be read
        option = ""
    if os.path.basename(program) == "env" and option and " " not in option:
        program, option = option, ""
    if os.path.basename(program) not in _SHELLS:
        return None
    return [program, option] if option else [program]


def account(job: Job) -> tuple[dict[str, str], list[int]]:
    """What a root process takes on to act as the job's submitter: their HOME, USER and
    LOGNAME, and their groups. ValueError where the job names no uid and gid, or their
    account no longer exists (nothing then runs as them)."""
    if job.uid is None or job.gid is None:
        raise ValueError("it names no submitter uid and gid; refusing to run it as root")
    try:
        entry = pwd.getpwuid(job.uid)
    except KeyError:
        raise ValueError(f"its submitter's account (uid {job.uid}) no longer exists") from None
    return (
        {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name},
        os.getgrouplist(entry.pw_name, job.gid),
    )


def launch_spec(
    job: Job | JobRow,
    payload: Payload | PayloadRow,
    devices: list[Device],
    lane: int,
    run: int,
    home: Home,
    array_span: tuple[int, int, int, int] | None = None,
    max_pids: int | None = None,
    mps: dict[str, str] | None = None,
) -> LaunchSpec:
    """Everything the host needs to start this run of the job as its submitter (an array
    task's ``array_span``: its array's task count, lowest and highest task id, step; the
    daemon's --max-pids: the tasks its cgroup may hold; ``mps``: what it is told of MPS,
    where gq's is on: see :data:`MpsEnvironment`); from the job's and its payload's columns
    (ORM objects or plain rows).
    ValueError when the job cannot run as anyone but root by accident: in system mode a job
    must name its submitter's uid and gid, and their account must exist."""
    system = home.system
    argv, worker = command(job, list(payload.args))
    batch = slurm_env.BatchJob(
        id=job.id,
        name=job.name,
        user=job.user,
        uid=job.uid,
        gid=job.gid,
        workdir=job.workdir,
        run=run,
        cpus=job.cpus,
        host_mem=job.host_mem,
        ntasks=job.ntasks,
        time_limit=job.time_limit,
        devices=tuple(d.index for d in devices if d.whole and d.index is not None),
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        array_span=array_span,
    )
    env = slurm_env.for_job(dict(payload.env), batch, slurm_env.node_name(), shim_directory(home))
    groups: list[int] = []
    if system:
        identity, groups = account(job)
        env.update(identity)
    env.update(devices_mod.environment(devices))
    if mps is not None:  # under gq's MPS, a job's own settings could reach another user's
        for name in CLIENT_VARIABLES:  # server, or lift its limits: gq's are the ones it gets
            env.pop(name, None)
        env.update(mps)
    env.update(GQ_JOB_ID=str(job.id), GQ_JOB_NAME=job.name)
    if worker:
        env["GQ_SCRIPT"] = job.script  # the worker runs the snapshot under this name
    if job.array_job_id is not None:
        env.update(GQ_ARRAY_JOB_ID=str(job.array_job_id), GQ_ARRAY_TASK_ID=str(job.array_task_id))
    if worker and job.interpreter != sys.executable:
        # Another interpreter may not have gq installed: let it find this one.
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [env.get("PYTHONPATH"), gq_only_path(home)])
        )
    elif not worker:
        # Its Python processes load gq's sitecustomize first (it loads any it hides): the
        # lowest rank's steps are counted (gq.exec.job.rank_progress). Once: a job submitted
        # from within a job inherits the path.
        site = rank_site_directory(home)
        inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
        env["PYTHONPATH"] = os.pathsep.join([site, *inherited])
    warn = parse_signal(job.warn_signal) if job.warn_signal else None
    return LaunchSpec(
        id=job.id,
        run=run,
        argv=argv,
        worker=worker,
        cwd=job.workdir,
        env=env,
        stdout=job.stdout_path or None,
        stderr=job.stderr_path or None,
        lane=lane,
        user=job.user,
        terminal=bool(job.interactive),
        idle_timeout=job.idle_timeout,
        priority=job.priority,
        submit_time=job.submit_time,
        steps_total=job.steps_total,
        time_limit=job.time_limit,
        deadline=job.deadline,
        uid=job.uid,
        gid=job.gid,
        groups=groups,
        umask=job.umask,
        snapshot=job.spool_path or None,
        script_name=None if worker else job.script,
        host_mem=job.host_mem,
        cpus=job.cpus,
        max_pids=max_pids,
        warn_signal=warn.number if warn else None,
        warn_before=warn.before if warn else 60,
        warn_main=warn.batch if warn else False,
        mem_cap=job.mem,
        probe=worker and job.mem is None,
    )
