"""What the daemon answers: one dataclass per answer, each named by its ``kind`` on the
wire (gq.messages.ANSWERS maps kinds to classes for the client's decode), and the records
only answers carry (Delay, EndedJob, NodeLimits).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import field

from gq import defaults
from gq.codec import Bounds, Int, MaxLen, Record, Str
from gq.fields import Count, JobId, Name, Text, Timestamp
from gq.messages.records import ClientMessage, DeviceInfo, JobInfo, Label, Line


class Submitted(ClientMessage, tag="submitted"):
    """The id of the job (or array) queued."""

    job_id: Int


class Delay(Record):
    """How much later a queued job would end were the submission queued too."""

    job_id: JobId
    seconds: Annotated[float, Bounds(0, 1e12)]  # how much later it would end


class TestOnly(ClientMessage, tag="test-only"):
    """What a submission would do (gq submit --test-only): when its first task would start,
    where, and when its last would end (None: unknown), how well that is known, and the
    queued jobs it would delay."""

    tasks: Count
    start: Timestamp | None
    end: Timestamp | None
    device: Name | None
    basis: Name
    delays: list[Delay]


class FairShare(Record):
    """Each user's fair-share usage: lane seconds, decayed with the half-life (None: never),
    most first."""

    half_life: float | None
    usage: Annotated[dict[Name, float], MaxLen(defaults.MAX_SHARED_USERS)]


class Jobs(ClientMessage, tag="jobs"):
    """The answer to ListJobs or ShowJob: jobs, and how to ask for the next page."""

    jobs: list[JobInfo]
    stale: Str | None = None  # why progress figures may be out of date
    retention: float | None = None  # seconds the daemon keeps finished jobs (None: ever)
    kept_since: float | None = None  # when the oldest finished job it still keeps ended
    more: Count = 0  # jobs the label named beyond those shown (an array's tasks)
    # Finished jobs were left out: ask again with before_end=older_end, before=older.
    older_end: Timestamp | None = None
    older: JobId | None = None
    forecast_made: Timestamp | None = None  # when the forecasts given were made
    fair_share: FairShare | None = None  # the listed jobs' owners' usage, where asked for


class LogFile(ClientMessage, tag="log"):
    """A job's output file: opened by the daemon with its owner's rights, the descriptor
    beside the message (SCM_RIGHTS); or, for the owner (``opened`` false), named for the
    client to open itself."""

    job: JobInfo
    path: Str
    exists: bool
    opened: bool = True


class Script(ClientMessage, tag="script"):
    """A job's script as it would run, to export."""

    job: JobInfo
    body: bytes
    # An export of a whole job array (its id, not ID_TASK): every task id, in order.
    array_tasks: Annotated[list[Int], MaxLen(defaults.MAX_ARRAY_SIZE)] | None = None


class EndedJob(Record):
    """How one job ended: its state and exit code."""

    label: Label
    state: Name
    exit_code: Int | None


class WaitOver(ClientMessage, tag="wait-over"):
    """The answer to a Wait: how each job ended, in id order."""

    jobs: Annotated[list[EndedJob], MaxLen(defaults.MAX_WAITED)]


class Report(ClientMessage, tag="report"):
    """Lines of text for the caller to print."""

    lines: list[Line]


class PolicyInfo(ClientMessage, tag="policy"):
    """The node's scheduling policy and its settings."""

    name: Str
    fill: Str
    quantum: Str
    max_hold: float = defaults.MAX_HOLD  # seconds a hold others wait for may go on
    rotate: float | None = None  # the daemon's --rotate: a resident's turn (None: off)


class NodeLimits(Record):
    """What one user may ask of the node (the daemon's options), and how jobs are kept."""

    max_pending: Int  # pending jobs per user
    max_spool: Int  # bytes of script snapshots kept per user
    max_array: Int  # tasks in one array
    max_connections_per_user: Int
    max_connections: Int
    max_request: Int  # bytes
    retention: float | None  # seconds finished jobs are kept (None: for ever)
    max_script: Int  # bytes
    max_job_payload: Int  # bytes of environment and arguments
    containment: Str  # "cgroup v1", "cgroup v2" or "process groups", and what that holds
    max_pids: Int | None = None  # tasks one job may have at once (None: not limited here)
    node_pids: Int | None = None  # ... and all jobs together


class DaemonMemory(Record):
    """The daemon's own memory: its resident set, and of it what SQLite holds (its page
    cache and prepared statements; None where the interpreter's SQLite cannot be asked)."""

    rss: Int  # bytes
    sqlite: Int | None = None  # bytes


class NodeInfo(ClientMessage, tag="node"):
    """The node as gq info shows it."""

    pid: Int
    mode: Str  # personal | system
    started: float
    lanes: Int
    max_resident: Int
    policy: Str
    fill: Str
    quantum: Str
    note: Str | None
    devices: list[DeviceInfo]
    operators: list[Str]
    priority_cap: Int | None
    options: list[Str]  # the daemon's command-line options: a restart reuses them
    limits: NodeLimits | None = None
    drained: dict[Name, Text] = field(default_factory=dict)  # device ("*": node) -> reason
    max_hold: float = defaults.MAX_HOLD  # seconds a hold others wait for may go on
    fair_share: FairShare | None = None
    packing: bool = False  # --lanes auto
    memory: DaemonMemory | None = None
    mps: Str | None = None  # "MPS: on (devices 0)", "MPS: off (why)"


class Done(ClientMessage, tag="done"):
    """A request carried out; ``message`` says what was done."""

    message: Str


class Error(ClientMessage, tag="error"):
    """A refused request: ``message`` is one line for stderr, ``exit_code`` the CLI's."""

    message: Str
    exit_code: Int = 2
