"""What a client may ask the daemon, and what it answers: every request and answer is a
dataclass defined here once, used by both ends (as pueue's client and daemon share
``pueue_lib``'s message types).

On the wire each message is one line of JSON, ``{"v": VERSION, "kind": ..., fields...}``
(VERSION: ``defaults.PROTOCOL_VERSION``), one request and one answer per connection over
the daemon's Unix stream socket.
:func:`decode` checks the version, the kind and every field's type and range (see
:mod:`gq.codec`), and rejects anything else in one place, so handlers only ever see
well-formed messages. This module imports nothing beyond the standard library and gq's
codec; ``gq status`` and ``gq submit`` send their requests' fields without it
(gq/client.py's ``ask_plain``), and the daemon checks them here as it checks any.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Annotated, Any, ClassVar

from gq import codec, defaults
from gq.codec import Bounds, MaxLen, MessageError, message
from gq.fields import (
    Args,
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
    Seconds,
    Text,
    TimeLimit,
    Timestamp,
    Umask,
)

__all__ = ["MessageError", "VersionMismatch", "encode", "decode"]

dataclass = message
Label = Annotated[str, MaxLen(64)]  # a job id as typed: 17, or 17_3 (checked by handlers)
Labels = Annotated[list[Label], MaxLen(defaults.MAX_ARRAY_SIZE)]
Snapshot = Annotated[bytes, MaxLen(defaults.MAX_SCRIPT)]
# Task ids and ranges (0-99,200): at most every id up to 4,000,000, each with its comma.
TaskIds = Annotated[str, MaxLen(8 * 4_000_001)]


class OnOutOfMemory(str, enum.Enum):
    """What a run that runs out of memory does (``--oom``): back to the queue with its
    declaration raised to what it asked for (at most ``--retries`` times), or FAILED."""

    REQUEUE = "requeue"
    FAIL = "fail"


class MemoryBasis(str, enum.Enum):
    """Where a job's device-memory figure (``mem``) came from."""

    DECLARED = "declared"  # --gpu-mem
    MEASURED = "measured"  # its probe: the peak of its first iterations plus a margin
    RAISED = "raised"  # what it asked for when it ran out of memory


class VersionMismatch(codec.VersionMismatch):
    """The other end speaks another protocol version than this gq's."""

    def __init__(self, theirs: object):
        super().__init__(theirs, defaults.PROTOCOL_VERSION)


# ----- shared records -----------------------------------------------------------------
@dataclass
class EventInfo:
    """One change of a job's state: when, from what to what, and why."""

    time: float
    old_state: str | None
    new_state: str
    reason: str | None


@dataclass
class JobInfo:
    """One job as clients see it; times are seconds since the epoch."""

    id: int
    label: str  # Slurm's spelling: 17, or 17_3 for task 3 of array 17
    name: str
    user: str
    uid: int | None
    state: str
    reason: str | None
    priority: int
    gpus: int
    mem: int | None
    time_limit: int | None
    deadline: float | None
    steps_total: int | None
    exclusive: bool
    requeue: bool
    dependency: str | None
    held: bool
    array_job_id: int | None
    array_task_id: int | None
    array_max_running: int | None
    # The command, its directory and output paths: in answers about one job (show, logs,
    # export), None in lists (status, history, info), which would otherwise carry up to
    # 256 KiB of arguments per job to everyone who lists the queue.
    script: Path | None
    args: Args | None
    workdir: Path | None
    stdout: Path | None
    stderr: Path | None
    device: str | None
    lane: int | None
    pid: int | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    exit_code: int | None
    run_count: int
    steps_done: int
    attained: float
    mean_iteration: float | None
    mem_persistent: int | None
    mem_peak: int | None
    holds_lane: bool
    events: list[EventInfo] | None = None
    mean_gap: float | None = None
    host_memory: int | None = None  # bytes its processes hold on the host (its cgroup)
    processes: int | None = None  # how many processes it has (its cgroup), while it runs
    host_mem: int | None = None  # what it asked for: host memory (bytes), CPUs, GPU type,
    cpus: int | None = None  # begin time
    gpu_type: str | None = None
    begin_time: float | None = None
    output_pattern: Path | None = None  # -o/-e as given (%x-%j.out); None for jobs from
    error_pattern: Path | None = None  # before they were kept, and in lists
    interpreter: Path | None = None  # a Python job's, in answers about one job
    warn_signal: str | None = None  # --signal, as [B:]NUMBER@SECONDS
    nodelist: str | None = None  # -w: the devices it may run on, comma-separated
    retries: int | None = None  # --retries and --retry-delay
    retries_left: int | None = None
    ntasks: int | None = None
    notify: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    suspended: bool = False
    retry_delay: float | None = None
    # Its forecast (gq status --start or -l, gq show): start and end, and how well they are
    # known: "known", "estimated" or "unknown" (None: not asked for).
    forecast_start: Timestamp | None = None
    forecast_end: Timestamp | None = None
    forecast: Name | None = None
    # Its memory: where ``mem`` came from (None: nothing declared or measured yet), what it
    # does at an out-of-memory, how many runs ended so, and whether it was measured to use
    # more than ``mem`` (gq status's MEM!).
    mem_basis: MemoryBasis | None = None
    on_oom: OnOutOfMemory = OnOutOfMemory.REQUEUE
    ooms: int = 0
    mem_over: bool = False
    # Whether it runs gq's worker (a Python script), which takes turns on its lane; a plain
    # process (a shell script) never holds nor waits for one.
    worker: bool = True
    interactive: bool = False  # gq run --pty: on its submitter's terminal
    # An interactive job's --idle-timeout, and while it runs, seconds since its last
    # activity (its terminal's use, a statement computing: gq.exec.idleness).
    idle_timeout: TimeLimit | None = None
    idle: Seconds | None = None
    # In a listing (gq status without --array-tasks), one record stands for those pending
    # tasks of an array that never started and are alike in every field shown but their ids
    # (see gq.queue.queries.unstarted_task_groups): the task ids, as squeue spells them
    # (0-99,200), and how many; ``id`` is the first one's job id, ``array_task_id`` None and
    # ``label`` squeue's 17_[0-99,200%8]. None for any other record.
    array_task_string: TaskIds | None = None
    array_task_count: Count | None = None


@dataclass
class DeviceProcess:
    """A process on a device, and the gq job it belongs to."""

    pid: int
    memory: int | None  # bytes on the device (NVML), or resident memory (psutil)
    job: int | None  # the gq job it belongs to; None: a process gq did not start


@dataclass
class DeviceReading:
    """One sample of a device (every figure None where the device cannot tell)."""

    time: float
    source: str  # nvml | psutil | recorded (a --readings file overlays the sample)
    utilization: float | None = None  # percent of the last period the device was busy
    memory_used: int | None = None
    memory_total: int | None = None
    external_memory: int = 0  # used by processes gq did not start; admission subtracts it
    temperature: float | None = None  # degrees Celsius
    power: float | None = None  # watts
    power_limit: float | None = None
    sm_clock: int | None = None  # MHz
    throttle: list[str] = field(default_factory=list)  # why clocks are held down
    ecc_errors: int | None = None  # uncorrected, since the driver loaded
    processes: list[DeviceProcess] = field(default_factory=list)


@dataclass
class DeviceInfo:
    """A device as clients see it: its memory, its lanes and the jobs on it."""

    name: str
    kind: str
    index: int | None
    memory_total: int
    model: str
    lane_memory: int
    jobs: list[JobInfo] = field(default_factory=list)
    # What placement sees: the most memory a lane has left under the safety condition, the
    # resident jobs, and when they must all have ended (None: one has no time limit).
    headroom: int | None = None
    residents: int = 0
    free_at: float | None = None
    uuid: str | None = None
    reading: DeviceReading | None = None  # the latest sample
    held: str | None = None  # why the thermal and power guard admits no job to it now


INFO, WARNING, REFUSED = "info", "warning", "refused"


@dataclass
class Line:
    """One line of a command's report: ``info`` to stdout; ``warning`` to stderr; ``refused``
    to stderr, and the command exits 2."""

    text: str
    level: str = INFO


# ----- requests -----------------------------------------------------------------------
@dataclass
class SubmitOptions:
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


@dataclass
class Submit:
    """Queue a job (or an array): its script's snapshot, arguments, environment and options."""

    kind: ClassVar[str] = "submit"
    script_path: Path  # as submitted, absolute
    script: Snapshot  # the snapshot: read by the client, with the caller's own rights
    args: Args
    workdir: Path
    env: Environment
    umask: Umask
    options: SubmitOptions
    test_only: bool = False  # sbatch --test-only: when it would start and end; queue nothing


@dataclass
class ListJobs:
    """status and history: jobs in ``states`` (all states when None)."""

    kind: ClassVar[str] = "list"
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


@dataclass
class ShowJob:
    """One job with its state history; an array's id lists every task."""

    kind: ClassVar[str] = "show"
    label: Label


@dataclass
class OpenLog:
    """A job's output file, opened by the daemon as its owner may and passed as a descriptor."""

    kind: ClassVar[str] = "logs"
    label: Label
    stderr: bool = False


@dataclass
class ExportScript:
    """A job's script as sbatch would run it (gq export)."""

    kind: ClassVar[str] = "export"
    label: Label


@dataclass
class Wait:
    """Answered (with the jobs, as a list) once every one of them has ended: the jobs named,
    or else the caller's (``user``'s) pending and running ones."""

    kind: ClassVar[str] = "wait"
    labels: Labels
    user: Name | None = None


@dataclass
class Cancel:
    """Cancel the jobs named, narrowed by state, name and user as scancel does."""

    kind: ClassVar[str] = "cancel"
    labels: Labels
    state: Name | None = None
    name: Name | None = None
    user: Name | None = None


@dataclass
class Hold:
    """Keep pending jobs from starting until released."""

    kind: ClassVar[str] = "hold"
    labels: Labels


@dataclass
class Release:
    """Let held jobs start again."""

    kind: ClassVar[str] = "release"
    labels: Labels


@dataclass
class Requeue:
    """Put jobs back in the queue under the same ids; running ones are stopped first."""

    kind: ClassVar[str] = "requeue"
    labels: Labels
    state: Name | None = None  # or every job of the caller's (--user's) in this state
    user: Name | None = None


@dataclass
class Update:
    """Change jobs' priority or time limit, or pending jobs' other fields (scontrol update)."""

    kind: ClassVar[str] = "update"
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


@dataclass
class Suspend:
    """Stop running jobs in place (``suspended``), or let them go on."""

    kind: ClassVar[str] = "suspend"
    labels: Labels
    suspended: bool = True


# What a user may send a running job's main process group (gq kernel run's interrupt).
SIGNALS_TO_JOBS = {"INT": 2, "HUP": 1, "QUIT": 3, "USR1": 10, "USR2": 12}


@dataclass
class SignalJob:
    """Send a running job's main process group one of :data:`SIGNALS_TO_JOBS` (a kernel's
    interrupt), as Jupyter sends its kernel's: the job goes on unless the signal ends it."""

    kind: ClassVar[str] = "signal"
    label: Label
    signal: Annotated[str, MaxLen(8)]


@dataclass
class Drain:
    """Admit no new job to these devices (none named: to the node); operators only."""

    kind: ClassVar[str] = "drain"
    devices: Annotated[list[Name], MaxLen(defaults.MAX_GPUS)]
    reason: Text | None = None


@dataclass
class ResumeDevices:
    """Undo a drain of these devices (none named: of the node and every device)."""

    kind: ClassVar[str] = "resume-devices"
    devices: Annotated[list[Name], MaxLen(defaults.MAX_GPUS)]


@dataclass
class SetPolicy:
    """Set the node's scheduling policy and its settings."""

    kind: ClassVar[str] = "policy-set"
    name: Name
    fill: Name = "always"
    quantum: Name = "100ms"


@dataclass
class GetPolicy:
    """The node's scheduling policy and its settings."""

    kind: ClassVar[str] = "policy-get"


@dataclass
class NodeInfoRequest:
    """The node's devices, lanes, limits and settings (gq info)."""

    kind: ClassVar[str] = "info"


@dataclass
class Stop:
    """Stop the daemon; ``keep_jobs`` leaves running jobs to their execution hosts."""

    kind: ClassVar[str] = "stop"
    keep_jobs: bool = False


# ----- answers ------------------------------------------------------------------------
@dataclass
class Submitted:
    """The id of the job (or array) queued."""

    kind: ClassVar[str] = "submitted"
    job_id: int


@dataclass
class Delay:
    """How much later a queued job would end were the submission queued too."""

    job_id: JobId
    seconds: Annotated[float, Bounds(0, 1e12)]  # how much later it would end


@dataclass
class TestOnly:
    """What a submission would do (gq submit --test-only): when its first task would start,
    where, and when its last would end (None: unknown), how well that is known, and the
    queued jobs it would delay."""

    kind: ClassVar[str] = "test-only"
    tasks: Count
    start: Timestamp | None
    end: Timestamp | None
    device: Name | None
    basis: Name
    delays: list[Delay]


@dataclass
class Jobs:
    """The answer to ListJobs or ShowJob: jobs, and how to ask for the next page."""

    kind: ClassVar[str] = "jobs"
    jobs: list[JobInfo]
    stale: str | None = None  # why progress figures may be out of date
    retention: float | None = None  # seconds the daemon keeps finished jobs (None: ever)
    kept_since: float | None = None  # when the oldest finished job it still keeps ended
    more: Count = 0  # jobs the label named beyond those shown (an array's tasks)
    # Finished jobs were left out: ask again with before_end=older_end, before=older.
    older_end: Timestamp | None = None
    older: JobId | None = None
    forecast_made: Timestamp | None = None  # when the forecasts given were made


@dataclass
class LogFile:
    """A job's output file: opened by the daemon with its owner's rights, the descriptor
    beside the message (SCM_RIGHTS); or, for the owner (``opened`` false), named for the
    client to open itself."""

    kind: ClassVar[str] = "log"
    job: JobInfo
    path: str
    exists: bool
    opened: bool = True


@dataclass
class Script:
    """A job's script as it would run, to export."""

    kind: ClassVar[str] = "script"
    job: JobInfo
    body: bytes
    # An export of a whole job array (its id, not ID_TASK): every task id, in order.
    array_tasks: Annotated[list[int], MaxLen(defaults.MAX_ARRAY_SIZE)] | None = None


@dataclass
class EndedJob:
    """How one job ended: its state and exit code."""

    label: Label
    state: Name
    exit_code: int | None


@dataclass
class WaitOver:
    """The answer to a Wait: how each job ended, in id order."""

    kind: ClassVar[str] = "wait-over"
    jobs: Annotated[list[EndedJob], MaxLen(defaults.MAX_WAITED)]


@dataclass
class Report:
    """Lines of text for the caller to print."""

    kind: ClassVar[str] = "report"
    lines: list[Line]


@dataclass
class PolicyInfo:
    """The node's scheduling policy and its settings."""

    kind: ClassVar[str] = "policy"
    name: str
    fill: str
    quantum: str


@dataclass
class NodeLimits:
    """What one user may ask of the node (the daemon's options), and how jobs are kept."""

    max_pending: int  # pending jobs per user
    max_spool: int  # bytes of script snapshots kept per user
    max_array: int  # tasks in one array
    max_connections_per_user: int
    max_connections: int
    max_request: int  # bytes
    retention: float | None  # seconds finished jobs are kept (None: for ever)
    max_script: int  # bytes
    max_job_payload: int  # bytes of environment and arguments
    containment: str  # "cgroup v1", "cgroup v2" or "process groups", and what that holds


@dataclass
class NodeInfo:
    """The node as gq info shows it."""

    kind: ClassVar[str] = "node"
    pid: int
    mode: str  # personal | system
    started: float
    lanes: int
    max_resident: int
    policy: str
    fill: str
    quantum: str
    note: str | None
    devices: list[DeviceInfo]
    operators: list[str]
    priority_cap: int | None
    options: list[str]  # the daemon's command-line options: a restart reuses them
    limits: NodeLimits | None = None
    drained: dict[Name, Text] = field(default_factory=dict)  # device ("*": node) -> reason


@dataclass
class Done:
    """A request carried out; ``message`` says what was done."""

    kind: ClassVar[str] = "done"
    message: str


@dataclass
class Error:
    """A refused request: ``message`` is one line for stderr, ``exit_code`` the CLI's."""

    kind: ClassVar[str] = "error"
    message: str
    exit_code: int = 2


REQUESTS: dict[str, type] = {
    cls.kind: cls
    for cls in (
        Submit,
        ListJobs,
        ShowJob,
        OpenLog,
        ExportScript,
        Wait,
        Cancel,
        Hold,
        Release,
        Requeue,
        Update,
        SetPolicy,
        GetPolicy,
        NodeInfoRequest,
        Stop,
        Drain,
        ResumeDevices,
        Suspend,
        SignalJob,
    )
}
ANSWERS: dict[str, type] = {
    cls.kind: cls
    for cls in (
        WaitOver,
        Submitted,
        TestOnly,
        Jobs,
        LogFile,
        Script,
        Report,
        PolicyInfo,
        NodeInfo,
        Done,
        Error,
    )
}


# ----- the codec ----------------------------------------------------------------------
def encode(message: Any) -> bytes:
    """One line: the version, the kind, then the fields."""
    data = {"v": defaults.PROTOCOL_VERSION, "kind": message.kind}
    data.update(codec.to_wire(message))
    return codec.dumps(data)


def decode(line: bytes, kinds: dict[str, type]) -> Any:
    """The message a line holds, every field checked; MessageError otherwise."""
    data = codec.loads(line)
    if data.get("v") != defaults.PROTOCOL_VERSION:
        raise VersionMismatch(data.get("v"))
    kind = data.pop("kind", None)
    del data["v"]
    if not isinstance(kind, str) or kind not in kinds:
        raise MessageError(f"unknown kind {str(kind)[:40]!r}")
    return codec.build(kinds[kind], data, kind)
