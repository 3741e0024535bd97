"""Whose request the daemon's loop serves next: of the callers (uids) with requests ready,
the one that has used the least of the loop lately, its use decaying with a half-life; each
caller's own requests in the order they came, and callers alike in use in the order their
requests came. A caller who floods the daemon then waits behind everyone else, not in front
of them, and a caller alone is served at once, as before. Pure: the clock is the caller's.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Collection
from typing import Generic, TypeVar

from gq import defaults

Item = TypeVar("Item")
_FORGOTTEN = 1e-6  # seconds of use below which a caller with nothing ready is forgotten


class Turns(Generic[Item]):
    def __init__(self, half_life: float = defaults.TURN_HALF_LIFE):
        self.half_life = half_life
        self._ready: dict[int, deque[tuple[int, Item]]] = {}  # uid -> (arrival, item)
        self._used: dict[int, tuple[float, float]] = {}  # uid -> (seconds used, as of when)
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._ready.values())

    def __bool__(self) -> bool:
        return bool(self._ready)

    def add(self, uid: int, item: Item) -> None:
        self._ready.setdefault(uid, deque()).append((next(self._arrivals), item))

    def remove(self, uid: int, item: Item) -> None:
        """An item that will not be taken after all (its client went away); none if absent."""
        queue = self._ready.get(uid)
        if queue is None:
            return
        for entry in queue:
            if entry[1] is item:
                queue.remove(entry)
                break
        if not queue:
            del self._ready[uid]

    def prune(self, uid: int, keep: Callable[[Item], bool]) -> None:
        """Forget the caller's items that ``keep`` refuses (their clients went away, say)."""
        queue = self._ready.get(uid)
        if queue is None:
            return
        queue = deque(entry for entry in queue if keep(entry[1]))
        if queue:
            self._ready[uid] = queue
        else:
            del self._ready[uid]

    def take(self, now: float, skip: Collection[int] = ()) -> tuple[int, Item] | None:
        """The next item of a caller not in ``skip``, and its caller: None when none is
        ready."""
        ready = [uid for uid in self._ready if uid not in skip]
        if not ready:
            return None
        uid = min(ready, key=lambda u: (self.used(u, now), self._ready[u][0][0]))
        queue = self._ready[uid]
        _, item = queue.popleft()
        if not queue:
            del self._ready[uid]
        return uid, item

    def charge(self, uid: int, seconds: float, now: float) -> None:
        """The caller used ``seconds`` of the loop, ending ``now``."""
        self._used[uid] = (self.used(uid, now) + max(0.0, seconds), now)
        if len(self._used) > 2 * len(self._ready) + 64:
            for known in [u for u in self._used if u not in self._ready]:
                if self.used(known, now) < _FORGOTTEN:
                    del self._used[known]

    def used(self, uid: int, now: float) -> float:
        """The caller's use of the loop, decayed to ``now``."""
        seconds, when = self._used.get(uid, (0.0, now))
        return seconds * 0.5 ** (max(0.0, now - when) / self.half_life)
