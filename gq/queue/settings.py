"""Node-wide settings kept in the queue database (policy, lanes, the daemon's identity)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gq import defaults
from gq.queue.models import Setting

POLICY = "policy"
FILL = "fill"
QUANTUM = "quantum"
MAX_HOLD = "max_hold"  # seconds a hold others wait for may go on (gq.exec.lane.rule)
DAEMON = "daemon"  # pid, start time, devices: written by the running daemon for `gq info`
DRAINED = "drained"  # device name (or NODE for all of them) -> the operator's reason
NODE = "*"
NOTIFIED = "notified_event"  # the last job event whose hooks have been queued

DEFAULTS: dict[str, Any] = {
    POLICY: "fifo",
    FILL: "always",
    QUANTUM: "100ms",
    MAX_HOLD: defaults.MAX_HOLD,
    DRAINED: {},
}


def get(session: Session, key: str) -> Any:
    row = session.get(Setting, key)
    return DEFAULTS.get(key) if row is None else row.value


_ALL = select(Setting.__table__.c.key, Setting.__table__.c.value)


def get_all(session: Session) -> dict[str, Any]:
    """Every setting (defaults where none is stored)."""
    values = dict(DEFAULTS)
    values.update({key: value for key, value in session.execute(_ALL)})
    return values


def put(session: Session, key: str, value: Any) -> None:
    session.info[CHANGED] = True
    session.merge(Setting(key=key, value=value))


CHANGED = "gq_settings_changed"  # in a session's info: it wrote a setting
