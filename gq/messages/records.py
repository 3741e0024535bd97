"""The records requests and answers carry: a job (JobInfo, with its EventInfo history), a
device (DeviceInfo, its DeviceReading and DeviceProcess), a line of a command's report
(Line), and the enums they share with requests (OnOutOfMemory, MemoryBasis). The daemon's
monitoring and the queue use them too, without any request.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Annotated

from gq.codec import MaxLen, message
from gq.fields import Args, Count, Name, Path, Seconds, TimeLimit, Timestamp

Label = Annotated[str, MaxLen(64)]  # a job id as typed: 17, or 17_3 (checked by handlers)
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


@message
class EventInfo:
    """One change of a job's state: when, from what to what, and why."""

    time: float
    old_state: str | None
    new_state: str
    reason: str | None


@message
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


@message
class DeviceProcess:
    """A process on a device, and the gq job it belongs to."""

    pid: int
    memory: int | None  # bytes on the device (NVML), or resident memory (psutil)
    job: int | None  # the gq job it belongs to; None: a process gq did not start


@message
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


@message
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


@message
class Line:
    """One line of a command's report: ``info`` to stdout; ``warning`` to stderr; ``refused``
    to stderr, and the command exits 2."""

    text: str
    level: str = INFO
