"""Who may hold a device's resident slots (``--max-resident``), pure: admission and the
scheduling pass call it.

While another user's job waits, one user holds at most their fair part of a device's slots:
the slots split evenly between the users who hold or want them there (:func:`within_part`).
Slots a user fills while nobody else waits stay theirs; but a resident of a user over their
part whose lane has been idle (under ``ACTIVE_SHARE`` of its time) for ``--idle-resident``
gives its slot back to a job that waits for one (:func:`slot_to_give_back`): it is
requeued, and says why. A user within their part never loses a job so, nor does an
interactive one (its ``--idle-timeout`` is its own bound), one being ended, nor one that
would lose much (see ``Running.may_give_back``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# What names the devices a job may use: its GPU count, and the devices it may run on.
Kind = tuple[int, frozenset[str] | None]
SLOTS = "Resources (its user's part of a device's resident slots, while others wait)"


def fair_part(slots: int, users: int) -> int:
    """The slots each of ``users`` users may hold of ``slots`` (at least one each)."""
    return max(1, slots // max(1, users))


def within_part(held: dict[str, int], slots: int, user: str, waiting: Iterable[str]) -> bool:
    """Whether ``user`` may take one more of a device's ``slots`` (``held``: the slots each
    user holds there) while the users ``waiting`` have jobs that wait for one there: below
    their part, or where the slots left free still give each of the others theirs (so no
    slot stays empty that nobody else would take)."""
    others = {u for u in waiting if u != user}
    if not others:
        return True
    part = fair_part(slots, len(set(held) | others | {user}))
    if held.get(user, 0) < part:
        return True
    free = slots - sum(held.values())
    return free > sum(max(0, part - held.get(u, 0)) for u in others)


class Wanting:
    """Whose jobs still wait for a slot on each device, in one admission pass (a job
    counts on the devices it may use, and only while it waits for a slot: not one the node
    has no host memory or CPUs for). Counted by the kind of job (its user, and what names
    the devices it may use: ``where`` gives them), not device by device: a pass over a long
    queue of alike jobs counts each once and looks up a few kinds."""

    def __init__(self, kinds: Iterable[tuple[str, Kind]], where: Callable[[Kind], set[str]]):
        self.counts: Counter[tuple[str, Kind]] = Counter(kinds)
        self._where = where
        self._places: dict[Kind, set[str]] = {}

    def where(self, kind: Kind) -> set[str]:
        places = self._places.get(kind)
        if places is None:
            places = self._places[kind] = self._where(kind)
        return places

    def placed(self, user: str, kind: Kind) -> None:
        if self.counts[user, kind] > 0:
            self.counts[user, kind] -= 1

    def others(self, device: str, user: str) -> set[str]:
        return {
            u
            for (u, kind), n in self.counts.items()
            if n > 0 and u != user and device in self.where(kind)
        }


@dataclass(frozen=True)
class Resident:
    """A running job as this rule sees it."""

    job_id: int
    user: str
    device: str
    idle_for: float  # seconds since it last used its lane (or its start, before it did)
    may_yield: bool  # a batch job of gq's worker, not being ended already
    yielding: bool = False  # giving its slot back already: the slot is on its way


@dataclass(frozen=True)
class Waiting:
    """A pending job that found no slot: its user, and the devices it may use."""

    user: str
    devices: frozenset[str]


def slot_to_give_back(
    waiting: Iterable[Waiting], residents: Sequence[Resident], slots: int, idle_after: float
) -> Resident | None:
    """The resident that gives its slot back (one a pass), for the first job in ``waiting``
    that one could go to: on a full device it may use, of a user over their part there,
    idle for ``idle_after`` or more (the longest idle first); None if there is none."""
    if math.isinf(idle_after):
        return None
    held: dict[str, dict[str, int]] = {}
    for resident in residents:
        on = held.setdefault(resident.device, {})
        on[resident.user] = on.get(resident.user, 0) + 1
    for job in waiting:
        for device in sorted(job.devices):
            on = held.get(device, {})
            if sum(on.values()) < slots or any(r.yielding for r in residents if r.device == device):
                continue  # a slot is free there (or coming): it waits for something else
            part = fair_part(slots, len(set(on) | {job.user}))
            idle = [
                r
                for r in residents
                if r.device == device
                and r.may_yield
                and r.user != job.user
                and on[r.user] > part
                and r.idle_for >= idle_after
            ]
            if idle:
                return max(idle, key=lambda r: (r.idle_for, r.job_id))
    return None
