"""Where a suspended job's device memory is, and the host's moves of it (see
:mod:`gq.exec.host.checkpoint` for the driver's part).

A suspend of a job whose memory may move does not freeze it at once: it is granted nothing
more, and at its next iteration boundary (its lane not held) its memory is moved to host
memory, then its processes are frozen. A resume thaws it and moves the memory back; only
then is it granted again. Where the memory cannot move (the driver refuses, the node's or
the job's host memory has no room for it, its iteration does not end within
:data:`BOUNDARY_WAIT`), it is frozen with its memory held, as before, and says why. The
driver's calls take seconds: they run in a thread of their own, never in the host's loop.

Where the memory is, and what may follow what: :mod:`gq.exec.host.memory_places`.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import psutil

from gq.exec.host.checkpoint import CheckpointError, Checkpoints, identify
from gq.exec.host.memory_places import Memory, Move, Place, step
from gq.exec.host.messages import StopWhy
from gq.exec.lane.residents import Resident
from gq.exec.lane.standings import HOLDS_LANE, Standing
from gq.units import format_size

log = logging.getLogger("gq.host")

BOUNDARY_WAIT = 10.0  # seconds a suspended job's iteration may take to end before a freeze
HOST_MARGIN = 1 << 30  # host memory left free beside a checkpoint (bytes)


class Processes(Protocol):
    def freeze(self, resident: Resident, frozen: bool) -> None: ...

    def kill(self, resident: Resident, why: StopWhy, grace: float | None = None) -> None: ...

    def report_soon(self) -> None: ...


class Granting(Protocol):
    lane_memory: int | None  # bytes of device memory a lane has, where known

    def stop_inside(self, resident: Resident, now: float, freeze: bool = True) -> bool: ...

    def suspend(self, resident: Resident, suspended: bool, freeze: bool = True) -> None: ...


class MemoryMoves:
    def __init__(
        self,
        checkpoints: Checkpoints,
        residents: dict[int, Resident],
        host: Processes,
        granter: Granting,
    ):
        self.checkpoints = checkpoints
        self.residents = residents
        self.host = host
        self.granter = granter
        self._driver = ThreadPoolExecutor(1, thread_name_prefix="checkpoint")

    def ask(self, resident: Resident, suspended: bool, host_room: int | None = None) -> None:
        """The daemon asks the job suspended (``gq suspend``, a preemption) or resumed,
        and says how much of the node's host memory its memory may take there; a move
        under way is settled with what was asked last once it ends."""
        resident.memory.asked = suspended
        resident.memory.host_room = host_room
        if resident.memory.pending is None:
            self._settle(resident)

    def _settle(self, resident: Resident) -> None:
        memory = resident.memory
        if memory.asked and not resident.suspended:
            memory.held_why = self._refusal(resident)
            memory.wanted_at = time.monotonic() if memory.held_why is None else None
            self.granter.suspend(resident, True, freeze=memory.held_why is not None)
            if memory.held_why is not None:
                log.info("job %d keeps its device memory: %s", resident.job_id, memory.held_why)
        elif memory.asked and memory.place is Place.DEVICE and memory.held_why is None:
            memory.wanted_at = memory.wanted_at or time.monotonic()  # back, asked out again
        elif not memory.asked and memory.place is Place.HOST:
            self.host.freeze(resident, False)  # the driver's restore runs in its process
            self._begin(resident, memory, Move.IN)
        elif not memory.asked and resident.suspended:
            memory.wanted_at, memory.held_why = None, None
            self.granter.suspend(resident, False)
        resident.dirty = True

    def tick(self) -> None:
        """Housekeeping: moves out at boundaries, and the driver's finished moves."""
        now = time.monotonic()
        for resident in list(self.residents.values()):
            memory = resident.memory
            if memory.pending is not None:
                if memory.pending.done():
                    self._finish(resident, memory, now)
            elif memory.wanted_at is not None:
                self._maybe_move_out(resident, memory, now)

    def _maybe_move_out(self, resident: Resident, memory: Memory, now: float) -> None:
        if resident.exit_status is not None or resident.kill_deadline is not None:
            memory.wanted_at = None  # ending: its memory goes with it
        elif resident.standing is Standing.STOPPED:  # stopped inside (--max-hold): frozen
            self._hold(resident, memory, "it was stopped inside an iteration")
        elif resident.standing in HOLDS_LANE:
            if now - (memory.wanted_at or now) >= BOUNDARY_WAIT:
                self.granter.stop_inside(resident, now)
                self._hold(resident, memory, f"its iteration went on past {BOUNDARY_WAIT:g} s")
        else:
            memory.wanted_at = None
            self._begin(resident, memory, Move.OUT)

    def _begin(self, resident: Resident, memory: Memory, move: Move) -> None:
        memory.place = step(memory.place, move)
        memory.began = time.monotonic()
        if move is Move.OUT:
            pids = [resident.process.pid]
            if resident.cgroup is not None:
                pids += [pid for pid in resident.cgroup.pids() if pid != resident.process.pid]
            memory.moved = _figure(resident, self.granter.lane_memory)
            memory.pending = self._driver.submit(self.checkpoints.move_out, identify(pids))
        else:
            memory.pending = self._driver.submit(self.checkpoints.move_in, memory.processes)
        resident.dirty = True
        log.info("job %d: device memory %s", resident.job_id, memory.place.value)

    def _finish(self, resident: Resident, memory: Memory, now: float) -> None:
        assert memory.pending is not None
        future, memory.pending = memory.pending, None
        error = future.exception()
        memory.took = now - memory.began
        memory.place = step(memory.place, Move.FAILED if error else Move.DONE)
        resident.dirty = True
        self.host.report_soon()
        if error is not None and not isinstance(error, CheckpointError):
            log.error("job %d: moving its memory: %r", resident.job_id, error)
        detail = str(error) if error is not None else None
        ending = resident.exit_status is not None or resident.kill_deadline is not None
        if memory.place is Place.HOST:
            memory.processes = future.result()
            if not ending:  # (a job being ended keeps its grace: its SIGTERM must be seen)
                self.host.freeze(resident, True)
            log.info("job %d: memory in host memory after %.2f s", resident.job_id, memory.took)
        elif error is None:  # back on the device: the resume completes
            log.info("job %d: memory back on the device after %.2f s", resident.job_id, memory.took)
            if not memory.asked:
                self.granter.suspend(resident, False)
        elif memory.place is Place.DEVICE and not getattr(error, "stuck", False):
            self._hold(resident, memory, detail or "the driver refused")  # undone: frozen, held
            return
        elif ending or resident.kill_why is not None:
            return  # ended meanwhile, for its own reason: that one stands
        else:  # its memory never came back, or the driver left it locked: it cannot go on
            resident.detail = f"its device memory could not be brought back: {detail}"
            self.host.kill(resident, StopWhy.RESTORE, grace=0.0)
            return
        self._settle(resident)

    def _hold(self, resident: Resident, memory: Memory, why: str) -> None:
        memory.wanted_at, memory.held_why = None, why
        if resident.suspended and not resident.frozen and resident.kill_deadline is None:
            self.host.freeze(resident, True)
        resident.dirty = True
        log.info("job %d: suspended with its device memory held: %s", resident.job_id, why)

    def _refusal(self, resident: Resident) -> str | None:
        """Why this job's memory cannot move now (None: it may)."""
        why = self.checkpoints.refusal()
        if why is not None:
            return why
        if resident.channel is None:
            return "it has no iteration boundaries (a plain process): frozen where it is"
        if not self.checkpoints.carries:
            return None
        needed = _figure(resident, self.granter.lane_memory)
        free = psutil.virtual_memory().available - HOST_MARGIN
        if needed > free:
            return (
                f"its {format_size(needed)} of device memory would not fit in the node's "
                f"free host memory ({format_size(max(0, free))})"
            )
        room = resident.memory.host_room
        if room is not None and needed > room:
            return (
                f"its {format_size(needed)} of device memory would not fit in the node's "
                f"host memory that other jobs have not reserved ({format_size(room)})"
            )
        # (Where its cgroup's limit is its device figure, on the cpu device, the move adds
        # nothing under it: the figure is held there already.)
        limited = resident.cgroup is not None and resident.cgroup_cap is None
        left = resident.cgroup.memory_room() if limited and resident.cgroup else None
        if left is not None and needed > left:
            return (
                f"its {format_size(needed)} of device memory would pass its --host-mem "
                f"({format_size(left)} left under it)"
            )
        return None

    def close(self) -> None:
        self._driver.shutdown(wait=False, cancel_futures=True)


def _figure(resident: Resident, lane_memory: int | None) -> int:
    """The device memory a move carries: the most the job may hold or was seen holding.
    What it was seen holding is its worker's word, so it is believed up to what a lane
    holds: past that, a job could claim more than the node's free memory to have every
    move of it refused (and never go out), or put a checkpoint in the books that takes the
    room other jobs' admissions and checkpoints need."""
    peak = max(0, resident.mem_peak or 0)
    if lane_memory is not None:
        peak = min(peak, lane_memory)
    return max(resident.mem_cap or 0, peak)
