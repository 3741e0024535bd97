"""The simulation's events: their kinds, and the queue they wait in (a heap by time) that the
event loop (:mod:`gq.sim.simulator`) pops and its placement and stretches push onto."""

from __future__ import annotations

import heapq
from typing import Any

# Event kinds, in the order a moment handles them: a look (--lanes auto) sees the moment's
# stretches settled.
ARRIVE, READY, STRETCH_END, LOOK = 0, 1, 2, 3


class EventQueue:
    """Events as (time, kind, sequence, payload); ``sequence`` orders those of one moment and
    kind as they were pushed, and dates each stretch (its version)."""

    events: list[tuple[float, int, int, Any]]
    sequence: int

    def _push(self, time: float, kind: int, payload) -> None:
        heapq.heappush(self.events, (time, kind, self.sequence, payload))
        self.sequence += 1
