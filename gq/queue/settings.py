"""Node-wide settings kept in the queue database (policy, lanes, the daemon's identity)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gq.queue.models import Setting

POLICY = "policy"
FILL = "fill"
QUANTUM = "quantum"
DAEMON = "daemon"  # pid, start time, devices: written by the running daemon for `gq info`
DRAINED = "drained"  # device name (or NODE for all of them) -> the operator's reason
NODE = "*"
NOTIFIED = "notified_event"  # the last job event whose hooks have been queued

DEFAULTS: dict[str, Any] = {POLICY: "fifo", FILL: "always", QUANTUM: "100ms", DRAINED: {}}


def get(session: Session, key: str) -> Any:
    row = session.get(Setting, key)
    return DEFAULTS.get(key) if row is None else row.value


_ALL = select(Setting.__table__.c.key, Setting.__table__.c.value)
# The daemon alone writes the queue, so what put() wrote since it last read them tells
# whether the settings every scheduling pass reads can have changed.
_read: dict[str, tuple[int, dict[str, Any]]] = {}  # database -> puts then, what was read
_puts = 0


def get_all(session: Session) -> dict[str, Any]:
    """Every setting (defaults where none is stored); read again only after a put()."""
    database = str(session.get_bind().url)
    kept = _read.get(database)
    if kept is None or kept[0] != _puts:
        values = dict(DEFAULTS)
        values.update({key: value for key, value in session.execute(_ALL)})
        kept = _read[database] = (_puts, values)
    return dict(kept[1])


def put(session: Session, key: str, value: Any) -> None:
    global _puts
    _puts += 1
    session.merge(Setting(key=key, value=value))
