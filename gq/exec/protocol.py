"""The wire between the daemon, the execution hosts and the workers: every message a
dataclass defined here once, used by both ends, checked field by field on decode (see
:mod:`gq.codec`), framed as one line of JSON ``{"op": KIND, fields...}`` of at most
``defaults.MAX_FRAME`` bytes, which both ends enforce.

daemon → host   Hello, Launch, Kill, Update, SetPolicy, Ack, Drain, Shutdown
host → daemon   State (answers Hello), Started, LaunchFailed, Exited (repeated in every
                State until acknowledged), Progress
worker → host   Ready, Done, Total, StepsTaken, OutOfMemory, Finished
host → worker   Go
host → client   TerminalHandedOver (an interactive job's terminal, its descriptor beside it)

A peer whose line fails to decode loses its channel and nothing else: a worker's job ends
FAILED naming the message, a daemon is dropped (the host runs on), a host is attached
again (its jobs run on). A host and a daemon of different ``HOST_VERSION`` still understand
Hello, State (a foreign one in full where it still fits this schema, else only for its
version, pid and draining flag) and Drain: the daemon then drains the host (no new jobs; it
exits after its last one), adopting its jobs where it could read them, and starts a new one
once it has gone.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import field
from typing import Annotated, Any, ClassVar

from gq import __version__, codec, defaults
from gq.codec import Bounds, MaxLen, MessageError, message
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
    Text,
    TimeLimit,
    Timestamp,
    Uid,
    Umask,
)

log = logging.getLogger(__name__)
# gq's version and that of the daemon-host protocol (bump it on any change to it).
HOST_VERSION = f"{__version__}/13"
ExitStatus = Annotated[int, codec.Bounds(0, 255)]


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


def host_paths(state_dir: str, device: str) -> tuple[str, str]:
    """The pidfile and socket of a device's execution host."""
    return os.path.join(state_dir, f"{device}.pid"), os.path.join(state_dir, f"{device}.sock")


def terminal_socket(directory: str, job: int) -> str:
    """Where an interactive job's host offers its terminal to the submitter's gq."""
    return os.path.join(directory, f"{job}.sock")


# ----- records ------------------------------------------------------------------------
@message
class LaunchSpec:
    """Everything a host needs to start one run of a job as its submitter."""

    id: JobId
    run: Positive
    argv: Annotated[Args, MaxLen(defaults.MAX_JOB_PAYLOAD // 2)]
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
    # the submitter's gq (see gq.exec.terminal).
    terminal: bool = False
    idle_timeout: TimeLimit | None = None  # seconds an interactive job may sit idle


# The descriptors a job's process starts with, besides 0-2: its script's snapshot (read
# only), and a Python job's socket to its host and page shared with it (gq.exec.lease);
# an interactive job's terminal arrives as TERMINAL_FD and becomes its 0-2.
SCRIPT_FD, WORKER_FD, PAGE_FD, TERMINAL_FD = 3, 4, 5, 6
SCRIPT_PATH = f"/dev/fd/{SCRIPT_FD}"


@message
class Shortage:
    """What a run held, and what it asked for (None: it did not say), when it ran out of
    memory."""

    held: Count
    wanted: Count | None = None


@message
class JobProgress:
    """What a host measured of one run; the daemon flushes it to the queue."""

    job: JobId
    run: Positive
    steps_done: Count = 0
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


@message
class ResidentState(JobProgress):
    """A run a host has resident, as a (re)connecting daemon learns it."""

    pid: Pid | None = None
    started: Timestamp | None = None
    time_limit: TimeLimit | None = None
    kill_why: StopWhy | None = None


# ----- daemon → host ------------------------------------------------------------------
@message
class Hello:
    op: ClassVar[str] = "hello"


@message
class Launch:
    op: ClassVar[str] = "launch"
    job: LaunchSpec


@message
class Kill:
    """SIGTERM to the run's processes now, SIGKILL after the kill wait."""

    op: ClassVar[str] = "kill"
    job: JobId
    why: StopWhy


@message
class Update:
    op: ClassVar[str] = "update"
    job: JobId
    priority: Priority
    time_limit: TimeLimit | None = None


@message
class Cap:
    """A probed GPU job's figure is known: from now on the run's allocator holds at most
    ``mem_cap`` bytes of device memory, as if it had declared that much."""

    op: ClassVar[str] = "cap"
    job: JobId
    run: Positive
    mem_cap: HostMemory


@message
class Suspend:
    """Stop a job's processes in place (``suspended``), or let them go on: it keeps its
    memory, holds no lane meanwhile, and its time limit does not run."""

    op: ClassVar[str] = "suspend"
    job: JobId
    suspended: bool


@message
class SignalGroup:
    """Send the job's main process group a signal (gq kernel run's interrupt)."""

    op: ClassVar[str] = "signal"
    job: JobId
    signum: Annotated[int, codec.Bounds(1, 64)]


@message
class SetPolicy:
    op: ClassVar[str] = "policy"
    name: Name
    fill: Name
    quantum: Name


@message
class Ack:
    """The daemon recorded this run's exit: the host may forget it."""

    op: ClassVar[str] = "ack"
    job: JobId
    run: Positive


@message
class Drain:
    op: ClassVar[str] = "drain"


@message
class Shutdown:
    op: ClassVar[str] = "shutdown"


# ----- host → daemon ------------------------------------------------------------------
@message
class Exited(JobProgress):
    """How a run ended; kept by the host until a daemon acknowledges it."""

    op: ClassVar[str] = "exited"
    code: ExitStatus | None = None
    signal: Signal | None = None
    kill_why: StopWhy | None = None
    detail: Text | None = None  # what its worker did wrong (PROTOCOL), why no exec (LAUNCH)
    end_time: Timestamp = 0.0
    shortage: Shortage | None = None  # it ran out of memory


@message
class State:
    """Everything a daemon that (re)connects must know."""

    op: ClassVar[str] = "state"
    version: Name
    pid: Pid
    device: Name
    lanes: Positive
    policy: Annotated[list[Name], MaxLen(3)]
    draining: bool
    residents: list[ResidentState]
    exited: list[Exited]


@message
class ForeignState:
    """The State of a host of another version: read only for what draining it needs."""

    op: ClassVar[str] = "state"
    version: Text
    pid: Pid
    draining: bool = False


@message
class Started:
    op: ClassVar[str] = "started"
    job: JobId
    run: Positive
    pid: Pid


@message
class LaunchFailed:
    op: ClassVar[str] = "launch_failed"
    job: JobId
    run: Positive
    reason: Text


@message
class Progress:
    op: ClassVar[str] = "progress"
    jobs: list[JobProgress]
    switches: Annotated[list[Count], MaxLen(1 << 16)] = field(default_factory=list)


# ----- worker ↔ host ------------------------------------------------------------------
@message
class Ready:
    """At an acquire: the worker blocks until Go."""

    op: ClassVar[str] = "ready"


@message
class Done:
    """At a release: one iteration over, with the worker's step count and memory."""

    op: ClassVar[str] = "done"
    steps: Count
    mem_persistent: Count | None = None
    mem_peak: Count | None = None


@message
class Total:
    op: ClassVar[str] = "total"
    steps: Positive


@message
class StepsTaken:
    """Steps counted outside a grant (a loop that runs released)."""

    op: ClassVar[str] = "progress"
    steps: Count


@message
class OutOfMemory(Shortage):
    """The script is ending on an out-of-memory error: what it held and asked for."""

    op: ClassVar[str] = "oom"


@message
class Finished:
    """The script is over: its lane is free now, before the interpreter's teardown."""

    op: ClassVar[str] = "finished"


@message
class Go:
    op: ClassVar[str] = "go"
    empty_cache: bool = False  # give back cached device memory at its release (lanes short)
    mem_cap: HostMemory | None = None  # from now on: its probe's figure (a CUDA job's cap)
    lease: Count = 0  # nonzero: the lane is its own across boundaries until asked back


# ----- host → client -------------------------------------------------------------------
@message
class TerminalHandedOver:
    """Sent, with the master of the job's pseudo-terminal beside it (SCM_RIGHTS), to the
    submitter's gq that connected to the job's terminal socket: the host keeps no copy."""

    op: ClassVar[str] = "terminal"
    job: JobId
    run: Positive


def _table(*classes: type) -> dict[str, type]:
    return {cls.op: cls for cls in classes}


TO_HOST = _table(
    Hello, Launch, Kill, Update, Cap, Suspend, SignalGroup, SetPolicy, Ack, Drain, Shutdown
)
TO_DAEMON = _table(State, Started, LaunchFailed, Exited, Progress)
FROM_WORKER = _table(Ready, Done, Total, StepsTaken, OutOfMemory, Finished)
TO_WORKER = _table(Go)
TO_CLIENT = _table(TerminalHandedOver)


# ----- framing ------------------------------------------------------------------------
def encode(message: Any) -> bytes:
    """One line ``{"op": ..., fields...}``; FrameTooLarge past the frame limit."""
    data = {"op": message.op}
    data.update(codec.to_wire(message))
    return codec.dumps(data, defaults.MAX_FRAME)


def checked(message: Any) -> Any:
    """``message`` (or a record inside one) as its receiver will decode it, every field
    within its bounds; else MessageError. For messages built from what users gave (a
    launch) or from what a worker said (a report on its job): refused here, such a value
    costs its own job, not the receiver's trust in the whole channel."""
    return codec.build(
        type(message), codec.to_wire(message), getattr(message, "op", type(message).__name__)
    )


def decode(line: bytes, kinds: dict[str, type]) -> Any:
    """The message a line holds, every field checked; MessageError otherwise."""
    data = codec.loads(line)
    op = data.pop("op", None)
    if not isinstance(op, str) or op not in kinds:
        raise MessageError(f"unknown op {str(op)[:40]!r}")
    if kinds[op] is State and data.get("version") != HOST_VERSION:
        return _foreign_state(data)
    return codec.build(kinds[op], data, op)


def _foreign_state(data: dict[str, Any]) -> State | ForeignState:
    """The state of a host of another version: read in full where it still fits this
    version's schema (its jobs can then be adopted while it drains), else only for its
    version, pid and draining flag."""
    try:
        exited = [
            {k: v for k, v in item.items() if k != "op"} if isinstance(item, dict) else item
            for item in data.get("exited", [])
        ]
        return codec.build(State, {**data, "exited": exited}, "state")
    except (MessageError, TypeError, AttributeError):
        minimal = {key: data[key] for key in ("version", "pid", "draining") if key in data}
        return codec.build(ForeignState, minimal, "state")


class Channel:
    """A framed, typed view of one connected stream socket: it sends the messages of one
    side and receives ``kinds``. The first line that fails to decode ends the channel
    (``error`` says why): framing, and trust in the peer, are lost with it."""

    def __init__(self, sock: socket.socket, kinds: dict[str, type], chunk: int = 1 << 16):
        self.sock = sock
        self.kinds = kinds
        self.chunk = chunk  # bytes read each time the socket polls readable
        self._buffer = bytearray()
        self.closed = False
        self.error: str | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any) -> bool:
        """Send a whole message; False when the peer has gone. A message over the frame
        limit raises FrameTooLarge and sends nothing."""
        line = encode(message)
        try:
            self.sock.sendall(line)
            return True
        except OSError:
            self.closed = True
            return False

    def receive(self) -> Iterator[Any]:
        """After the socket polled readable: every whole message now buffered.

        Sets ``closed`` on end of file, and ``error`` too on a bad line (after yielding
        what came before it)."""
        try:
            chunk = self.sock.recv(self.chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
        self._buffer += chunk
        yield from self._drain()

    def _drain(self) -> Iterator[Any]:
        while not self.error:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > defaults.MAX_FRAME:
                    self._fail(f"a message over {defaults.MAX_FRAME} bytes")
                return
            if newline >= defaults.MAX_FRAME:
                self._fail(f"a message over {defaults.MAX_FRAME} bytes")
                return
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            try:
                message = decode(line, self.kinds)
            except MessageError as exc:
                self._fail(f"{exc} in {_quote(line)}")
                return
            yield message

    def _fail(self, why: str) -> None:
        self.error = why
        self.closed = True
        self._buffer.clear()

    def receive_one(self) -> Any:
        """Block until one message arrives. EOFError if the peer is gone, MessageError if
        what it sent is not a message."""
        while True:
            for received in self._drain():
                return received
            if self.error:
                raise MessageError(self.error)
            self.fill()

    def fill(self, flags: int = 0) -> None:
        """Read what the peer has sent (blocking unless ``flags`` say not to: then
        BlockingIOError if nothing came); EOFError if it is gone."""
        chunk = self._read(flags)
        if not chunk:
            raise EOFError("the peer closed the connection")
        self._buffer += chunk

    def _read(self, flags: int) -> bytes:
        return self.sock.recv(1 << 16, flags)

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


class WorkerChannel(Channel):
    """A worker's end of its socket to its host: it sends what workers send and receives
    its grants, blocking. Two of the job's threads may send (a Done the device held back
    goes from the thread that waited for it): each line goes whole."""

    def __init__(self, sock: socket.socket):
        super().__init__(sock, TO_WORKER)
        self._sending = threading.Lock()

    def send(self, message: Any) -> bool:
        with self._sending:
            return super().send(message)

    def send_line(self, line: bytes) -> None:
        """A line encoded once, ahead (the worker's READY)."""
        with self._sending:
            self.sock.sendall(line)


def _quote(line: bytes) -> str:
    """A bad line as a log or a job's reason may quote it: short, printable."""
    text = line[:120].decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return repr(text + ("..." if len(line) > 120 else ""))
