"""The messages between the daemon and an execution host: what the daemon tells a host
(Hello, Launch, Kill, ...), what a host reports (State, Started, Exited, Progress, ...),
the records inside them (LaunchSpec, JobProgress, ResidentState, Shortage), why a host
ends a run (StopWhy), and the descriptors a job's process starts with. Also the one
message a host sends a client: an interactive job's terminal (TerminalHandedOver).

How they travel (framing, decode, the tables of what each end receives) is
:mod:`gq.exec.protocol`; bump HOST_VERSION here on any change to these messages.
"""

from __future__ import annotations

import enum
import logging
from typing import Annotated, Literal

import msgspec
from msgspec import field

from gq import __version__, defaults
from gq.codec import Bounds, MaxLen, Message, MessageError, Record, checked
from gq.defaults import MAX_HOLD, MAX_MAX_HOLD, MIN_MAX_HOLD
from gq.fields import (
    Args,
    Count,
    Cpus,
    Environment,
    Groups,
    HostMemory,
    JobId,
    Lane,
    Name,
    Path,
    Pid,
    Positive,
    Priority,
    Seconds,
    Signal,
    Tasks,
    Text,
    TimeLimit,
    Timestamp,
    Uid,
    Umask,
)

# gq's version and that of the daemon-host protocol (bump it on any change to it).
HOST_VERSION = f"{__version__}/19"
ExitStatus = Annotated[int, Bounds(0, 255)]

log = logging.getLogger("gq.host")


class StopWhy(str, enum.Enum):
    """Why a host ended a job's process (its exit report says so; the daemon decides the
    job's end state from it)."""

    CANCEL = "cancel"
    REQUEUE = "requeue"
    TIMEOUT = "timeout"
    DEADLINE = "deadline"
    SHUTDOWN = "shutdown"
    STRAY = "stray"  # a run the queue does not know
    PROTOCOL = "protocol"  # its worker sent what the protocol does not allow
    LAUNCH = "launch"  # its process could not be set up before its exec (detail says why)
    MOVE = "move"  # it ran no iteration and another device starts it sooner: requeued
    MEMORY = "memory"  # measured at a boundary over its memory cap (where no cgroup holds it)
    HOST_MEMORY = "host_memory"  # its processes measured over --host-mem, which no cgroup holds
    HANGUP = "hangup"  # an interactive job's terminal closed, or no client ever took it
    IDLE = "idle"  # an interactive job idle for its --idle-timeout
    YIELD = "yield"  # its lane idle for --idle-resident while others waited: requeued
    RESTORE = "restore"  # its device memory, moved to host memory, could not come back


# ----- records ------------------------------------------------------------------------
class LaunchSpec(Record):
    """Everything a host needs to start one run of a job as its submitter."""

    id: JobId
    run: Positive
    argv: Args
    worker: bool  # it speaks the worker protocol (Python scripts do)
    cwd: Path
    env: Environment
    stdout: Path | None  # None: its terminal (an interactive job's)
    stderr: Path | None
    user: Name
    submit_time: Timestamp
    uid: Uid | None = None  # None: run as the host's own user (personal mode only)
    gid: Uid | None = None
    groups: Groups = field(default_factory=list)
    umask: Umask = 0o022
    lane: Lane | None = None
    priority: Priority = 0
    steps_total: Positive | None = None
    time_limit: TimeLimit | None = None
    deadline: Timestamp | None = None
    # The script's snapshot: the host opens it (the job's user cannot reach the spool) and
    # the job's process gets it as descriptor SCRIPT_FD, named in argv as SCRIPT_PATH.
    snapshot: Path | None = None
    # A plain script's submitted path: where a root host shows the snapshot to the job, in
    # a mount namespace of its own; GQ_SCRIPT_SOURCE says where the shell reads it from.
    script_name: Path | None = None
    host_mem: HostMemory | None = None  # bytes: its cgroup's memory limit
    cpus: Cpus | None = None  # its cgroup's CPU quota (where the cpu controller serves)
    max_pids: Tasks | None = None  # its cgroup's pids.max: tasks it may have at once
    # sbatch's --signal: this signal, warn_before seconds before the time limit, to the
    # job's main process alone (warn_main, B:) or to its steps (the tasks srun started, else
    # the main process).
    warn_signal: Signal | None = None
    warn_before: Annotated[int, Bounds(0, 65535)] = 60
    warn_main: bool = False
    # Its device-memory figure (--gpu-mem, or as measured or raised since): on a GPU the
    # worker caps its own allocations there; on the cpu and emulated devices its cgroup's
    # memory limit does, else the host at each boundary.
    mem_cap: HostMemory | None = None
    probe: bool = False  # a Python job that declared nothing: its first figures go at once
    # gq run --pty: it runs on a pseudo-terminal of its own, whose master the host hands to
    # the submitter's gq (see gq.exec.host.terminal).
    terminal: bool = False
    idle_timeout: TimeLimit | None = None  # seconds an interactive job may sit idle


class Shortage(Record):
    """What a run held, and what it asked for (None: it did not say), when it ran out of
    memory."""

    held: Count
    wanted: Count | None = None


class DeviceMemory(Record):
    """Where a suspended job's device memory is (gq.exec.host.memory_places), as its host moved
    it: why it stays on the device, where it does; what went and how long the move took."""

    place: Literal["device", "moving to host memory", "host", "moving back to the device"]
    held_why: Text | None = None
    moved: Count = 0  # bytes
    took: Seconds | None = None


class JobProgress(Record):
    """What a host measured of one run; the daemon flushes it to the queue."""

    job: JobId
    run: Positive
    steps_done: Count = 0  # its own count
    steps_total: Positive | None = None
    attained: Seconds = 0.0
    mean_iteration: Seconds | None = None
    mean_gap: Seconds | None = None
    mem_persistent: Count | None = None
    mem_peak: Count | None = None
    holds_lane: bool = False
    iterations: Count = 0  # the iterations its memory figures cover (a probe's is over at
    # defaults.PROBE_ITERATIONS)
    startup: Seconds | None = None  # from its launch to its first acquire (None: not yet)
    active_at: Timestamp | None = None  # an interactive job's last activity (gq.exec.idle)
    # How often its lane was taken inside an iteration: it held it past --max-hold while
    # another job waited that the policy would grant.
    lane_taken: Count = 0
    # Its steps as far as its host vouches for them: a worker's, no more than the
    # iterations the host granted it. What forecasts go on (its own count is its word).
    steps_counted: Count = 0
    memory: DeviceMemory | None = None  # None: never moved, nor held while suspended
    # Of ``attained``, what its owner's fair share is charged: side by side, its lane time
    # at the share of the device it got (gq.exec.lane.packing.lane_share); None: all of it.
    # Apart, because srtf, rr and the forecasts go on its whole lane time.
    charged: Seconds | None = None


def charged(progress: JobProgress) -> float:
    """The lane time a run's owner is charged for it (never more than it attained)."""
    if progress.charged is None:
        return progress.attained
    return min(progress.attained, progress.charged)


def uncharged(progress: JobProgress) -> float:
    """Of a run's lane time, what its owner is not charged (side by side; never below 0)."""
    return progress.attained - charged(progress)


class ResidentState(JobProgress):
    """A run a host has resident, as a (re)connecting daemon learns it."""

    pid: Pid | None = None
    started: Timestamp | None = None
    time_limit: TimeLimit | None = None
    kill_why: StopWhy | None = None


# ----- daemon → host ------------------------------------------------------------------
class Hello(Message, tag="hello"):
    pass


class Launch(Message, tag="launch"):
    job: LaunchSpec


class Kill(Message, tag="kill"):
    """SIGTERM to the run's processes now, SIGKILL after the kill wait."""

    job: JobId
    why: StopWhy


class Update(Message, tag="update"):
    job: JobId
    priority: Priority
    time_limit: TimeLimit | None = None


class Cap(Message, tag="cap"):
    """A probed GPU job's figure is known: from now on the run's allocator holds at most
    ``mem_cap`` bytes of device memory, as if it had declared that much."""

    job: JobId
    run: Positive
    mem_cap: HostMemory


class Suspend(Message, tag="suspend", omit_defaults=True):
    """Stop a job's processes in place (``suspended``), or let them go on: it keeps its
    memory, holds no lane meanwhile, and its time limit does not run."""

    job: JobId
    suspended: bool
    # Bytes of the node's host memory its device memory may take there, if it moves out
    # (what no other job reserved, for a job without --host-mem); None: no bound but the
    # node's free memory and the job's own --host-mem. Left out where None, and never sent
    # to a host of another version (it would refuse a field it does not know).
    host_room: Count | None = None


class SignalGroup(Message, tag="signal"):
    """Send the job's main process group a signal (gq kernel run's interrupt)."""

    job: JobId
    signum: Annotated[int, Bounds(1, 64)]


class SetPolicy(Message, tag="policy"):
    name: Name
    fill: Name
    quantum: Name
    # Seconds a job may go on holding a lane while another job waits that the policy would
    # grant: past it, its processes are frozen and the lane is the next job's.
    max_hold: Annotated[float, Bounds(MIN_MAX_HOLD, MAX_MAX_HOLD)] = MAX_HOLD


class Shares(Message, tag="shares"):
    """Each user with jobs resident on the host, and their fair-share usage beside those
    jobs (decayed lane seconds of their other jobs, ended or elsewhere): what ``fair`` adds
    their residents' attained time to (gq.daemon.scheduling.fair_share)."""

    users: Annotated[dict[Name, Seconds], MaxLen(defaults.MAX_SHARED_USERS)]


class Ack(Message, tag="ack"):
    """The daemon recorded this run's exit: the host may forget it."""

    job: JobId
    run: Positive


class Drain(Message, tag="drain"):
    pass


class Shutdown(Message, tag="shutdown"):
    pass


# ----- host → daemon ------------------------------------------------------------------
class Exited(JobProgress, Message, tag="exited"):
    """How a run ended; kept by the host until a daemon acknowledges it."""

    code: ExitStatus | None = None
    signal: Signal | None = None
    kill_why: StopWhy | None = None
    detail: Text | None = None  # what its worker did wrong (PROTOCOL), why no exec (LAUNCH)
    end_time: Timestamp = 0.0
    shortage: Shortage | None = None  # it ran out of memory


class State(Message, tag="state"):
    """Everything a daemon that (re)connects must know."""

    version: Name
    pid: Pid
    device: Name
    lanes: Positive
    policy: Annotated[list[Name], MaxLen(3)]
    draining: bool
    residents: list[ResidentState]
    exited: list[Exited]


class ForeignState(Message, tag="state"):
    """The State of a host of another version: read only for what draining it needs."""

    version: Text
    pid: Pid
    draining: bool = False


class Started(Message, tag="started"):
    job: JobId
    run: Positive
    pid: Pid


class LaunchFailed(Message, tag="launch_failed"):
    job: JobId
    run: Positive
    reason: Text


class PackingReport(Record):
    """How a device's jobs share it under ``--lanes auto`` (gq.exec.lane.packing): taking turns
    on one lane, or on lanes of their own at once; the jobs of each lane in use; the most
    lanes it may use; the last packed work over the turns'; what the last measurement
    found; and seconds before a packing that failed is tried again."""

    mode: Name
    lanes: Annotated[list[Annotated[list[JobId], MaxLen(1 << 12)]], MaxLen(64)]
    most: Positive
    gain: Annotated[float, Bounds(0.0, 1e6)] | None = None
    last: Name | None = None
    retry_at: Timestamp | None = None
    # the job that kept the least of its work taking turns, and that share
    slowest: JobId | None = None
    kept: Annotated[float, Bounds(0.0, 1e6)] | None = None


class Progress(Message, tag="progress"):
    jobs: list[JobProgress]
    switches: Annotated[list[Count], MaxLen(1 << 16)] = field(default_factory=list)
    packing: PackingReport | None = None  # --lanes auto: how its jobs share the device


# ----- host → client -------------------------------------------------------------------
class TerminalHandedOver(Message, tag="terminal"):
    """Sent, with the master of the job's pseudo-terminal beside it (SCM_RIGHTS), to the
    submitter's gq that connected to the job's terminal socket: the host keeps no copy."""

    job: JobId
    run: Positive


def within_bounds(report):
    """A report on a job as the daemon will decode it. A measured figure past the wire's
    bounds (from a worker's word, say) would make the daemon drop the whole connection,
    and an exit report it can never take would be kept and sent again for ever: the job's
    measured figures are left out of it instead, and then what its worker did wrong."""
    try:
        return checked(report)
    except MessageError as exc:
        log.warning(
            "job %d: a figure out of bounds (%s); reported without its figures", report.job, exc
        )
    bare = msgspec.structs.replace(
        report,
        attained=0.0,
        charged=None,
        mean_iteration=None,
        mean_gap=None,
        mem_persistent=None,
        mem_peak=None,
        iterations=0,
        active_at=None,
    )
    try:
        return checked(bare)
    except MessageError as exc:
        if not isinstance(bare, Exited):
            return bare  # what is left are the host's own counts
        log.warning("job %d: its report is refused still (%s); sent without detail", bare.job, exc)
        return checked(msgspec.structs.replace(bare, detail=None))
