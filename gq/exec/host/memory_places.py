"""Where a job's device memory is (:class:`Place`), what moves it (:class:`Move`), and the
one table of what may follow what (:data:`TRANSITIONS`): pure. The host's moves are
:mod:`gq.exec.host.memory_moves`."""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass, field

from gq.exec.host.checkpoint import Process
from gq.exec.host.messages import DeviceMemory


class Place(enum.Enum):
    """Where a job's device memory is."""

    DEVICE = "device"
    OUTGOING = "moving to host memory"
    HOST = "host"
    INCOMING = "moving back to the device"


class Move(enum.Enum):
    OUT = "a move out begun"
    IN = "a move in begun"
    DONE = "the driver done"
    FAILED = "the driver's refusal"


TRANSITIONS: dict[tuple[Place, Move], Place] = {
    (Place.DEVICE, Move.OUT): Place.OUTGOING,
    (Place.OUTGOING, Move.DONE): Place.HOST,
    (Place.OUTGOING, Move.FAILED): Place.DEVICE,  # undone by the driver: frozen, held
    (Place.HOST, Move.IN): Place.INCOMING,
    (Place.INCOMING, Move.DONE): Place.DEVICE,
    (Place.INCOMING, Move.FAILED): Place.HOST,  # it never came back: the job is ended
}


def step(place: Place, move: Move) -> Place:
    """The place that follows ``move``; KeyError where the table has none (a host bug)."""
    return TRANSITIONS[place, move]


@dataclass
class Memory:
    """One resident's device memory, as its host moved it."""

    place: Place = Place.DEVICE
    asked: bool = False  # suspended, as the daemon last asked (a move settles it after)
    wanted_at: float | None = None  # monotonic: suspended, to move out at its boundary
    held_why: str | None = None  # why it stays on the device while suspended
    host_room: int | None = None  # bytes of the node's host memory it may take (the daemon's)
    processes: list[Process] = field(default_factory=list)  # those the driver moved
    moved: int = 0  # bytes moved out (the job's figure)
    began: float = 0.0  # monotonic: the last move's start
    took: float | None = None  # seconds the last move took
    pending: Future | None = None

    def report(self) -> DeviceMemory | None:
        """What the daemon is told (None: it never moved, nor was held while suspended)."""
        if self.place is Place.DEVICE and self.held_why is None and self.took is None:
            return None
        return DeviceMemory(self.place.value, self.held_why, self.moved, self.took)
