"""Rotation (``--rotate PERIOD``), Gandiva's time-slicing over residency: when more jobs
want to be resident than fit, under ``fair`` and ``rr``, whom to move out of a lane and who
comes in. Pure: the daemon's part is :mod:`gq.daemon.scheduling.rotating`.

The rules:

- Only a resident whose current turn has lasted the period may go out, and only one whose
  memory can move (a batch job of gq's worker); the oldest turns go first (under ``fair``
  the user who has used the most lane time first, then the oldest turn), just enough of
  them to free what the job coming in lacks. Under ``fair`` a resident of a user who has
  used less lane time than the incoming job's user stays for ``LIGHT_TURNS`` periods (a
  job of a lighter user would otherwise be moved out for a heavier one's the moment its
  turn ends; it is moved out then all the same, so an idle one cannot keep the room).
- The jobs that wait (pending jobs that wait only for device room, and jobs rotated out)
  come in in one queue, the longest waiting first (under ``fair`` the user who has used the
  least first): a pending job waits from its submission, a rotated-out job from when it
  went out, so it comes back before a job submitted after that, and a job that never ran
  before one that just had its turn.
- A lane serves the first job of the queue that may use it: a later, smaller job does not
  take the room an earlier one waits for, so no job waits for ever; one move at a time on a
  device.

Every job therefore gets a turn of at least the period in each cycle of the queue, and
turns come round in the order jobs began waiting (the tests simulate it pass by pass).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

LIGHT_TURNS = 4  # periods a lighter user's resident stays, under fair, before a heavier's job


@dataclass(frozen=True)
class Resident:
    job_id: int
    user: str
    turn_began: float  # when its current turn on the lane began (wall clock)
    frees: int  # bytes of the lane its move out frees (its figure and its context)
    movable: bool  # its memory may go now (gq's worker's batch job, not being ended, ...)


@dataclass(frozen=True)
class Lane:
    device: str
    index: int
    residents: tuple[Resident, ...] = ()
    busy: bool = False  # a move is on its way on its device: nothing more goes there now

    @property
    def key(self) -> tuple[str, int]:
        return self.device, self.index


@dataclass(frozen=True)
class Waiter:
    job_id: int
    user: str
    since: float  # when it began waiting for residency: submitted, or rotated out
    # Each lane it may come in on, and the bytes that must go there first (<= 0: it fits).
    short: Mapping[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Rotation:
    incoming: int
    lane: tuple[str, int]
    out: tuple[int, ...]  # the residents to move out for it, oldest turn first (none: it fits)


def queue(waiting: Sequence[Waiter], usage: Mapping[str, float] | None = None) -> list[Waiter]:
    """The order jobs come in: the longest waiting first; under ``fair`` (``usage``, each
    user's lane time) the user who has used least first."""
    used = usage or {}
    return sorted(waiting, key=lambda w: (used.get(w.user, 0.0), w.since, w.job_id))


def room(
    short: int,
    residents: Sequence[Resident],
    period: float,
    now: float,
    usage: Mapping[str, float] | None = None,
    user: str = "",
) -> tuple[int, ...] | None:
    """The residents to move out so that ``short`` more bytes are free for a job of
    ``user``'s: those whose turn has lasted ``period``, oldest turn first (under ``fair``,
    ``usage`` given: the user who has used most first, and a lighter user's than ``user``
    only after LIGHT_TURNS periods), no more than enough; None where they would not free
    enough."""

    def done(resident: Resident) -> bool:
        turn = now - resident.turn_began
        if not (resident.movable and resident.frees > 0 and turn >= period):
            return False
        heavier = usage is None or usage.get(resident.user, 0.0) >= usage.get(user, 0.0)
        return heavier or turn >= LIGHT_TURNS * period

    used = usage or {}
    chosen: list[int] = []
    freed = 0
    for resident in sorted(
        filter(done, residents), key=lambda r: (-used.get(r.user, 0.0), r.turn_began, r.job_id)
    ):
        if freed >= short:
            break
        chosen.append(resident.job_id)
        freed += resident.frees
    return tuple(chosen) if freed >= short else None


def plan(
    lanes: Sequence[Lane],
    waiting: Sequence[Waiter],
    period: float,
    now: float,
    usage: Mapping[str, float] | None = None,
) -> list[Rotation]:
    """One pass: for the queue's jobs in order, the lane each comes in on now and whom it
    replaces there. A job that cannot come in yet keeps every lane it may use from the jobs
    behind it (they would take the room it waits for); one served takes its lane, and its
    device's other lanes wait for the moves to be done."""
    by_key = {lane.key: lane for lane in lanes}
    claimed: set[tuple[str, int]] = set()
    busy = {lane.device for lane in lanes if lane.busy}
    rotations = []
    for waiter in queue(waiting, usage):
        open_lanes = [by_key[key] for key in waiter.short if key in by_key and key not in claimed]
        served = None
        for lane in open_lanes:
            short = waiter.short[lane.key]
            if short <= 0:
                served = Rotation(waiter.job_id, lane.key, ())
                break
            if lane.device in busy:
                continue
            out = room(short, lane.residents, period, now, usage, waiter.user)
            if out is not None:
                served = Rotation(waiter.job_id, lane.key, out)
                break
        if served is None:
            claimed.update(lane.key for lane in open_lanes)
            continue
        claimed.add(served.lane)
        rotations.append(served)
        if served.out:
            busy.add(served.lane[0])
    return rotations
