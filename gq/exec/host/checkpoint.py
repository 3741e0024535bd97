"""Moving a suspended job's device memory to host memory and back: the CUDA driver's
checkpoint API behind one small interface (:class:`Checkpoints`), with a stand-in for the
cpu device's tests (:class:`FakeCheckpoints`) and the answer where nothing can move
(:class:`NoCheckpoints`).

The driver (570 or later) does it to an unmodified process: ``cuCheckpointProcessLock``
waits for the work the process submitted and blocks its further CUDA calls,
``cuCheckpointProcessCheckpoint`` copies its device memory into its own host memory and
releases every GPU resource it holds (it leaves ``nvidia-smi``); ``Restore`` brings it back
at the same addresses and ``Unlock`` lets it go on. The host that calls them needs no CUDA
context and no device memory of its own: only the driver's library, ``cuInit`` (which opens
the device files and creates nothing), and the right to act on the process (root, as the
host is). What the driver refuses (CUDA IPC or unified memory, a process on several
devices) comes back as its error's name, and the job keeps its memory on the device.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

LOCK_TIMEOUT = 30.0  # seconds the driver may wait for a process's submitted work
_ARGS = 64  # bytes of every optional-arguments struct of the API (all zero: the defaults)
_SUCCESS = 0
_RUNNING, _LOCKED, _CHECKPOINTED = 0, 1, 2  # CUprocessState
FAKE_FAILS = "GQ_FAKE_CHECKPOINT_FAILS"  # in a job's environment: the fake refuses it
FAKE_STUCK = "stuck"  # its value where the fake's refusal also leaves the process locked


class CheckpointError(Exception):
    """The driver refused a move, or the move cannot be made: the message says why, in
    words a user reads in ``gq show``. ``stuck``: a process was left locked or
    checkpointed, so its job cannot go on."""

    def __init__(self, message: str, stuck: bool = False):
        super().__init__(message)
        self.stuck = stuck


@dataclass(frozen=True)
class Process:
    """A process whose memory the host means to move: its pid, and when it started (clock
    ticks after boot). The driver takes a pid alone, and a move may wait in the driver's
    queue behind another job's for seconds: the start is read again just before each call,
    so a pid the kernel has given to another process meanwhile (another user's) is left
    alone."""

    pid: int
    started: int


def start_of(pid: int) -> int | None:
    """When a process started, from ``/proc/PID/stat`` (None: there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            line = stat.read()
    except OSError:
        return None
    # Its name (the second field) is in parentheses and may hold spaces and parentheses:
    # the fields that follow its last ")" begin with the third, the start is the 22nd.
    fields = line[line.rindex(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def identify(pids: Sequence[int]) -> list[Process]:
    """``pids`` as processes that can be recognised again (those gone already left out)."""
    return [Process(pid, started) for pid in pids if (started := start_of(pid)) is not None]


class Checkpoints(Protocol):
    # Whether a move carries the memory into the process's own host memory, where the
    # node's free memory and the job's --host-mem must hold it (the fake's, in the books).
    carries: bool

    def refusal(self) -> str | None:
        """Why no job's memory can move here (None: a job's may)."""
        ...

    def move_out(self, processes: Sequence[Process]) -> list[Process]:
        """Move the device memory of those of ``processes`` that hold any to host memory;
        the ones moved. Where one fails, those moved already are brought back first."""
        ...

    def move_in(self, processes: Sequence[Process]) -> None:
        """Bring the memory of ``processes`` (as :meth:`move_out` returned them) back, and
        let them go on."""
        ...


class NoCheckpoints:
    """Where memory cannot move: every suspended job keeps its memory, frozen."""

    carries = False

    def __init__(self, why: str):
        self.why = why

    def refusal(self) -> str | None:
        return self.why

    def move_out(self, processes: Sequence[Process]) -> list[Process]:
        raise CheckpointError(self.why)

    def move_in(self, processes: Sequence[Process]) -> None:
        raise CheckpointError(self.why)


class FakeCheckpoints:
    """The cpu device's stand-in, for tests of everything around the driver: the job's
    main process is said moved (its declared device memory freed, in the books) unless its
    environment names :data:`FAKE_FAILS`, which it refuses as the driver refuses a process
    with CUDA IPC memory. Its moves carry the job's figure, in the books (nothing is
    copied), so the checks of host memory are made as for the driver's."""

    carries = True

    def refusal(self) -> str | None:
        return None

    def move_out(self, processes: Sequence[Process]) -> list[Process]:
        for process in processes[:1]:
            fails = _environment(process.pid, FAKE_FAILS)
            if fails == FAKE_STUCK:
                raise CheckpointError(
                    "cuCheckpointProcessCheckpoint failed: CUDA_ERROR_NOT_SUPPORTED; then "
                    "cuCheckpointProcessUnlock failed: CUDA_ERROR_ILLEGAL_STATE (the fake's)",
                    stuck=True,
                )
            if fails is not None:
                raise CheckpointError(
                    "cuCheckpointProcessLock failed: CUDA_ERROR_NOT_SUPPORTED (the fake's)"
                )
        return list(processes[:1])

    def move_in(self, processes: Sequence[Process]) -> None:
        return None


def _environment(pid: int, variable: str) -> str | None:
    """A variable's value in a process's environment (None: not there, or unreadable)."""
    prefix = variable.encode() + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            entries = environ.read().split(b"\0")
    except OSError:
        return None
    found = next((entry for entry in entries if entry.startswith(prefix)), None)
    return None if found is None else found[len(prefix) :].decode(errors="replace")


class DriverCheckpoints:
    """The CUDA driver's checkpoint API, through ``libcuda`` (``library`` stands in for
    it in tests: anything with its functions as attributes)."""

    carries = True

    def __init__(self, library: Any = None, started: Callable[[int], int | None] = start_of):
        self._why: str | None = None
        self._started = started
        self.lib = library
        if self.lib is None:
            try:
                self.lib = ctypes.CDLL("libcuda.so.1")
            except OSError:
                self._why = "no CUDA driver library (libcuda.so.1) on this node"
                return
        if not hasattr(self.lib, "cuCheckpointProcessCheckpoint"):
            self._why = "the CUDA driver has no checkpoint API (driver 570 or later has it)"
            return
        code = self.lib.cuInit(0)
        if code != _SUCCESS:
            self._why = f"the CUDA driver did not start: {self._name(code)}"

    def refusal(self) -> str | None:
        return self._why

    def move_out(self, processes: Sequence[Process]) -> list[Process]:
        moved: list[Process] = []
        try:
            for process in processes:
                if not self._same(process) or self._state(process.pid) != _RUNNING:
                    continue  # gone, no CUDA in it (a launcher, a data loader), or not its own
                lock = ctypes.create_string_buffer(_ARGS)  # timeoutMs is its first field
                ctypes.c_uint.from_buffer(lock).value = int(LOCK_TIMEOUT * 1000)
                self._call("cuCheckpointProcessLock", process.pid, lock)
                moved.append(process)
                self._call("cuCheckpointProcessCheckpoint", process.pid, None)
        except CheckpointError as refused:
            left = self._undo(moved)
            if left is not None:
                raise CheckpointError(f"{refused}; then {left}", stuck=True) from None
            raise
        return moved

    def move_in(self, processes: Sequence[Process]) -> None:
        for process in processes:
            if not self._same(process):
                continue  # it ended while locked: its pid may be another's now
            if self._state(process.pid) == _CHECKPOINTED:
                self._call("cuCheckpointProcessRestore", process.pid, None)
            self._call("cuCheckpointProcessUnlock", process.pid, None)

    def _same(self, process: Process) -> bool:
        return self._started(process.pid) == process.started

    def _undo(self, processes: list[Process]) -> str | None:
        """Back to running, as far as the driver lets them; why one was not (None: all
        were). A process left locked or checkpointed would wait for ever."""
        left = None
        for process in processes:
            try:
                self.move_in([process])
            except CheckpointError as exc:
                left = left or str(exc)
        return left

    def _state(self, pid: int) -> int | None:
        state = ctypes.c_int(-1)
        if self.lib.cuCheckpointProcessGetState(pid, ctypes.byref(state)) != _SUCCESS:
            return None
        return state.value

    def _call(self, function: str, pid: int, args: Any) -> None:
        code = getattr(self.lib, function)(pid, args)
        if code != _SUCCESS:
            raise CheckpointError(f"{function} failed: {self._name(code)}")

    def _name(self, code: int) -> str:
        name = ctypes.c_char_p()
        getter = getattr(self.lib, "cuGetErrorName", None)
        if getter is None or getter(code, ctypes.byref(name)) != _SUCCESS or not name.value:
            return f"CUDA error {code}"
        return name.value.decode(errors="replace")


def moves_memory(kind: str, cuda: bool) -> bool:
    """Whether a host of ``--checkpoint kind`` moves suspended jobs' memory (its driver
    may still refuse a job's): the driver's on a GPU, the fake on the cpu device only."""
    return kind == ("auto" if cuda else "fake")


def open_checkpoints(kind: str, cuda: bool) -> Checkpoints:
    """The host's mover: ``auto`` is the driver's on a GPU; on the cpu device there is no
    device memory to move (``fake`` stands in for tests); ``off`` moves nothing."""
    if moves_memory(kind, cuda):
        return DriverCheckpoints() if cuda else FakeCheckpoints()
    if kind == "off":
        return NoCheckpoints("moving device memory is off on this node (--checkpoint off)")
    if cuda:  # the fake would free, in the books, memory that stays
        return NoCheckpoints("--checkpoint fake stands in on the cpu device only")
    return NoCheckpoints("the cpu device holds no device memory to move")
