"""Where a resident job stands with its lane (:class:`Standing`), what moves it
(:class:`Event`), and the one table of what may follow what (:data:`TRANSITIONS`,
:func:`step`): pure. The host moves a job between standings only through :func:`step`
(:mod:`gq.exec.lane.leasing`'s ``move``)."""

from __future__ import annotations

import enum


class Standing(enum.Enum):
    """Where a resident job stands with its lane. The host moves a job between these only
    through :func:`step` (the table below): one place says what may follow what."""

    IDLE = "idle"  # in its gap, or not begun: its next acquire asks with READY
    WAITING = "waiting"  # asked with READY: waits for a Go
    HOLDING = "holding"  # granted with a Go: inside an iteration until its Done
    LEASED = "leased"  # the lane is its own across boundaries; its page's lock says more
    RECALLED = "recalled"  # its lease asked back inside an iteration: the lane is its own
    # until its Done, or until its page's lock comes free
    # Stopped inside an iteration (suspended, or its lane taken past --max-hold while
    # another job waited), its processes frozen: goes on with it once granted again.
    STOPPED = "stopped"


class Event(enum.Enum):
    """What moves a job from one standing to another."""

    ASK = "a READY"  # the worker's
    RELEASE = "a Done"  # the worker's
    GRANT = "a grant"  # the host's: a Go sent, or a stopped job thawed
    LEASE = "a lease"  # the host's: a Go that leaves it the lane across boundaries
    TAKEN_BACK = "the lane taken back"  # the host's: it took the lock, the job in its gap
    RECALL = "a recall"  # the host's: it wants the lane back; the job is inside an iteration
    UNTAKEN = "a lease never taken up"  # the host's: its Go's iteration is a plain grant
    STOP = "a stop"  # the host's: the job frozen inside an iteration (suspend, --max-hold)
    LEAVE = "its end"  # the host's: the job runs no more iterations


class IllegalStep(Exception):
    """The host asked for a move the table does not have: a bug in the host, not a job's."""


_ALL = tuple(Standing)
# (standing, event) -> the standing that follows. The worker's two events are defined in
# every standing: a READY or Done that means nothing there changes nothing (a duplicate, a
# Done the host already counted when it took the lane back, a hostile worker's extra one).
TRANSITIONS: dict[tuple[Standing, Event], Standing] = {
    **{(s, Event.ASK): s for s in _ALL},
    **{(s, Event.RELEASE): s for s in _ALL},
    **{(s, Event.LEAVE): Standing.IDLE for s in _ALL},
    (Standing.IDLE, Event.ASK): Standing.WAITING,
    (Standing.HOLDING, Event.RELEASE): Standing.IDLE,
    (Standing.RECALLED, Event.RELEASE): Standing.IDLE,
    (Standing.LEASED, Event.RELEASE): Standing.IDLE,  # a Done: it gave the lease back
    (Standing.STOPPED, Event.RELEASE): Standing.IDLE,  # its Done crossed the stop
    (Standing.STOPPED, Event.ASK): Standing.WAITING,  # a READY that crossed it: between
    (Standing.WAITING, Event.GRANT): Standing.HOLDING,
    (Standing.STOPPED, Event.GRANT): Standing.HOLDING,
    (Standing.WAITING, Event.LEASE): Standing.LEASED,
    (Standing.RECALLED, Event.TAKEN_BACK): Standing.IDLE,
    (Standing.LEASED, Event.RECALL): Standing.RECALLED,
    (Standing.RECALLED, Event.UNTAKEN): Standing.HOLDING,
    (Standing.HOLDING, Event.STOP): Standing.STOPPED,
    (Standing.RECALLED, Event.STOP): Standing.STOPPED,
}
# Where the job holds its lane: no other job may be granted it.
HOLDS_LANE = frozenset({Standing.HOLDING, Standing.LEASED, Standing.RECALLED})
# Waiting for a grant (a stopped job's grant thaws it: it is inside its iteration).
WANTS_LANE = frozenset({Standing.WAITING, Standing.STOPPED})
# Inside an iteration: holding its lane, or stopped in it.
IN_ITERATION = HOLDS_LANE | {Standing.STOPPED}


def step(standing: Standing, event: Event) -> Standing:
    """The standing that follows ``event``; IllegalStep where the table has none."""
    try:
        return TRANSITIONS[standing, event]
    except KeyError:
        raise IllegalStep(f"{event.value} while {standing.value}") from None
