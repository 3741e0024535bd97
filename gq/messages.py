"""What a client may ask the daemon, and what it answers: every request and answer is a
dataclass defined here once, used by both ends (as pueue's client and daemon share
``pueue_lib``'s message types).

On the wire each message is one line of JSON, ``{"v": VERSION, "kind": ..., fields...}``,
one request and one answer per connection over the daemon's Unix stream socket.
:func:`decode` checks the version, the kind and every field's type, and rejects anything
else in one place, so handlers only ever see well-formed messages. ``bytes`` fields travel
as base64. This module imports nothing beyond the standard library: the client loads it on
every command.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import types
import typing
from dataclasses import field
from typing import Any, ClassVar

VERSION = 1
MAX_REQUEST = 16 << 20  # bytes in one request line (a script snapshot travels in it)
MAX_SCRIPT = 4 << 20  # Slurm's default max_script_size


class MessageError(Exception):
    """A line that is not a well-formed message of this protocol version."""


def dataclass(cls):
    """A message class: a dataclass without generated repr and eq, which cost the client
    most of this module's import time."""
    return dataclasses.dataclass(repr=False, eq=False)(cls)


class VersionMismatch(MessageError):
    def __init__(self, theirs: object):
        super().__init__(f"protocol version {theirs!r}, expected {VERSION}")
        self.theirs = theirs


# ----- shared records -----------------------------------------------------------------
@dataclass
class EventInfo:
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
    script: str
    args: list[str]
    workdir: str
    stdout: str
    stderr: str
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


@dataclass
class DeviceProcess:
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

    name: str | None = None
    gpus: int = 1
    mem: int | None = None
    time_limit: int | None = None
    deadline: float | None = None  # seconds since the epoch
    priority: int = 0
    steps: int | None = None
    output: str = "gq-%j.out"
    error: str | None = None
    exclusive: bool = False
    requeue: bool = False
    interpreter: str | None = None
    array: str | None = None
    dependency: str | None = None
    held: bool = False


@dataclass
class Submit:
    kind: ClassVar[str] = "submit"
    script_path: str  # as submitted, absolute
    script: bytes  # the snapshot: read by the client, with the caller's own rights
    args: list[str]
    workdir: str
    env: dict[str, str]
    umask: int
    options: SubmitOptions


@dataclass
class ListJobs:
    """status and history: jobs in ``states`` (all states when None)."""

    kind: ClassVar[str] = "list"
    states: list[str] | None = None
    users: list[str] | None = None


@dataclass
class ShowJob:
    """One job with its state history; an array's id lists every task."""

    kind: ClassVar[str] = "show"
    label: str


@dataclass
class OpenLog:
    """A job's output file, opened by the daemon as its owner may and passed as a descriptor."""

    kind: ClassVar[str] = "logs"
    label: str
    stderr: bool = False


@dataclass
class ExportScript:
    kind: ClassVar[str] = "export"
    label: str


@dataclass
class Cancel:
    kind: ClassVar[str] = "cancel"
    labels: list[str]
    state: str | None = None
    name: str | None = None
    user: str | None = None


@dataclass
class Hold:
    kind: ClassVar[str] = "hold"
    labels: list[str]


@dataclass
class Release:
    kind: ClassVar[str] = "release"
    labels: list[str]


@dataclass
class Requeue:
    kind: ClassVar[str] = "requeue"
    labels: list[str]


@dataclass
class Update:
    kind: ClassVar[str] = "update"
    labels: list[str]
    priority: int | None = None
    time_limit: int | None = None
    name: str | None = None


@dataclass
class SetPolicy:
    kind: ClassVar[str] = "policy-set"
    name: str
    fill: str = "always"
    quantum: str = "100ms"


@dataclass
class GetPolicy:
    kind: ClassVar[str] = "policy-get"


@dataclass
class NodeInfoRequest:
    kind: ClassVar[str] = "info"


@dataclass
class Stop:
    """Stop the daemon; ``keep_jobs`` leaves running jobs to their execution hosts."""

    kind: ClassVar[str] = "stop"
    keep_jobs: bool = False


# ----- answers ------------------------------------------------------------------------
@dataclass
class Submitted:
    kind: ClassVar[str] = "submitted"
    job_id: int


@dataclass
class Jobs:
    kind: ClassVar[str] = "jobs"
    jobs: list[JobInfo]
    stale: str | None = None  # why progress figures may be out of date


@dataclass
class LogFile:
    """The descriptor of the file itself travels beside the message (SCM_RIGHTS)."""

    kind: ClassVar[str] = "log"
    job: JobInfo
    path: str
    exists: bool


@dataclass
class Script:
    kind: ClassVar[str] = "script"
    job: JobInfo
    body: bytes


@dataclass
class Report:
    kind: ClassVar[str] = "report"
    lines: list[Line]


@dataclass
class PolicyInfo:
    kind: ClassVar[str] = "policy"
    name: str
    fill: str
    quantum: str


@dataclass
class NodeInfo:
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


@dataclass
class Done:
    kind: ClassVar[str] = "done"
    message: str


@dataclass
class Error:
    """A refused request: ``message`` is one line for stderr, ``exit_code`` the CLI's."""

    kind: ClassVar[str] = "error"
    message: str
    exit_code: int = 2


REQUESTS: dict[str, type] = {cls.kind: cls for cls in (
    Submit, ListJobs, ShowJob, OpenLog, ExportScript, Cancel, Hold, Release, Requeue, Update,
    SetPolicy, GetPolicy, NodeInfoRequest, Stop)}
ANSWERS: dict[str, type] = {cls.kind: cls for cls in (
    Submitted, Jobs, LogFile, Script, Report, PolicyInfo, NodeInfo, Done, Error)}


# ----- the codec ----------------------------------------------------------------------
def encode(message: Any) -> bytes:
    """One line: the version, the kind, then the fields."""
    data = {"v": VERSION, "kind": message.kind}
    data.update(_to_wire(message))
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes, kinds: dict[str, type]) -> Any:
    """The message a line holds, every field checked; MessageError otherwise."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessageError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MessageError("not a JSON object")
    if data.get("v") != VERSION:
        raise VersionMismatch(data.get("v"))
    kind = data.pop("kind", None)
    del data["v"]
    if not isinstance(kind, str) or kind not in kinds:
        raise MessageError(f"unknown kind {kind!r}")
    return _from_wire(kinds[kind], data, kind)


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list):
        return [_to_wire(item) for item in value]
    if isinstance(value, dict):
        return {key: _to_wire(item) for key, item in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _from_wire(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise MessageError(f"{where}: expected an object")
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    values = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise MessageError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    for name, spec in fields.items():
        if name in data:
            values[name] = _check(data[name], hints[name], f"{where}.{name}")
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise MessageError(f"{where}: missing field {name!r}")
    return cls(**values)


def _check(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _check(value, option, where)
            except MessageError:
                continue
        raise MessageError(f"{where}: unexpected {type(value).__name__}")
    if hint is type(None):
        if value is None:
            return None
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is bytes:
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except ValueError:
                raise MessageError(f"{where}: not base64") from None
    elif origin is list:
        if isinstance(value, list):
            (item,) = typing.get_args(hint)
            return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        if isinstance(value, dict):
            _, item = typing.get_args(hint)
            return {k: _check(v, item, f"{where}.{k}") for k, v in value.items()}
    elif dataclasses.is_dataclass(hint):
        return _from_wire(hint, value, where)
    raise MessageError(f"{where}: unexpected {type(value).__name__}")
