"""The driver's checkpoint calls (gq.exec.host.checkpoint) against a stand-in for libcuda that
keeps each process's state as the driver documents it, and the table of where a job's
memory may go (gq.exec.host.memory_places)."""

from __future__ import annotations

import pytest

from gq.exec.host.checkpoint import (
    CheckpointError,
    DriverCheckpoints,
    Process,
    identify,
    open_checkpoints,
    start_of,
)
from gq.exec.host.memory_places import TRANSITIONS, Memory, Move, Place, step

RUNNING, LOCKED, CHECKPOINTED = 0, 1, 2
NOT_SUPPORTED, ILLEGAL_STATE, INVALID_VALUE = 801, 401, 1
NAMES = {
    NOT_SUPPORTED: b"CUDA_ERROR_NOT_SUPPORTED",
    ILLEGAL_STATE: b"CUDA_ERROR_ILLEGAL_STATE",
    INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE",
}


class Driver:
    """libcuda's checkpoint API as its documentation describes it: a process with CUDA is
    RUNNING, Lock makes it LOCKED, Checkpoint CHECKPOINTED, Restore LOCKED, Unlock RUNNING;
    any other order is CUDA_ERROR_ILLEGAL_STATE, a process without CUDA an invalid value."""

    def __init__(
        self,
        cuda: list[int],
        refuses: dict[int, int] | None = None,
        stuck: frozenset[int] = frozenset(),
    ):
        self.states = dict.fromkeys(cuda, RUNNING)
        self.refuses = refuses or {}  # pid -> the error its Checkpoint returns
        self.stuck = stuck  # pids whose Unlock fails
        self.calls: list[tuple[str, int]] = []
        self.timeouts: list[int] = []

    def cuInit(self, flags):
        return 0

    def cuGetErrorName(self, code, name):
        name._obj.value = NAMES.get(code, b"CUDA_ERROR_UNKNOWN")
        return 0

    def cuCheckpointProcessGetState(self, pid, state):
        if pid not in self.states:
            return INVALID_VALUE
        state._obj.value = self.states[pid]
        return 0

    def _move(self, name, pid, before, after):
        self.calls.append((name, pid))
        if self.states.get(pid) != before:
            return ILLEGAL_STATE
        self.states[pid] = after
        return 0

    def cuCheckpointProcessLock(self, pid, args):
        self.timeouts.append(int.from_bytes(bytes(args)[:4], "little"))
        return self._move("lock", pid, RUNNING, LOCKED)

    def cuCheckpointProcessCheckpoint(self, pid, args):
        if pid in self.refuses:
            self.calls.append(("checkpoint", pid))
            return self.refuses[pid]
        return self._move("checkpoint", pid, LOCKED, CHECKPOINTED)

    def cuCheckpointProcessRestore(self, pid, args):
        return self._move("restore", pid, CHECKPOINTED, LOCKED)

    def cuCheckpointProcessUnlock(self, pid, args):
        if pid in self.stuck:
            self.calls.append(("unlock", pid))
            return ILLEGAL_STATE
        return self._move("unlock", pid, LOCKED, RUNNING)


def processes(*pids: int) -> list[Process]:
    return [Process(pid, STARTED) for pid in pids]


STARTED = 4242  # when every stand-in process started, unless a test says otherwise


def driver_checkpoints(driver, started=None) -> DriverCheckpoints:
    return DriverCheckpoints(driver, started=lambda pid: (started or {}).get(pid, STARTED))


def test_a_jobs_cuda_processes_are_locked_then_checkpointed_and_come_back_in_order():
    driver = Driver(cuda=[11, 13])
    checkpoints = driver_checkpoints(driver)
    assert checkpoints.refusal() is None
    moved = checkpoints.move_out(processes(11, 12, 13))  # 12: a launcher without CUDA
    assert moved == processes(11, 13)
    assert driver.states == {11: CHECKPOINTED, 13: CHECKPOINTED}
    assert driver.timeouts == [30_000, 30_000]  # timeoutMs, the struct's first field
    checkpoints.move_in(moved)
    assert driver.states == {11: RUNNING, 13: RUNNING}
    assert driver.calls[-4:] == [("restore", 11), ("unlock", 11), ("restore", 13), ("unlock", 13)]


def test_a_refused_checkpoint_brings_back_what_had_moved_and_says_the_drivers_word():
    driver = Driver(cuda=[11, 13], refuses={13: NOT_SUPPORTED})  # CUDA IPC memory, say
    checkpoints = driver_checkpoints(driver)
    with pytest.raises(CheckpointError) as refused:
        checkpoints.move_out(processes(11, 13))
    assert str(refused.value) == "cuCheckpointProcessCheckpoint failed: CUDA_ERROR_NOT_SUPPORTED"
    assert driver.states == {11: RUNNING, 13: RUNNING}  # none left locked or checkpointed


def test_a_refused_checkpoint_that_cannot_be_undone_says_its_process_is_stuck():
    driver = Driver(cuda=[11, 13], refuses={13: NOT_SUPPORTED}, stuck=frozenset({11}))
    with pytest.raises(CheckpointError) as refused:
        driver_checkpoints(driver).move_out(processes(11, 13))
    assert refused.value.stuck
    assert str(refused.value) == (
        "cuCheckpointProcessCheckpoint failed: CUDA_ERROR_NOT_SUPPORTED; "
        "then cuCheckpointProcessUnlock failed: CUDA_ERROR_ILLEGAL_STATE"
    )
    assert driver.states == {11: LOCKED, 13: RUNNING}  # 13 undone; 11 left as it was


def test_a_restore_the_driver_refuses_is_an_error_with_its_name():
    driver = Driver(cuda=[11])
    checkpoints = driver_checkpoints(driver)
    checkpoints.move_out(processes(11))
    driver.states[11] = RUNNING  # as if something else had unlocked it meanwhile
    with pytest.raises(
        CheckpointError, match="cuCheckpointProcessUnlock failed: CUDA_ERROR_ILLEGAL"
    ):
        checkpoints.move_in(processes(11))


def test_a_pid_given_to_another_process_meanwhile_is_neither_locked_nor_restored():
    """Between the host's queueing a move and the driver's thread making it, a job's
    process ended and the kernel gave its pid to another (another user's, with CUDA): the
    driver is not called on it, out or back."""
    driver = Driver(cuda=[11, 13])
    checkpoints = driver_checkpoints(driver, started={13: STARTED + 1})
    assert checkpoints.move_out(processes(11, 13)) == processes(11)
    assert driver.states == {11: CHECKPOINTED, 13: RUNNING}
    assert ("lock", 13) not in driver.calls
    moved_back = driver_checkpoints(driver, started={11: STARTED + 1})
    moved_back.move_in(processes(11))  # it ended while locked, its pid another's now
    assert [call for call in driver.calls if call[1] == 11] == [("lock", 11), ("checkpoint", 11)]


def test_a_process_is_known_again_by_its_start_and_a_gone_one_not_at_all():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (known,) = identify([child.pid])
        assert known.started == start_of(child.pid) and known.started > 0
    finally:
        child.kill()
        child.wait()
    assert start_of(child.pid) is None
    assert identify([child.pid]) == []


class OldDriver:
    """A driver before 570: no checkpoint API."""

    def cuInit(self, flags):
        return 0


class DeadDriver(Driver):
    def cuInit(self, flags):
        return 100  # CUDA_ERROR_NO_DEVICE


def test_drivers_that_cannot_move_memory_say_why_and_move_nothing():
    assert DriverCheckpoints(OldDriver()).refusal() == (
        "the CUDA driver has no checkpoint API (driver 570 or later has it)"
    )
    assert DriverCheckpoints(DeadDriver([])).refusal().startswith("the CUDA driver did not start")
    cpu = open_checkpoints("auto", cuda=False)
    assert cpu.refusal() == "the cpu device holds no device memory to move"
    with pytest.raises(CheckpointError):
        cpu.move_out(processes(1))
    assert "cpu device only" in open_checkpoints("fake", cuda=True).refusal()
    off = open_checkpoints("off", cuda=True)
    assert "--checkpoint off" in off.refusal()


def test_memory_goes_out_and_back_only_as_the_table_says():
    assert step(Place.DEVICE, Move.OUT) is Place.OUTGOING
    assert step(Place.OUTGOING, Move.DONE) is Place.HOST
    assert step(Place.OUTGOING, Move.FAILED) is Place.DEVICE
    assert step(Place.HOST, Move.IN) is Place.INCOMING
    assert step(Place.INCOMING, Move.DONE) is Place.DEVICE
    assert step(Place.INCOMING, Move.FAILED) is Place.HOST
    for place in Place:
        for move in Move:
            if (place, move) not in TRANSITIONS:
                with pytest.raises(KeyError):
                    step(place, move)
    assert Memory().report() is None  # never moved nor held: the daemon is told nothing
    held = Memory(held_why="the driver refused")
    assert held.report() is not None and held.report().place == "device"


class _Granter:
    """The lanes' side a host's memory moves call on: suspends noted, nothing granted."""

    def __init__(self, lane_memory: int | None):
        self.lane_memory = lane_memory
        self.suspended: list[bool] = []

    def stop_inside(self, resident, now, freeze=True) -> bool:
        return False

    def suspend(self, resident, suspended, freeze=True) -> None:
        resident.suspended = suspended
        self.suspended.append(suspended)


class _Host:
    def freeze(self, resident, frozen) -> None:
        resident.frozen = frozen

    def kill(self, resident, why, grace=None) -> None:
        raise AssertionError("no job is ended here")

    def report_soon(self) -> None:
        return None


def test_a_workers_claimed_peak_moves_no_more_than_a_lane_holds():
    """The peak a worker reports is its word: a claim of exabytes neither has the job's
    every move refused (it would never go out, holding the device while others wait) nor
    puts an exabyte checkpoint in the node's books; what a lane holds is the most it can
    carry, its cap the least."""
    import os
    import time
    from types import SimpleNamespace

    from gq.exec.host.checkpoint import FakeCheckpoints
    from gq.exec.host.memory_moves import MemoryMoves, _figure
    from gq.exec.lane.residents import Resident

    lane, cap = 200 << 20, 50 << 20
    liar = Resident(
        job_id=1,
        run=1,
        user="mallory",
        priority=0,
        submit_time=0.0,
        declared_total=None,
        lane=0,
        process=SimpleNamespace(pid=os.getpid()),  # type: ignore[arg-type]
        channel=object(),  # type: ignore[arg-type]
        started_at=0.0,
        started_wall=0.0,
        worker=True,
        mem_cap=cap,
        mem_peak=2**62,
    )
    moves = MemoryMoves(FakeCheckpoints(), {1: liar}, _Host(), _Granter(lane))
    try:
        moves.ask(liar, True)
        assert liar.memory.held_why is None and liar.memory.wanted_at is not None
        moves.tick()  # idle: its move out begins
        deadline = time.monotonic() + 10
        while liar.memory.place is not Place.HOST and time.monotonic() < deadline:
            time.sleep(0.01)
            moves.tick()
        assert liar.memory.place is Place.HOST and liar.memory.moved == lane
        liar.mem_peak = 1 << 20  # an honest small peak: its cap is what may come back
        assert _figure(liar, lane) == cap
    finally:
        moves.close()
