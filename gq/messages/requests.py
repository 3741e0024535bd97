"""What a client may ask the daemon: one dataclass per request, each named by its
``kind`` on the wire (gq.messages.REQUESTS maps kinds to classes for the daemon's decode).
"""

from __future__ import annotations

from typing import Annotated

from gq import defaults
from gq.codec import Bounds, MaxLen, Record
from gq.fields import (
    Args,
    CommandLine,
    Count,
    Cpus,
    Environment,
    Gpus,
    HostMemory,
    JobId,
    Name,
    Path,
    Positive,
    Priority,
    Text,
    TimeLimit,
    Timestamp,
    Umask,
)
from gq.messages.records import ClientMessage, Label, OnOutOfMemory

HoldBound = Annotated[float, Bounds(defaults.MIN_MAX_HOLD, defaults.MAX_MAX_HOLD)]

Labels = Annotated[list[Label], MaxLen(defaults.MAX_ARRAY_SIZE)]
Snapshot = Annotated[bytes, MaxLen(defaults.MAX_SCRIPT)]


class SubmitOptions(Record):
    """Everything the client parsed from the command line and the script's directives."""

    name: Name | None = None
    gpus: Gpus = 1
    mem: Count | None = None  # device memory, bytes
    time_limit: TimeLimit | None = None
    deadline: Timestamp | None = None
    priority: Priority = 0
    steps: Count | None = None
    output: Path | None = defaults.OUTPUT  # None: the terminal (interactive jobs only)
    error: Path | None = None
    exclusive: bool = False
    requeue: bool = False
    interpreter: Path | None = None
    array: Text | None = None
    dependency: Text | None = None
    held: bool = False
    gpu_type: Name | None = None  # --gpus TYPE:N: a device whose model names TYPE
    host_mem: HostMemory | None = None  # bytes: the limit of the job's cgroup
    cpus: Cpus | None = None  # --cpus-per-task
    begin: Timestamp | None = None  # not started before
    warn_signal: Annotated[str, MaxLen(32)] | None = None  # --signal: [B:]NUMBER@SECONDS
    nodelist: Annotated[list[Annotated[str, MaxLen(64)]], MaxLen(defaults.MAX_GPUS)] | None = None
    retries: Annotated[int, Bounds(0, defaults.MAX_RETRIES)] | None = None
    retry_delay: Annotated[float, Bounds(0.0, float(defaults.MAX_TIME_LIMIT))] | None = None
    ntasks: Cpus | None = None  # -n: the copies srun starts
    notify: Text | None = None  # a command run as the submitter once the job has ended
    mail_type: Annotated[str, MaxLen(64)] | None = None  # sbatch's: BEGIN,END,FAIL,...
    mail_user: Name | None = None
    oom: OnOutOfMemory = OnOutOfMemory.REQUEUE
    interactive: bool = False  # gq run --pty: it runs on a terminal the submitter's gq holds
    idle_timeout: TimeLimit | None = None  # seconds an interactive job may sit idle


class Submit(ClientMessage, tag="submit"):
    """Queue a job (or an array): its script's snapshot, arguments, environment and options."""

    script_path: Path  # as submitted, absolute
    script: Snapshot  # the snapshot: read by the client, with the caller's own rights
    args: Args
    workdir: Path
    env: Environment
    umask: Umask
    options: SubmitOptions
    test_only: bool = False  # sbatch --test-only: when it would start and end; queue nothing
    # The command line the user gave (gq run -- CMD ARGS, --wrap's, SCRIPT ARGS), as a shell
    # reads it: gq show's Command.
    command: CommandLine | None = None


class ListJobs(ClientMessage, tag="list"):
    """status and history: jobs in ``states`` (all states when None)."""

    states: Annotated[list[Name], MaxLen(16)] | None = None
    users: Annotated[list[Name], MaxLen(1024)] | None = None
    ended_since: Timestamp | None = None  # history --since: jobs that ended since then
    # Finished jobs come a page at a time, the most recently ended first: at most ``limit`` of
    # them (never more than the daemon's page size), and only those that ended before
    # ``before_end``, or at that time with ids below ``before``, when given.
    limit: Positive | None = None
    before_end: Timestamp | None = None
    before: JobId | None = None
    forecast: bool = False  # with each pending and running job's forecast
    # Each pending array task on its own record; by default those that never started come
    # folded, one record for each group of an array's tasks alike (JobInfo.array_task_string).
    array_tasks: bool = False
    fair_share: bool = False  # with the listed jobs' owners' fair-share usage (gq history)


class ShowJob(ClientMessage, tag="show"):
    """One job with its state history; an array's id lists every task."""

    label: Label


class OpenLog(ClientMessage, tag="logs"):
    """A job's output file, opened by the daemon as its owner may and passed as a descriptor."""

    label: Label
    stderr: bool = False


class ExportScript(ClientMessage, tag="export"):
    """A job's script as sbatch would run it (gq export)."""

    label: Label


class Wait(ClientMessage, tag="wait"):
    """Answered (with the jobs, as a list) once every one of them has ended: the jobs named,
    or else the caller's (``user``'s) pending and running ones."""

    labels: Labels
    user: Name | None = None


class Cancel(ClientMessage, tag="cancel"):
    """Cancel the jobs named, narrowed by state, name and user as scancel does."""

    labels: Labels
    state: Name | None = None
    name: Name | None = None
    user: Name | None = None


class Hold(ClientMessage, tag="hold"):
    """Keep pending jobs from starting until released."""

    labels: Labels


class Release(ClientMessage, tag="release"):
    """Let held jobs start again."""

    labels: Labels


class Requeue(ClientMessage, tag="requeue"):
    """Put jobs back in the queue under the same ids; running ones are stopped first."""

    labels: Labels
    state: Name | None = None  # or every job of the caller's (--user's) in this state
    user: Name | None = None


class Update(ClientMessage, tag="update"):
    """Change jobs' priority or time limit, or pending jobs' other fields (scontrol update)."""

    labels: Labels
    priority: Priority | None = None
    time_limit: TimeLimit | None = None
    name: Name | None = None
    begin: Timestamp | None = None  # pending jobs: not started before
    # Pending jobs only (their script snapshot stays), as pueue edit:
    args: Args | None = None  # the script's arguments, every task of an array at once
    workdir: Path | None = None  # absolute
    output: Path | None = None  # patterns, %j and the like filled in again
    error: Path | None = None
    dependency: Text | None = None  # "" removes it


class Suspend(ClientMessage, tag="suspend"):
    """Stop running jobs in place (``suspended``), or let them go on."""

    labels: Labels
    suspended: bool = True


# What a user may send a running job's main process group (gq kernel run's interrupt).
SIGNALS_TO_JOBS = {"INT": 2, "HUP": 1, "QUIT": 3, "USR1": 10, "USR2": 12}


class SignalJob(ClientMessage, tag="signal"):
    """Send a running job's main process group one of :data:`SIGNALS_TO_JOBS` (a kernel's
    interrupt), as Jupyter sends its kernel's: the job goes on unless the signal ends it."""

    label: Label
    signal: Annotated[str, MaxLen(8)]


class Drain(ClientMessage, tag="drain"):
    """Admit no new job to these devices (none named: to the node); operators only."""

    devices: Annotated[list[Name], MaxLen(defaults.MAX_GPUS)]
    reason: Text | None = None


class ResumeDevices(ClientMessage, tag="resume-devices"):
    """Undo a drain of these devices (none named: of the node and every device)."""

    devices: Annotated[list[Name], MaxLen(defaults.MAX_GPUS)]


class SetPolicy(ClientMessage, tag="policy-set"):
    """Set the node's scheduling policy and its settings."""

    name: Name
    fill: Name = "always"
    quantum: Name = "100ms"
    # Seconds a hold others wait for may go on (None: as it is).
    max_hold: HoldBound | None = None


class GetPolicy(ClientMessage, tag="policy-get"):
    """The node's scheduling policy and its settings."""


class NodeInfoRequest(ClientMessage, tag="info"):
    """The node's devices, lanes, limits and settings (gq info)."""


class Stop(ClientMessage, tag="stop"):
    """Stop the daemon; ``keep_jobs`` leaves running jobs to their execution hosts."""

    keep_jobs: bool = False
