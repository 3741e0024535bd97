"""The environment sbatch gives a batch job, with values that hold on one node (pure).

``SLURM_JOB_ID`` is the gq id plus :data:`JOB_ID_OFFSET`: over 2^32, so no real Slurm
cluster can hold it (its job ids are 32-bit), and Slurm's own tools refuse it instead of
acting on someone else's job; the gq id is ``GQ_JOB_ID``. ``srun`` and ``scontrol`` in the
job are gq's shims (:data:`SHIM`, :func:`scontrol_shim`), first on its PATH.
"""

from __future__ import annotations

import functools
import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

JOB_ID_OFFSET = 10_000_000_000  # SLURM_JOB_ID 10000000017 is gq job 17
SHIM = Path(__file__).with_name("bin") / "srun"
PARTITION = "gq"
# Kept from the submitter's environment: what the client recorded of the submission.
SUBMISSION = ("SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST")


@dataclass(frozen=True)
class BatchJob:
    """What the variables are made of: one run of a job, as the daemon knows it."""

    id: int
    name: str
    user: str
    uid: int | None
    gid: int | None
    workdir: str
    run: int  # 1 for the first run; a requeued job's later runs count restarts
    cpus: int | None
    host_mem: int | None  # bytes
    time_limit: int | None
    devices: tuple[int, ...]  # the indices of its whole devices (GPUs or emulated)
    ntasks: int | None = None  # -n
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_span: tuple[int, int, int, int] | None = None  # its array's count, min, max, step


@functools.cache
def node_name() -> str:
    """This node's short host name: SLURM_JOB_NODELIST, and %N in output names."""
    return socket.gethostname().split(".")[0]


def slurm_id(job_id: int) -> str:
    return str(JOB_ID_OFFSET + job_id)


def variables(job: BatchJob, node: str) -> dict[str, str]:
    """sbatch's SLURM_* variables for the job on ``node`` (its short host name)."""
    # Without -c the job is held to no CPU count: it sees the node's.
    cpus = str(job.cpus or os.cpu_count() or 1)
    tasks = str(job.ntasks or 1)
    env = {
        "SLURM_JOB_ID": slurm_id(job.id),
        "SLURM_JOBID": slurm_id(job.id),
        "SLURM_JOB_NAME": job.name,
        "SLURM_JOB_USER": job.user,
        "SLURM_CLUSTER_NAME": PARTITION,
        "SLURM_JOB_PARTITION": PARTITION,
        "SLURM_JOB_NODELIST": node,
        "SLURM_NODELIST": node,
        "SLURMD_NODENAME": node,
        "SLURM_TOPOLOGY_ADDR": node,
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": tasks,
        "SLURM_NPROCS": tasks,
        "SLURM_TASKS_PER_NODE": tasks,
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_GTIDS": "0",
        "SLURM_JOB_CPUS_PER_NODE": cpus,
        "SLURM_CPUS_ON_NODE": cpus,
    }
    if job.uid is not None:
        env["SLURM_JOB_UID"] = str(job.uid)
    if job.gid is not None:
        env["SLURM_JOB_GID"] = str(job.gid)
    if job.cpus is not None:
        env["SLURM_CPUS_PER_TASK"] = cpus
    if job.host_mem is not None:
        env["SLURM_MEM_PER_NODE"] = str(max(1, job.host_mem >> 20))  # MiB, as Slurm
    if job.devices:
        listed = ",".join(map(str, job.devices))
        env.update(
            SLURM_GPUS_ON_NODE=str(len(job.devices)),
            SLURM_JOB_GPUS=listed,
            GPU_DEVICE_ORDINAL=listed,
        )
    if job.run > 1:
        env["SLURM_RESTART_COUNT"] = str(job.run - 1)
    if job.array_job_id is not None and job.array_task_id is not None:
        count, low, high, step = job.array_span or (1, job.array_task_id, job.array_task_id, 1)
        env.update(
            SLURM_ARRAY_JOB_ID=slurm_id(job.array_job_id),
            SLURM_ARRAY_TASK_ID=str(job.array_task_id),
            SLURM_ARRAY_TASK_COUNT=str(count),
            SLURM_ARRAY_TASK_MIN=str(low),
            SLURM_ARRAY_TASK_MAX=str(high),
            SLURM_ARRAY_TASK_STEP=str(step),
        )
    return env


def for_job(inherited: dict[str, str], job: BatchJob, node: str, shim_dir: str) -> dict[str, str]:
    """The submitter's environment with sbatch's variables for this job in place of any it
    carried (from a Slurm job it was submitted in, say), and ``shim_dir`` (where gq's srun
    is) first on PATH."""
    env = {
        key: value
        for key, value in inherited.items()
        if not key.startswith(("SLURM_", "SLURMD_")) or key in SUBMISSION
    }
    env.setdefault("SLURM_SUBMIT_DIR", job.workdir)
    env.update(variables(job, node))
    env["PATH"] = os.pathsep.join(filter(None, [shim_dir, inherited.get("PATH", os.defpath)]))
    return env


def scontrol_shim(python: str, gq_path: str, home_root: str, mode: str) -> str:
    """The ``scontrol`` a job finds on its PATH (see :mod:`gq.slurm.scontrol`): run by the
    daemon's ``python``, isolated (``-I``: no PYTHONPATH or virtual environment of the job's
    changes which gq answers; ``-S``: it needs no site packages), with ``gq_path`` (a
    directory holding this gq alone) first on its path, asking the daemon of ``home_root``."""
    code = (
        f"import sys; sys.path.insert(0, {gq_path!r}); "
        "from gq.slurm.scontrol import main; "
        f"sys.exit(main(sys.argv[1:], {home_root!r}, {mode!r}))"
    )
    return (
        "#!/bin/sh\n"
        "# scontrol inside a gq job: its own job's requeue, show and time limit, answered\n"
        "# by the gq daemon that runs it; never a Slurm controller.\n"
        f'exec {shlex.quote(python)} -I -S -c {shlex.quote(code)} "$@"\n'
    )
