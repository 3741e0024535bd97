"""What the daemon answers: one dataclass per answer, each named by its ``kind`` on the
wire (gq.messages.ANSWERS maps kinds to classes for the client's decode), and the records
only answers carry (Delay, EndedJob, NodeLimits).
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, ClassVar

from gq import defaults
from gq.codec import Bounds, MaxLen, message
from gq.fields import Count, JobId, Name, Text, Timestamp
from gq.messages.records import DeviceInfo, JobInfo, Label, Line


@message
class Submitted:
    """The id of the job (or array) queued."""

    kind: ClassVar[str] = "submitted"
    job_id: int


@message
class Delay:
    """How much later a queued job would end were the submission queued too."""

    job_id: JobId
    seconds: Annotated[float, Bounds(0, 1e12)]  # how much later it would end


@message
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


@message
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


@message
class LogFile:
    """A job's output file: opened by the daemon with its owner's rights, the descriptor
    beside the message (SCM_RIGHTS); or, for the owner (``opened`` false), named for the
    client to open itself."""

    kind: ClassVar[str] = "log"
    job: JobInfo
    path: str
    exists: bool
    opened: bool = True


@message
class Script:
    """A job's script as it would run, to export."""

    kind: ClassVar[str] = "script"
    job: JobInfo
    body: bytes
    # An export of a whole job array (its id, not ID_TASK): every task id, in order.
    array_tasks: Annotated[list[int], MaxLen(defaults.MAX_ARRAY_SIZE)] | None = None


@message
class EndedJob:
    """How one job ended: its state and exit code."""

    label: Label
    state: Name
    exit_code: int | None


@message
class WaitOver:
    """The answer to a Wait: how each job ended, in id order."""

    kind: ClassVar[str] = "wait-over"
    jobs: Annotated[list[EndedJob], MaxLen(defaults.MAX_WAITED)]


@message
class Report:
    """Lines of text for the caller to print."""

    kind: ClassVar[str] = "report"
    lines: list[Line]


@message
class PolicyInfo:
    """The node's scheduling policy and its settings."""

    kind: ClassVar[str] = "policy"
    name: str
    fill: str
    quantum: str


@message
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


@message
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


@message
class Done:
    """A request carried out; ``message`` says what was done."""

    kind: ClassVar[str] = "done"
    message: str


@message
class Error:
    """A refused request: ``message`` is one line for stderr, ``exit_code`` the CLI's."""

    kind: ClassVar[str] = "error"
    message: str
    exit_code: int = 2
