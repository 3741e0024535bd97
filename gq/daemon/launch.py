"""Turn a queued job into the host's launch message: command line, environment, outputs."""

from __future__ import annotations

import functools
import os
import pwd
import sys
from pathlib import Path
from typing import Any

from gq.daemon import devices as devices_mod
from gq.daemon.devices import Device
from gq.home import Home
from gq.queue.models import Job

_GQ_PACKAGE = Path(__file__).resolve().parents[1]


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


def is_python(script: str) -> bool:
    return script.endswith(".py")


def command(job: Job) -> tuple[list[str], bool]:
    """The argv to run, and whether it speaks the worker protocol (Python scripts do)."""
    if job.interpreter is not None:
        return [job.interpreter, "-m", "gq.exec.worker", job.spool_path, *job.args], True
    with open(job.spool_path, "rb") as script:
        has_shebang = script.read(2) == b"#!"
    if has_shebang:
        return [job.spool_path, *job.args], False
    return ["bash", job.spool_path, *job.args], False


def launch_spec(job: Job, devices: list[Device], lane: int, home: Home) -> dict[str, Any]:
    """Everything the host needs to start the job as its submitter."""
    system = home.system
    argv, worker = command(job)
    env = dict(job.env)
    groups: list[int] = []
    if system and job.uid is not None:
        entry = pwd.getpwuid(job.uid)
        env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
        groups = os.getgrouplist(entry.pw_name, job.gid if job.gid is not None else entry.pw_gid)
    env.update(devices_mod.environment(devices))
    env.update(GQ_JOB_ID=str(job.id), GQ_JOB_NAME=job.name)
    if worker:
        env["GQ_SCRIPT"] = job.script  # the worker runs the snapshot under this name
    if job.array_job_id is not None:
        array = {"ARRAY_JOB_ID": str(job.array_job_id), "ARRAY_TASK_ID": str(job.array_task_id)}
        env.update({f"GQ_{key}": value for key, value in array.items()})
        # Slurm's names too, so array scripts written for sbatch run unchanged.
        env.update({f"SLURM_{key}": value for key, value in array.items()})
        env["SLURM_JOB_ID"] = str(job.id)
    if worker and job.interpreter != sys.executable:
        # Another interpreter may not have gq installed: let it find this one.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"),
                                                          gq_only_path(home)]))
    return {
        "id": job.id, "argv": argv, "worker": worker, "cwd": job.workdir, "env": env,
        "stdout": job.stdout_path, "stderr": job.stderr_path, "lane": lane,
        "user": job.user, "priority": job.priority, "submit_time": job.submit_time,
        "steps_total": job.steps_total, "time_limit": job.time_limit, "deadline": job.deadline,
        "uid": job.uid, "gid": job.gid, "groups": groups,
        "umask": job.umask,
    }
