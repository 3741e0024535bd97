"""The records requests and answers carry: a job (JobInfo, with its EventInfo history), a
device (DeviceInfo, its DeviceReading and DeviceProcess), a line of a command's report
(Line), and the enums they share with requests (OnOutOfMemory, MemoryBasis). The daemon's
monitoring and the queue use them too, without any request.
"""

from __future__ import annotations

import enum
from typing import Annotated

from msgspec import field

from gq import defaults
from gq.codec import Bounds, Int, MaxLen, Message, Record, Str
from gq.fields import Args, CommandLine, Count, Name, Path, Seconds, TimeLimit, Timestamp

Label = Annotated[str, MaxLen(64)]  # a job id as typed: 17, or 17_3 (checked by handlers)
# Task ids and ranges (0-99,200): at most every id up to 4,000,000, each with its comma.
TaskIds = Annotated[str, MaxLen(8 * 4_000_001)]


class ClientMessage(Message, kw_only=True):
    """A request or an answer between a client and the daemon: it says the protocol version
    it speaks, which its receiver checks before anything else."""

    v: Annotated[int, Bounds(defaults.PROTOCOL_VERSION, defaults.PROTOCOL_VERSION)] = (
        defaults.PROTOCOL_VERSION
    )


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


class EventInfo(Record):
    """One change of a job's state: when, from what to what, and why."""

    time: float
    old_state: Str | None
    new_state: Str
    reason: Str | None


class RunInfo(Record):
    """One run of a job (gq show): when it was queued (submitted, or put back in the
    queue), started and ended, how it ended (a terminal state, or REQUEUED; None while it
    runs) and why, and what it did: its own count of steps, the lane time it was billed."""

    run: Count
    queued_time: float
    start_time: float | None
    end_time: float | None
    ended: Str | None
    reason: Str | None
    exit_code: Int | None
    device: Str | None
    steps_done: Count
    steps_total: Count | None
    attained: float


class JobInfo(Record):
    """One job as clients see it; times are seconds since the epoch."""

    id: Int
    label: Str  # Slurm's spelling: 17, or 17_3 for task 3 of array 17
    name: Str
    user: Str
    uid: Int | None
    state: Str
    reason: Str | None
    priority: Int
    gpus: Int
    mem: Int | None
    time_limit: Int | None
    deadline: float | None
    steps_total: Int | None
    exclusive: bool
    requeue: bool
    dependency: Str | None
    held: bool
    array_job_id: Int | None
    array_task_id: Int | None
    array_max_running: Int | None
    # The command, its directory and output paths: in answers about one job (show, logs,
    # export), None in lists (status, history, info), which would otherwise carry up to
    # 256 KiB of arguments per job to everyone who lists the queue.
    script: Path | None
    args: Args | None
    workdir: Path | None
    stdout: Path | None
    stderr: Path | None
    device: Str | None
    lane: Int | None
    pid: Int | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    exit_code: Int | None
    run_count: Int
    steps_done: Int
    attained: float
    mean_iteration: float | None
    mem_persistent: Int | None
    mem_peak: Int | None
    holds_lane: bool
    events: list[EventInfo] | None = None
    mean_gap: float | None = None
    host_memory: Int | None = None  # bytes its processes hold on the host (its cgroup)
    processes: Int | None = None  # how many processes it has (its cgroup), while it runs
    host_mem: Int | None = None  # what it asked for: host memory (bytes), CPUs, GPU type,
    cpus: Int | None = None  # begin time
    gpu_type: Str | None = None
    begin_time: float | None = None
    output_pattern: Path | None = None  # -o/-e as given (%x-%j.out); None for jobs from
    error_pattern: Path | None = None  # before they were kept, and in lists
    interpreter: Path | None = None  # a Python job's, in answers about one job
    warn_signal: Str | None = None  # --signal, as [B:]NUMBER@SECONDS
    nodelist: Str | None = None  # -w: the devices it may run on, comma-separated
    retries: Int | None = None  # --retries and --retry-delay
    retries_left: Int | None = None
    ntasks: Int | None = None
    notify: Str | None = None
    mail_type: Str | None = None
    mail_user: Str | None = None
    suspended: bool = False
    preempted: bool = False  # suspended by the daemon for a higher-priority job
    retry_delay: float | None = None
    # Its forecast (gq status --start or -l, gq show): start and end, and how well they are
    # known: "known", "estimated", "guessed" (from time limits, before the first forecast
    # of it) or "unknown" (None: not asked for).
    forecast_start: Timestamp | None = None
    forecast_end: Timestamp | None = None
    forecast: Name | None = None
    # Its memory: where ``mem`` came from (None: nothing declared or measured yet), what it
    # does at an out-of-memory, how many runs ended so, and whether it was measured to use
    # more than ``mem`` (gq status's MEM!).
    mem_basis: MemoryBasis | None = None
    on_oom: OnOutOfMemory = OnOutOfMemory.REQUEUE
    ooms: Int = 0
    mem_over: bool = False
    # Whether it runs gq's worker (a Python script), which takes turns on its lane; a plain
    # process (a shell script) never holds nor waits for one.
    worker: bool = True
    interactive: bool = False  # gq run --pty: on its submitter's terminal
    # An interactive job's --idle-timeout, and while it runs, seconds since its last
    # activity (its terminal's use, a statement computing: gq.exec.job.idleness).
    idle_timeout: TimeLimit | None = None
    idle: Seconds | None = None
    # In a listing (gq status without --array-tasks), one record stands for those pending
    # tasks of an array that never started and are alike in every field shown but their ids
    # (see gq.queue.queries.unstarted_task_groups): the task ids, as squeue spells them
    # (0-99,200), and how many; ``id`` is the first one's job id, ``array_task_id`` None and
    # ``label`` squeue's 17_[0-99,200%8]. None for any other record.
    array_task_string: TaskIds | None = None
    array_task_count: Count | None = None
    # How often its lane was taken inside an iteration in its latest run: it held the
    # device past --max-hold while another job waited that the policy would run.
    lane_taken: Count = 0
    # While it runs, where a pids controller counts them: its tasks (processes and
    # threads) now, their limit (--max-pids), and the forks the kernel refused at a limit.
    pids_current: Count | None = None
    pids_max: Count | None = None
    pids_refused: Count | None = None
    # When it was last put back in the queue (None: never), and what its runs before its
    # latest add up to (gq.queue.job_runs): gq history's totals are these and the latest
    # run's figures above. ``runs``: each of its runs, in answers about one job.
    queued_time: float | None = None
    earlier_wait: float = 0.0
    earlier_run: float = 0.0
    earlier_attained: float = 0.0
    earlier_steps: Count = 0
    # Of its lane time (latest run, earlier runs), what its owner's fair share was not
    # charged: side by side, the share of the device it did not get (0: taking turns).
    uncharged: float = 0.0
    earlier_uncharged: float = 0.0
    runs: list[RunInfo] | None = None
    command: CommandLine | None = None  # as the user gave it, in answers about one job
    # A suspended job's device memory (gq.exec.host.memory_moves), in answers about one job:
    # where it is ("device", "host", or moving), why it stays on the device where it does,
    # how much went to host memory and how long the last move took (None: never moved).
    memory_place: Str | None = None
    memory_held: Str | None = None
    memory_moved: Int | None = None
    memory_took: float | None = None


class DeviceProcess(Record):
    """A process on a device, and the gq job it belongs to."""

    pid: Int
    memory: Int | None  # bytes on the device (NVML), or resident memory (psutil)
    job: Int | None  # the gq job it belongs to; None: a process gq did not start


class DeviceReading(Record):
    """One sample of a device (every figure None where the device cannot tell)."""

    time: float
    source: Str  # nvml | psutil | recorded (a --readings file overlays the sample)
    utilization: float | None = None  # percent of the last period the device was busy
    memory_used: Int | None = None
    memory_total: Int | None = None
    external_memory: Int = 0  # used by processes gq did not start; admission subtracts it
    temperature: float | None = None  # degrees Celsius
    power: float | None = None  # watts
    power_limit: float | None = None
    sm_clock: Int | None = None  # MHz
    throttle: list[Str] = field(default_factory=list)  # why clocks are held down
    ecc_errors: Int | None = None  # uncorrected, since the driver loaded
    processes: list[DeviceProcess] = field(default_factory=list)


class LaneSharing(Record):
    """How a device's jobs share it under ``--lanes auto``: ``turns`` (on one lane),
    ``trial`` or ``packed`` (on lanes of their own at once); each lane's jobs; the most
    lanes it may use; the last packed work over the turns'; what the last measurement
    found; when a packing that failed is tried again."""

    mode: Str
    lanes: list[list[Int]]
    most: Int
    gain: float | None = None
    last: Str | None = None
    retry_at: float | None = None  # when a packing that failed is tried again
    slowest: Int | None = None  # the job that kept the least of its work taking turns
    kept: float | None = None  # ... that share


class DeviceInfo(Record):
    """A device as clients see it: its memory, its lanes and the jobs on it."""

    name: Str
    kind: Str
    index: Int | None
    memory_total: Int
    model: Str
    lane_memory: Int
    jobs: list[JobInfo] = field(default_factory=list)
    # What placement sees: the most memory a lane has left under the safety condition, the
    # resident jobs, and when they must all have ended (None: one has no time limit).
    headroom: Int | None = None
    residents: Int = 0
    free_at: float | None = None
    # ... and when they should have ended, as the last forecast has it (None: one of them
    # it has no end for).
    free_forecast: float | None = None
    sharing: LaneSharing | None = None  # --lanes auto: as its host last said
    uuid: Str | None = None
    reading: DeviceReading | None = None  # the latest sample
    held: Str | None = None  # why the thermal and power guard admits no job to it now


INFO, WARNING, REFUSED = "info", "warning", "refused"


class Line(Record):
    """One line of a command's report: ``info`` to stdout; ``warning`` to stderr; ``refused``
    to stderr, and the command exits 2."""

    text: Str
    level: Str = INFO
